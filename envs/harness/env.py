"""The harness env kind: every rollout runs an agent program you already have, unmodified.

    # agent.yaml — `gymflow rollout agent.yaml`
    harness:
      command: [python, my_agent.py, --task, "{prompt}"]   # or a string, run by `sh -c`
      env: {MY_AGENT_MODE: eval}       # more variables for the program
      timeout_s: 600                   # wall time of the program, over all its starts
    reward: check.py:reward            # reads the workspace the program worked in
    dataset: tasks.jsonl

The program runs in the rollout's sandbox (the process runtime: a local process in the rollout's
workspace, gymflow.envs.harness.program) with the usual variables pointing its model clients at the
node's model gateway (gymflow.workers.servers.gateway): ``OPENAI_BASE_URL``/``OPENAI_API_BASE``,
``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``, plus ``GYMFLOW_PROMPT`` (the
task's prompt) and ``GYMFLOW_WORKSPACE``. Each model call it makes is a model turn of the rollout
(gymflow.workflows.harness); its exit ends the rollout, and the env's reward scores it.

Placeholders, filled in the command's arguments and the `env` values: ``{prompt}``,
``{workspace}``, ``{rollout_id}``, ``{openai_base_url}``, ``{anthropic_base_url}``, ``{api_key}``.
In a string command they are shell-quoted. A task may replace the command or add variables with
``init_args: {command: ..., env: {...}}``.

Everything else is an env file's (gymflow.envs.envfile): `reward`, `dataset`, `workspace` seed
files and setup, `system_prompt` (unused by the program; kept for the trajectory). MCP servers may be
listed too; the program does not see them, a reward may call them.

The env is `replayable` in the workflow's sense: after its node is lost, a fresh workspace and a
restarted program, answered from the rollout's recorded model turns while it asks the same,
rebuild the state (gymflow.workflows.harness).
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import Field, ValidationError

from gymflow.envs.contract import Wire
from gymflow.envs.errors import RolloutNotFound
from gymflow.envs.harness.program import Program
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.mcp.ledger import LEDGER_DIR, Ledger
from gymflow.envs.runtime.base import RolloutSpec
from gymflow.envs.runtime.process import ProcessRuntime

PLACEHOLDERS = ("prompt", "workspace", "rollout_id", "openai_base_url", "anthropic_base_url", "api_key")


class Harness(Wire):
    """The agent program of a harness env (the env file's `harness:` key)."""

    command: list[str] | str = Field(min_length=1)
    """Its command line: arguments (placeholders filled in each), or a string run by `sh -c`."""
    env: dict[str, str] = Field(default_factory=dict)
    """More environment variables (placeholders filled in); the gateway's variables win."""
    timeout_s: float = Field(default=1800.0, gt=0, le=7 * 24 * 3600)
    """Wall time of the program over all its starts; past it the program is stopped (``time_budget``)
    and the reward still applies."""
    max_output_bytes: int = Field(default=16 * 1024, ge=256)
    """Output of the program kept for the trajectory (its first and last halves)."""


class HarnessInfo(Wire):
    """What the workflow needs of a harness rollout's program (no command: its variables may hold
    values for the program's own services, which never enter history)."""

    timeout_s: float
    command: list[str]
    """The command as configured (placeholders unfilled), for the trajectory."""


@runtime_checkable
class ProgramEnv(Protocol):
    """An env whose rollouts are played by an agent program (HarnessEnv; a Harbor env may be one)."""

    def harness_info(self, rollout_id: str) -> HarnessInfo:
        """The rollout's program, as the workflow sees it."""
        ...

    async def start_program(
        self, rollout_id: str, *, prompt: str, gateway: Mapping[str, str], values: Mapping[str, str]
    ) -> Program:
        """Start the rollout's program with the gateway's variables and placeholder values."""
        ...

    async def stop_program(self, rollout_id: str) -> None:
        """Kill the rollout's program (idempotent)."""
        ...


def fill(text: str, values: Mapping[str, str], *, quote: bool = False) -> str:
    for name, value in values.items():
        text = text.replace(f"{{{name}}}", shlex.quote(value) if quote else value)
    return text


def gateway_variables(*, openai_base_url: str, anthropic_base_url: str, api_key: str) -> dict[str, str]:
    """The variables that point a program's model clients at its rollout's gateway URL."""
    return {
        "OPENAI_BASE_URL": openai_base_url,
        "OPENAI_API_BASE": openai_base_url,
        "OPENAI_API_KEY": api_key,
        "ANTHROPIC_BASE_URL": anthropic_base_url,
        "ANTHROPIC_API_KEY": api_key,
    }


class ProgramHost:
    """Runs each rollout's agent program: the half of a harness env that is not about its environment.

    A subclass of `BaseEnv` mixes it in and says where the program runs (`program_home`) and what
    else it must be told (`program_variables`); `HarnessEnv` runs it in the rollout's workspace, a
    Harbor harness env (gymflow.envs.builtin.harbor.harness) on the node with the task's container at hand.
    """

    harness: ClassVar[Harness | None] = None

    def _host(self, workspace_root: Path) -> None:
        self._runtime = ProcessRuntime()
        self._ledger = Ledger(workspace_root / LEDGER_DIR)
        self._harnesses: dict[str, Harness] = {}
        self._programs: dict[str, Program] = {}

    def take_harness(self, rollout_id: str, rollout_args: dict[str, Any]) -> None:
        """Fix the rollout's harness: the class's, with `command` / `env` popped from the task's init_args."""
        if self.harness is None:
            raise TypeError(f"{type(self).__name__} sets no `harness`")
        override: dict[str, Any] = {key: rollout_args.pop(key) for key in ("command", "env") if key in rollout_args}
        try:
            harness = Harness.model_validate({**self.harness.model_dump(), **override}) if override else self.harness
        except ValidationError as exc:
            raise ValueError(f"init_args: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
        self._harnesses[rollout_id] = harness

    def program_home(self, rollout_id: str) -> Path:
        """The host directory the rollout's program runs in (raises RolloutNotFound when not held)."""
        raise NotImplementedError

    async def program_variables(self, rollout_id: str, home: Path) -> dict[str, str]:
        """Variables the program gets besides the harness's and the gateway's."""
        del rollout_id, home
        return {}

    def harness_timeout(self, rollout_id: str) -> float | None:
        """The program's wall time when the task sets one (a Harbor task's agent timeout); None: the harness's."""
        del rollout_id
        return None

    def harness_info(self, rollout_id: str) -> HarnessInfo:
        harness = self._harness(rollout_id)
        command = harness.command if isinstance(harness.command, list) else ["sh", "-c", harness.command]
        return HarnessInfo(timeout_s=self.harness_timeout(rollout_id) or harness.timeout_s, command=command)

    def _harness(self, rollout_id: str) -> Harness:
        self.program_home(rollout_id)  # RolloutNotFound for a rollout this instance does not hold
        return self._harnesses[rollout_id]

    async def start_program(
        self, rollout_id: str, *, prompt: str, gateway: Mapping[str, str], values: Mapping[str, str]
    ) -> Program:
        """Start the rollout's program (stopping one still running for it first)."""
        harness = self._harness(rollout_id)
        await self.stop_program(rollout_id)
        home = self.program_home(rollout_id)
        filled = {"prompt": prompt, "workspace": str(home), "rollout_id": rollout_id, **values}
        if isinstance(harness.command, list):
            argv = [fill(arg, filled) for arg in harness.command]
        else:
            argv = ["sh", "-c", fill(harness.command, filled, quote=True)]
        variables = {key: fill(value, filled) for key, value in harness.env.items()}
        variables |= await self.program_variables(rollout_id, home)
        variables |= {"GYMFLOW_PROMPT": prompt, "GYMFLOW_WORKSPACE": str(home), **gateway}
        sandbox = await self._runtime.start(
            RolloutSpec(rollout_id=rollout_id, node_id=os.uname().nodename, workspace=str(home))
        )
        entry = f"{home.name}.program"
        program = Program(
            sandbox.stdio_command(argv, env=variables),
            max_output_bytes=harness.max_output_bytes,
            on_start=lambda pid: self._ledger.record(entry, workspace=home, pids=[pid]),
        )
        self._programs[rollout_id] = program
        await program.start()
        return program

    async def stop_program(self, rollout_id: str) -> None:
        """Kill the rollout's program and everything it started (idempotent)."""
        program = self._programs.pop(rollout_id, None)
        if program is not None:
            await program.stop()
            with contextlib.suppress(RolloutNotFound):
                self._ledger.forget(f"{self.program_home(rollout_id).name}.program")

    async def stop_programs(self) -> None:
        """Kill every program (worker exit)."""
        for rollout_id in list(self._programs):
            await self.stop_program(rollout_id)
        self._ledger.close()


class HarnessEnv(ProgramHost, McpEnv):
    """An env played by an agent program in its rollout's workspace; subclass with `harness` set, or
    write an env file with `harness:`."""

    replayable = True
    servers_optional = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._host(self.workspace_root)

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        """A workspace as McpEnv makes one; `command` and `env` in the task's init_args override the harness's."""
        self.take_harness(rollout_id, rollout_args)
        try:
            await super().init_rollout(rollout_id, **rollout_args)
        except BaseException:
            self._harnesses.pop(rollout_id, None)
            raise

    def program_home(self, rollout_id: str) -> Path:
        return self.workspace(rollout_id)

    async def release_rollout(self, rollout_id: str) -> None:
        """Kill the program (if it still runs), then free the workspace."""
        await self.stop_program(rollout_id)
        self._harnesses.pop(rollout_id, None)
        await super().release_rollout(rollout_id)

    async def shutdown(self) -> None:
        await self.stop_programs()
        await super().shutdown()
