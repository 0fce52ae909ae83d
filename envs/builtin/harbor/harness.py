"""Harbor tasks played by an agent program: the task's container, the program on the node, the verifier's reward.

    # mini-swe-agent on Harbor tasks (tests/envs/harness/mini_swe_agent_harbor.yaml)
    harness:
      command: [mini, --environment-class=docker, --model=openai/gymflow, --task={prompt}, ...]
    base: harbor                 # each rollout: the task's container, scored by the task's verifier
    dataset: path/to/tasks       # a directory of Harbor task directories

`HarborHarnessEnv` is the Harbor env (gymflow.envs.builtin.harbor.env: the task's image and container,
its limits and no network, its verifier as the reward, its agent timeout as the program's wall time)
with the agent program of a harness env (gymflow.envs.harness.env.ProgramHost) in place of the
workflow's agent loop.

Where the program runs, and why: on the worker's node, in a directory of its own, not in the task's
container. The container has no network (the gateway is out of its reach, as is any package index
the agent would need), and the task's image does not carry the agent's dependencies (mini-swe-agent
brings litellm). The program acts on the container the way such agents already do, with
``docker run``/``docker exec``: its PATH starts with gymflow's container-engine shim
(gymflow.envs.harness.shim), which hands it the rollout's own container and nothing else. The agent
is unmodified and configured as for any Docker environment.

`SolutionPolicy` is the scripted upstream of the tests: it plays a task as a bash-tool agent would,
running the task's own solution, then the agent's finish command.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from gymflow.envs.builtin.harbor.env import HarborEnv
from gymflow.envs.builtin.harbor.policy import SOLUTION_DIR
from gymflow.envs.builtin.harbor.task import SOLUTION_SCRIPT, HarborTask
from gymflow.envs.contract import Message, Task, ToolCall, ToolSpec
from gymflow.envs.errors import InfraError
from gymflow.envs.harness import shim
from gymflow.envs.harness.env import ProgramHost
from gymflow.envs.policy import Policy
from gymflow.envs.runtime.container import ContainerSandbox

BASES = ("harbor",)
"""What an env file's `base:` may name."""


class HarborHarnessEnv(ProgramHost, HarborEnv):
    """Harbor tasks, each played by the harness's agent program acting on the task's container."""

    dataset_path: ClassVar[Path | None] = None
    """The env file's `dataset`: the directory of tasks `default` names."""
    policies: ClassVar[Mapping[str, Any]] = {}
    """None of Harbor's own: its oracle speaks the terminal toolset, not the program's tools. An env file
    may name policies for its program (`policies:`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._host(self.workspace_root)
        self._homes: dict[str, Path] = {}

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> list[Task]:
        """The env file's `dataset` for `default`, else the task directories under `name`."""
        if name in {"default", "generated", ""}:
            if cls.dataset_path is None:
                raise ValueError("this harness env file names no 'dataset': pass a directory of Harbor tasks")
            name = str(cls.dataset_path)
        return super().load_dataset(name, **kwargs)

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        """The task's container (HarborEnv), and a directory on the node for the program."""
        self.take_harness(rollout_id, rollout_args)
        try:
            await super().init_rollout(rollout_id, **rollout_args)
        except BaseException:
            self._harnesses.pop(rollout_id, None)
            raise
        home = self.workspace_root / f"agent-{uuid.uuid4().hex[:12]}"
        home.mkdir(parents=True)
        self._homes[rollout_id] = home

    def program_home(self, rollout_id: str) -> Path:
        self.sandbox(rollout_id)  # RolloutNotFound for a rollout this instance does not hold
        return self._homes[rollout_id]

    async def program_variables(self, rollout_id: str, home: Path) -> dict[str, str]:
        """The shim first on PATH, told the rollout's container and the node's engine."""
        sandbox = self.sandbox(rollout_id)
        if not isinstance(sandbox, ContainerSandbox):
            raise InfraError(f"rollout {rollout_id} has no container for its program to act on")
        engine = shutil.which(sandbox.engine.binary) or sandbox.engine.binary
        bin_dir = shim.install(home / ".gymflow-bin")
        return {
            shim.CONTAINER_VAR: sandbox.name,
            shim.ENGINE_VAR: engine,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    async def release_rollout(self, rollout_id: str) -> None:
        """Kill the program, remove its directory, then release the container (HarborEnv)."""
        if rollout_id in self._homes:
            await self.stop_program(rollout_id)
        self._harnesses.pop(rollout_id, None)
        home = self._homes.pop(rollout_id, None)
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)
        await super().release_rollout(rollout_id)

    async def shutdown(self) -> None:
        await self.stop_programs()
        await super().shutdown()


class SolutionPolicy(Policy):
    """Plays Harbor tasks as a bash-tool agent (mini-swe-agent) would, following each task's solution.

    Its first turn calls `bash` with one command that writes every file of the task's solution/ to
    /solution (`solution_command`) and runs solve.sh; its second calls `bash` with the agent's finish
    command (mini-swe-agent's ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``). It finds the task by its
    instruction, which the agent quotes in its first user message (the longest instruction quoted, so
    one that contains another's is not mistaken for it).

    Args:
        tasks: The tasks it can play.
        finish: The command that ends the agent's run.
    """

    name = "harbor-solution"

    def __init__(self, tasks: Sequence[HarborTask], *, finish: str = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"):
        self._tasks = [t for t in tasks if t.solution_dir is not None]
        self._finish = finish

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        del tools
        asked = "\n".join(m.content for m in messages if m.role == "user")
        quoted = [t for t in self._tasks if t.instruction in asked]
        if not quoted:
            return Message(role="assistant", content="I know no solution to this task.")
        task = max(quoted, key=lambda t: len(t.instruction))
        done = sum(1 for m in messages if m.role == "assistant")
        command = solution_command(task) if done == 0 else self._finish
        call = ToolCall(id=f"call_{done}", name="bash", arguments={"command": command})
        return Message(role="assistant", content=f"Step {done + 1} of the reference solution.", tool_calls=[call])


def solution_command(task: HarborTask, *, root: str = SOLUTION_DIR) -> str:
    """One shell command that writes the task's solution/ files under `root` and runs solve.sh there.

    Every file of solution/ (subdirectories included) arrives byte for byte: its content travels as
    base64, so binary files, files without a final newline and text that would end a heredoc or break
    quoting all survive; an executable file stays executable (a helper solve.sh runs directly). The
    command is one argument of the agent's ``docker exec``, so a solution is limited to what one
    argument may hold (128 KiB on Linux), plenty for a test task's scripts.
    """
    assert task.solution_dir is not None
    parts = ["set -e"]
    for path in sorted(p for p in task.solution_dir.rglob("*") if p.is_file()):
        target = shlex.quote(f"{root}/{path.relative_to(task.solution_dir).as_posix()}")
        content = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f'mkdir -p "$(dirname {target})" && printf %s {content} | base64 -d > {target}')
        if os.access(path, os.X_OK):
            parts.append(f"chmod +x {target}")
    parts.append(f"bash {shlex.quote(f'{root}/{SOLUTION_SCRIPT}')}")
    return "\n".join(parts)
