"""The oracle: plays a Harbor task by running its solution/solve.sh through the terminal tool.

Like every scripted policy it sees only the conversation (it can sit behind an HTTP endpoint), so it
finds the task by its instruction among the tasks loaded in its process (`gymflow eval harbor`
loads the dataset before it serves the policy). Its first turn writes the solution directory's
files to /solution with `write_file` and runs `bash /solution/solve.sh` with the agent's whole time
as the command's timeout; its second turn answers. An oracle that does not reach 1.0 is a broken
task (or a broken runtime), which is what it is for.
"""

from __future__ import annotations

from collections.abc import Sequence

from gymflow.envs.builtin.harbor.env import known_task
from gymflow.envs.builtin.harbor.task import SOLUTION_SCRIPT, HarborTask
from gymflow.envs.contract import Message, ToolCall, ToolSpec
from gymflow.envs.policy import Policy
from gymflow.envs.runtime.terminal import MAX_TIMEOUT_S

SOLUTION_DIR = "/solution"


class OracleError(ValueError):
    """The conversation's task is unknown here, ambiguous, or has no solution."""


class OraclePolicy(Policy):
    """Runs the task's own solution."""

    name = "oracle"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        del tools
        if any(m.role == "tool" for m in messages):
            return Message(role="assistant", content="The solution ran; done.")
        instruction = next((m.content for m in messages if m.role == "user"), "")
        return Message(role="assistant", content="Running the reference solution.", tool_calls=solution_calls(
            find_task(instruction)
        ))  # fmt: skip


def find_task(instruction: str) -> HarborTask:
    """The one loaded task with this instruction whose solution the oracle can run."""
    found = [t for t in known_task(instruction) if t.solution_dir is not None]
    scripts = {(t.solution_dir / SOLUTION_SCRIPT).read_bytes() for t in found if t.solution_dir is not None}
    if not found:
        raise OracleError("the oracle knows no task (with a solution) of this instruction: load the dataset first")
    if len(scripts) > 1:
        raise OracleError(f"{len(found)} loaded tasks share this instruction with different solutions")
    return found[0]


def solution_calls(task: HarborTask) -> list[ToolCall]:
    """write_file for every file of solution/, then bash on solve.sh within the agent's time."""
    assert task.solution_dir is not None
    calls = []
    for index, path in enumerate(sorted(p for p in task.solution_dir.rglob("*") if p.is_file())):
        try:
            content = path.read_text()
        except UnicodeDecodeError:
            raise OracleError(f"{path}: the oracle writes text files only") from None
        target = f"{SOLUTION_DIR}/{path.relative_to(task.solution_dir).as_posix()}"
        calls.append(ToolCall(id=f"oracle-{index}", name="write_file", arguments={"path": target, "content": content}))
    timeout = min(task.config.agent.timeout_sec, MAX_TIMEOUT_S)
    command = f"bash {SOLUTION_DIR}/{SOLUTION_SCRIPT}"
    calls.append(ToolCall(id="oracle-run", name="bash", arguments={"command": command, "timeout": timeout}))
    return calls
