"""Scripted policies of the test env packages (gymflow-side: `--policy NAME=<this file>:Class`).

Each reads the task from the conversation as a model would, acts through the env's tools and
answers in the env's format, so `gymflow eval ENV` plays the imported env without a model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from gymflow.envs.contract import Message, ToolCall, ToolSpec
from gymflow.envs.policy import Policy


def _prompt(messages: Sequence[Message]) -> str:
    return next((m.content for m in messages if m.role == "user"), "")


def _numbers(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", text)]


class SumsPolicy(Policy):
    """The pinned envs: `add` the two numbers of "What is A + B?", then answer with the tool's result."""

    name = "sums"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        results = [m for m in messages if m.role == "tool"]
        if results:
            return Message(role="assistant", content=f"<answer>{results[-1].content.strip()}</answer>")
        a, b = _numbers(_prompt(messages))[:2]
        return Message(role="assistant", tool_calls=[ToolCall(id="add-0", name="add", arguments={"a": a, "b": b})])


class CalculatorPolicy(Policy):
    """benchmax's math env: its one calculator tool (`calculate`, an expression) on the question's
    expression, then `<answer>` with the result on the last line."""

    name = "calculator"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        results = [m for m in messages if m.role == "tool"]
        if results:
            return Message(
                role="assistant", content=f"The result is below.\n<answer>{results[-1].content.strip()}</answer>"
            )
        expression = _prompt(messages).split("Compute", 1)[-1].strip().rstrip("?.")
        tool = tools[0].name if tools else "calculate"
        return Message(
            role="assistant", tool_calls=[ToolCall(id="calc-0", name=tool, arguments={"expression": expression})]
        )


class NotesPolicy(Policy):
    """The notes env (benchmax BaseEnv in the tests): write the note, read it back, answer with it."""

    name = "notes"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        results = [m for m in messages if m.role == "tool"]
        word = _prompt(messages).rsplit(" ", 1)[-1].strip(".")
        if not results:
            return Message(role="assistant", tool_calls=[ToolCall(id="w", name="write_note", arguments={"text": word})])
        if len(results) == 1:
            return Message(role="assistant", tool_calls=[ToolCall(id="r", name="read_note", arguments={})])
        return Message(role="assistant", content=f"<answer>{results[-1].content.strip()}</answer>")


class ArithPolicy(Policy):
    """verifiers single-turn and tool tasksets: the sum, computed with the tool when there is one."""

    name = "arith"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        results = [m for m in messages if m.role == "tool"]
        if results:
            return Message(role="assistant", content=results[-1].content.strip())
        a, b = (int(n) for n in _numbers(_prompt(messages))[:2])
        if tools:
            return Message(
                role="assistant", tool_calls=[ToolCall(id="t", name=tools[0].name, arguments={"a": a, "b": b})]
            )
        return Message(role="assistant", content=str(a + b))


class BisectPolicy(Policy):
    """Number guessing (the verifiers multi-turn env, and the OpenEnv one through its `step` tool):
    bisect on "higher" / "lower" within 1..100."""

    name = "bisect"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        low, high = 1, 100
        guess = None
        for message in messages:
            if message.role == "assistant":
                said = message.tool_calls[0].arguments.get("guess") if message.tool_calls else message.content
                guess = int(float(str(said))) if said is not None and str(said).strip().lstrip("-").isdigit() else guess
            elif message.role in {"user", "tool"} and guess is not None:
                text = message.content.lower()
                if message.role == "tool":
                    text = (
                        str(json.loads(message.content).get("observation", {}).get("hint", ""))
                        if message.content.startswith("{")
                        else text
                    )
                if "higher" in text:
                    low = guess + 1
                elif "lower" in text:
                    high = guess - 1
        last = messages[-1]
        if last.role == "tool" and last.content.startswith("{") and json.loads(last.content).get("done"):
            return Message(role="assistant", content="done")
        nxt = (low + high) // 2
        if tools:
            return Message(
                role="assistant", tool_calls=[ToolCall(id=f"g{len(messages)}", name="step", arguments={"guess": nxt})]
            )
        return Message(role="assistant", content=str(nxt))
