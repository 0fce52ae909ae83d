"""The CRM env's reference policy, and a driver that plays a policy without Temporal.

`ReferencePolicy` answers generated tasks through the tools, like the other envs' baselines: it is
pure and sees only the conversation (it may sit behind ``gymflow policy serve crm``), reads the
``Task id:`` line, rebuilds the task's reference solution in memory (gymflow.envs.builtin.crm.tasks.task_spec),
and plays its tool calls one per turn, each built from the results of the ones before. Its answer
comes only from tool results (an id from a listing, a sum from a query, a sentence from an
article): if the tools lied, it would score 0. Privacy tasks get ``REFUSE`` without a tool call.

A tool error, a result that is not JSON, or a task it cannot rebuild ends the rollout with a plain
reply and no ``<answer>`` (reward 0), never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gymflow.envs.builtin.crm.tasks import parse_task_id, task_spec
from gymflow.envs.contract import Message, ToolCall, ToolSpec
from gymflow.envs.policy import Policy


def _reply(text: str) -> Message:
    return Message(role="assistant", content=text)


class ReferencePolicy(Policy):
    """Plays a generated task's reference tool calls, then answers from their results."""

    name = "reference"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        """The next tool call of the reference solution, or the final ``<answer>``.

        Args:
            messages: The conversation; the task id is read from the first user message.
            tools: The tools offered; a missing one makes the policy give up.
        """
        first_user = next((m for m in messages if m.role == "user"), None)
        coords = parse_task_id(first_user.content) if first_user is not None else None
        if coords is None:
            return _reply("I have no reference solution for this task.")
        try:
            spec = task_spec(*coords)
        except (ValueError, RuntimeError):
            return _reply("I have no reference solution for this task.")
        results: list[Any] = []
        for message in messages:
            if message.role != "tool":
                continue
            if message.is_error:
                return _reply(f"A tool failed, so I cannot answer: {message.content[:200]}")
            try:
                results.append(json.loads(message.content))
            except ValueError:
                return _reply("A tool returned something I cannot read, so I cannot answer.")
        try:
            if len(results) < len(spec.steps):
                step = spec.steps[len(results)]
                if step.tool not in {t.name for t in tools}:
                    return _reply(f"The {step.tool} tool is not available.")
                call = ToolCall(id=f"ref-{len(results)}", name=step.tool, arguments=step.args(results))
                return Message(role="assistant", content=f"Looking this up with {step.tool}.", tool_calls=[call])
            return _reply(f"<answer>{spec.answer(results)}</answer>")
        except (LookupError, KeyError, IndexError, TypeError, ValueError, StopIteration) as exc:
            return _reply(f"The data did not contain what I expected ({type(exc).__name__}), so I cannot answer.")
