"""Built-in policies: programs that play an environment without a model.

A policy maps the conversation so far to the next assistant message. It is pure (no I/O) and
reconstructs everything it needs from the messages, exactly as a model would, so it can sit
behind a real OpenAI-compatible HTTP endpoint (`gymflow policy serve ENV`) and be driven by the
same rollout workflow as vLLM or OpenAI. Envs expose theirs through `BaseEnv.baseline_policy`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence

from envs.contract import Message, ToolCall, ToolSpec


class Policy(ABC):
    """A deterministic chat policy."""

    name: str = "policy"

    @abstractmethod
    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        """The next assistant message (content and/or tool calls) for this conversation."""


async def converse(
    policy: Policy,
    messages: list[Message],
    tools: Sequence[ToolSpec],
    run: Callable[[ToolCall], Awaitable[tuple[str, bool]]],
    *,
    max_turns: int,
) -> list[Message]:
    """Let `policy` play from `messages` (extended in place and returned) until it answers without
    tool calls or has had `max_turns` turns; `run(call)` gives each call's (text, is_error)."""
    for _ in range(max_turns):
        reply = policy.respond(messages, tools)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            text, error = await run(call)
            messages.append(Message(role="tool", content=text, tool_call_id=call.id, name=call.name, is_error=error))
    return messages


class NullPolicy(Policy):
    """Answers nothing useful and calls no tool: the floor every env's reward must give 0."""

    name = "null"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        del messages, tools
        return Message(role="assistant", content="I don't know.")
