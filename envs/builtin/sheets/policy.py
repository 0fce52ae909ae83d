"""Baseline policies of the spreadsheet env, and a driver that plays them without Temporal.

`ReferencePolicy` solves generated tasks with their reference programs. Like every
`gymflow.envs.policy.Policy` it is pure and sees only the conversation (it may sit behind
``gymflow policy serve sheets``, answering HTTP requests from any worker), so it reconstructs the
program from the prompt: the ``Task id:`` line names a generated task (``g1-s0-00017:1``), whose
generator coordinates are in the id itself, and `gymflow.envs.builtin.sheets.generate.spec` rebuilds the task, and
with it the reference program, deterministically and in memory. It never reads a file (let alone
an answer workbook): the program reaches the workbook only through the ``run_python`` tool, in the
sandbox, like a model's code. A task it cannot rebuild (a SpreadsheetBench task, another
generator version) gets a plain reply and no tool call, so it scores 0 there.

Success is read from the tool's reply text (``exit status 0 (...)``): error flags do not travel over
the chat wire. A failed run is retried once, then the policy gives up.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gymflow.envs.builtin.sheets import generate
from gymflow.envs.builtin.sheets.data import OUTPUT_NAME, parse_task_id
from gymflow.envs.contract import Message, ToolCall, ToolSpec
from gymflow.envs.policy import Policy

RUN_TOOL = "run_python"
MAX_ATTEMPTS = 2
_SUCCESS_RE = re.compile(r"^exit status 0 \(")


def reference_program(task_id: str) -> str | None:
    """The reference program of a generated task id (``ROW:1``), or None for any other task."""
    row, _, case = task_id.rpartition(":")
    coords = generate.parse_row_id(row)
    if coords is None or case != "1":
        return None
    return generate.spec(*coords).program


class ReferencePolicy(Policy):
    """Runs a generated task's reference program with ``run_python``, then says it is done."""

    name = "reference"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        """The next assistant message: one ``run_python`` call, or the closing reply.

        Args:
            messages: The conversation; the task id is read from the first user message.
            tools: The tools offered; without ``run_python`` the policy gives up at once.
        """
        first_user = next((m for m in messages if m.role == "user"), None)
        task_id = parse_task_id(first_user.content) if first_user is not None else None
        program = reference_program(task_id) if task_id is not None else None
        if program is None:
            return Message(role="assistant", content="I have no reference solution for this task.")
        if RUN_TOOL not in {t.name for t in tools}:
            return Message(role="assistant", content=f"The {RUN_TOOL} tool is not available.")
        attempts = sum(c.name == RUN_TOOL for m in messages if m.role == "assistant" for c in m.tool_calls)
        last = messages[-1] if messages else None
        if attempts and last is not None and last.role == "tool" and _SUCCESS_RE.match(last.content):
            return Message(role="assistant", content=f"Saved the result as {OUTPUT_NAME}.")
        if attempts >= MAX_ATTEMPTS:
            return Message(role="assistant", content="The reference solution failed; giving up.")
        call = ToolCall(id=f"ref-{attempts}", name=RUN_TOOL, arguments={"code": program})
        return Message(role="assistant", content="Running the reference solution.", tool_calls=[call])
