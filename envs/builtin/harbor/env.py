"""HarborEnv: Harbor-format tasks as an RL environment, one container per rollout.

    gymflow eval harbor --dataset path/to/tasks --policy oracle

A dataset is a directory of task directories (gymflow.envs.builtin.harbor.task); one task is one
row: its prompt is instruction.md, and its `init_args` name the task directory. A rollout:

1. `init_rollout` builds the task's image once per node (its `build_timeout_sec`; the base image is
   bootstrapped from Debian's packages when missing) and starts its container with the task's
   limits, workdir `/app`, the rollout's workspace at `/logs`, no network unless `allow_internet`.
2. The model's tools are the terminal toolset (gymflow.envs.runtime.terminal: `bash`, `read_file`,
   `write_file`, `list_dir`) acting in that container. The toolset is served in the worker's
   process, bound to the rollout's sandbox, rather than as one stdio process per rollout: every
   command is a `podman exec` either way, and the worker saves an interpreter per rollout.
3. After the agent's final answer, or its `[agent] timeout_sec` (the task's `TaskTimeouts`, which
   the rollout workflow turns into its time budget and activity timeouts), `compute_reward` runs
   the verifier in the same container (gymflow.envs.builtin.harbor.verifier): the reward file is
   the reward and reward.json's numbers are its components. A verifier that times out, crashes or
   writes no valid reward raises `VerifierError`: the rollout ends `reward_error`, never 0.

Durability: a container holds the rollout's state, so the env is `replayable`. When the container
dies (its node lost, the engine killed it) a tool call or the reward raises `InfraError`; the
workflow re-initialises the rollout in a fresh container and replays the recorded tool calls, and a
replay whose output differs ends the rollout infra-failed. A dead container never scores: the
verifier refuses to run in a container that is not running.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as McpToolError

from gymflow.envs.builtin.harbor.task import HarborTask, load_dataset, load_task
from gymflow.envs.builtin.harbor.verifier import run_verifier, start_task
from gymflow.envs.contract import BaseEnv, Message, Reward, Task, TaskTimeouts, ToolResult, ToolSpec, Unavailable
from gymflow.envs.errors import InfraError, RolloutNotFound, SandboxError
from gymflow.envs.mcp.content import render_result
from gymflow.envs.runtime.base import ExecResult, Sandbox
from gymflow.envs.runtime.container import START_TIMEOUT_S, ContainerSandbox
from gymflow.envs.runtime.images import BOOTSTRAP_TIMEOUT_S
from gymflow.envs.runtime.node import NodeRuntimes, container_facts, unavailable_container
from gymflow.envs.runtime.terminal import build_server

SYSTEM_PROMPT = (
    "You are working on a task in a Linux machine (a container). Use the tools to run shell commands and "
    "read or write files; the work happens in /app unless the task says otherwise. When the task is done, "
    "reply with a short summary and no tool call: the task's tests then check the machine."
)
REWARD_MARGIN_S = 60.0
"""Time `compute_reward` gets beyond the verifier's own timeout (copying tests in, reading the reward)."""


def task_timeouts(task: HarborTask) -> TaskTimeouts:
    """The rollout's time budgets from task.toml: setup covers a build (and a base-image bootstrap) and
    the container's start; the agent gets its `timeout_sec`; the reward the verifier's plus a margin."""
    config = task.config
    return TaskTimeouts(
        setup_s=config.environment.build_timeout_sec + BOOTSTRAP_TIMEOUT_S + START_TIMEOUT_S,
        agent_s=config.agent.timeout_sec,
        reward_s=config.verifier.timeout_sec + REWARD_MARGIN_S,
    )


def harbor_row(task: HarborTask) -> Task:
    """One task directory as a dataset row."""
    return Task(
        id=task.name,
        prompt=task.instruction,
        init_args={"task_dir": str(task.path)},
        metadata={**task.config.metadata, "harbor_task": task.name},
        timeouts=task_timeouts(task),
    )


_KNOWN: dict[str, list[HarborTask]] = {}
"""Tasks loaded in this process, by instruction: the oracle policy finds a conversation's task here."""


def remember(tasks: Iterable[HarborTask]) -> None:
    for task in tasks:
        same = _KNOWN.setdefault(task.instruction, [])
        if all(known.path != task.path for known in same):
            same.append(task)


def known_task(instruction: str) -> list[HarborTask]:
    """The tasks loaded in this process whose instruction is `instruction`."""
    return list(_KNOWN.get(instruction.strip(), []))


class _Watched:
    """The sandbox as the terminal tools see it, remembering a failure of the sandbox itself: the
    MCP server turns any exception of a tool into an error result, and a dead container must not
    reach the model as one."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.failure: SandboxError | None = None

    async def exec(self, argv: Any, **kwargs: Any) -> ExecResult:
        try:
            return await self.sandbox.exec(argv, **kwargs)
        except SandboxError as exc:
            self.failure = exc
            raise


@dataclass
class _Rollout:
    task: HarborTask
    sandbox: Sandbox
    watched: _Watched
    server: MCPServer


class HarborEnv(BaseEnv):
    """Harbor tasks in containers: the terminal toolset, the task's verifier as the reward."""

    name = "harbor"
    system_prompt = SYSTEM_PROMPT
    replayable = True
    policies: ClassVar[Mapping[str, Any]] = {
        "oracle": "gymflow.envs.builtin.harbor.policy:OraclePolicy",
        "reference": "gymflow.envs.builtin.harbor.policy:OraclePolicy",
    }

    def __init__(self, *, workspace_root: Path | None = None, runtimes: NodeRuntimes | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.workspace_root = workspace_root or Path(tempfile.gettempdir()) / "gymflow-workspaces" / "harbor"
        self._runtimes = runtimes
        self._own_runtimes: NodeRuntimes | None = None
        self._rollouts: dict[str, _Rollout] = {}
        self._tasks: dict[str, HarborTask] = {}
        self._tools: list[ToolSpec] | None = None

    # -- availability and data ---------------------------------------------------------------
    @classmethod
    def unavailable(cls, **env_kwargs: Any) -> Unavailable | None:
        del env_kwargs
        return unavailable_container()

    @classmethod
    def preflight(cls) -> str | None:
        """Says so when this node's engine can only watch a container's disk, not cap it."""
        facts = container_facts()
        return None if not facts or "disk cap: watched" not in facts[-1] else f"harbor tasks here: {facts[-1]}"

    @classmethod
    def node_facts(cls) -> list[str]:
        return container_facts()

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> list[Task]:
        """The task directories under `name` (a directory of tasks, or one task), first `n` if given."""
        tasks = load_dataset(Path(name).expanduser())
        remember(tasks)
        n = kwargs.get("n")
        return [harbor_row(task) for task in (tasks[:n] if isinstance(n, int) and n > 0 else tasks)]

    @classmethod
    def prepare_dataset(cls, dataset: str, n: int | None) -> tuple[str, int]:
        """For `gymflow eval`: the dataset as an absolute path (workers load the same one) and its size
        (every task unless `n` says fewer). Raises TaskError naming a bad task file."""
        path = Path(dataset).expanduser().resolve()
        count = len(cls.load_dataset(str(path)))
        return str(path), min(n, count) if n else count

    # -- lifecycle ---------------------------------------------------------------------------
    def node_runtimes(self) -> NodeRuntimes:
        if self._runtimes is not None:
            return self._runtimes
        if self._own_runtimes is None:
            self._own_runtimes = NodeRuntimes.local()
        return self._own_runtimes

    def _task(self, task_dir: str) -> HarborTask:
        task = self._tasks.get(task_dir)
        if task is None:
            task = self._tasks[task_dir] = load_task(Path(task_dir))
        return task

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        task_dir = rollout_args.pop("task_dir", None)
        if rollout_args or not isinstance(task_dir, str):
            raise TypeError(f"harbor init_rollout takes task_dir (a task directory), got {sorted(rollout_args)}")
        if rollout_id in self._rollouts:  # a retried init: start over in a fresh container
            await self.release_rollout(rollout_id)
        task = self._task(task_dir)
        runtime = await self.node_runtimes().containers()
        workspace = self.workspace_root / f"{task.name}-{uuid.uuid4().hex[:12]}"
        sandbox = await start_task(runtime, task, rollout_id=rollout_id, workspace=workspace)
        watched = _Watched(sandbox)
        server = build_server(watched, memory_mb=task.config.environment.memory_mb)
        self._rollouts[rollout_id] = _Rollout(task, sandbox, watched, server)

    async def release_rollout(self, rollout_id: str) -> None:
        state = self._rollouts.pop(rollout_id, None)
        if state is None:
            return
        await state.sandbox.release()
        if state.sandbox.workspace.is_symlink():
            state.sandbox.workspace.unlink(missing_ok=True)

    async def shutdown(self) -> None:
        await asyncio.gather(*(self.release_rollout(r) for r in list(self._rollouts)), return_exceptions=True)
        if self._own_runtimes is not None:
            await self._own_runtimes.close()

    def live_rollouts(self) -> list[str]:
        return list(self._rollouts)

    def sandbox(self, rollout_id: str) -> Sandbox:
        """The rollout's container (tests, chaos)."""
        return self._get(rollout_id).sandbox

    # -- tools -------------------------------------------------------------------------------
    async def list_tools(self) -> list[ToolSpec]:
        if self._tools is None:
            listed = await build_server(_Watched(_NoSandbox())).list_tools()
            self._tools = [
                ToolSpec(name=t.name, description=t.description or "", input_schema=dict(t.input_schema))
                for t in listed
            ]
        return list(self._tools)

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
        state = self._get(rollout_id)
        state.watched.failure = None
        try:
            result = await state.server.call_tool(tool_name, tool_args)
        except McpToolError as exc:
            if state.watched.failure is not None:
                raise InfraError(f"the rollout's container failed: {state.watched.failure}") from exc
            return ToolResult(text=f"error: {exc}", is_error=True)
        except Exception as exc:  # UnexpectedToolError: the sandbox itself failed under the tool
            failure = state.watched.failure or exc.__cause__ or exc
            raise InfraError(f"the rollout's container failed: {failure}") from exc
        if state.watched.failure is not None:
            raise InfraError(f"the rollout's container failed: {state.watched.failure}")
        return render_result(result, workspace=None, max_inline_bytes=0)  # type: ignore[arg-type]

    # -- reward ------------------------------------------------------------------------------
    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        """Run the task's verifier in the rollout's container; its reward file is the reward."""
        del completion, ground_truth, kwargs
        state = self._get(rollout_id)
        if isinstance(state.sandbox, ContainerSandbox) and not await state.sandbox.running():
            raise SandboxError(f"container {state.sandbox.name} is not running: the rollout cannot be scored")
        verdict = await run_verifier(state.sandbox, state.task)
        info: dict[str, Any] = {"verifier_exit_code": verdict.exit_code, "verifier_output": verdict.output[-1000:]}
        if verdict.details:
            info["details"] = verdict.details
        return Reward(total=verdict.reward, components=verdict.components, info=info)

    def _get(self, rollout_id: str) -> _Rollout:
        state = self._rollouts.get(rollout_id)
        if state is None:
            raise RolloutNotFound(f"rollout {rollout_id!r} is not held by this worker")
        return state


class _NoSandbox(Sandbox):
    """Stands in for a sandbox where only the tools' listing is needed."""

    async def exec(self, argv: Any, **kwargs: Any) -> ExecResult:
        raise SandboxError("no sandbox")

    def stdio_command(self, argv: Any, **kwargs: Any) -> Any:
        raise SandboxError("no sandbox")

    async def copy_in(self, src: Path, dst: str) -> None:
        raise SandboxError("no sandbox")

    async def copy_out(self, src: str, dst: Path) -> None:
        raise SandboxError("no sandbox")

    async def release(self) -> None:
        return None
