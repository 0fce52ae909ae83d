"""The scripted policy of envs/examples/units.py: `gymflow eval units` runs it without a model.

It reads the distance from the question, asks the calculator to multiply it by the km in a mile,
and answers with what the tool returned, so every number in its answer came from the tool, as a
model's should. A question it cannot read, a missing `multiply` tool or a tool error get
`<answer>unknown</answer>`, which the env scores 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gymflow.envs.contract import Message, ToolCall, ToolSpec
from gymflow.envs.policy import Policy

KM_PER_MILE = 1.609344
_QUESTION = re.compile(r"How many km is ([0-9.]+) miles\?")


class ConvertPolicy(Policy):
    """Miles to km with one `multiply` call."""

    name = "convert"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        results = [m for m in messages if m.role == "tool"]
        if results:
            last = results[-1]
            answer = "unknown" if last.is_error else last.content.strip()
            return Message(role="assistant", content=f"<answer>{answer}</answer>")
        match = _QUESTION.search(next((m.content for m in messages if m.role == "user"), ""))
        if match is None or "multiply" not in {t.name for t in tools}:
            return Message(role="assistant", content="<answer>unknown</answer>")
        miles = float(match.group(1))
        call = ToolCall(id="convert-0", name="multiply", arguments={"a": miles, "b": KM_PER_MILE})
        return Message(role="assistant", tool_calls=[call])
