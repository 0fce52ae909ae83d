"""Keeps a rollout's conversation under the payload limit of the activities and result carrying it.

Without external payload storage, Temporal refuses any payload over its limit (2 MiB by default),
and a workflow task whose command carries one fails and is retried forever: the rollout would
hang. Every model turn's input, the reward's input and the rollout's result carry the whole
conversation, so the workflow admits each new message through a `TrajectoryBudget`: a message
that would take the conversation past the budget is cut to fit, with a visible note, and the
rollout stops there (`context_budget`). No model has a context window near this size, so only a
broken endpoint, a tool with an absurd output limit, or a very long rollout ever gets here.

Pure (no I/O, deterministic) and passed through the workflow sandbox.
"""

from __future__ import annotations

from typing import Any

from gymflow.envs.contract import Message, json_bytes

SLACK_BYTES = 64 * 1024
"""Room left for what a payload carries besides the conversation and the fixed parts (ids, model
settings, usage, the reward, the protobuf envelope)."""


class TrajectoryBudget:
    """How many bytes of conversation a rollout may still add; unbounded when `limit` is None."""

    def __init__(self, limit: int | None, *fixed: Any) -> None:
        """`fixed`: what travels with the conversation (the task, the tool specs, the rubric)."""
        self.limit = None if limit is None else limit - sum(json_bytes(part) for part in fixed) - SLACK_BYTES
        self.used = 0

    def admit(self, message: Message) -> tuple[Message, bool]:
        """`message` and True if it fits; else a cut copy that fits, and False (the rollout stops)."""
        size = json_bytes(message)
        if self.limit is None or self.used + size <= self.limit:
            self.used += size
            return message, True
        room = max(0, self.limit - self.used)
        dropped = f"; its {len(message.tool_calls)} tool call(s) were not run" if message.tool_calls else ""
        note = (
            f"\n[gymflow: cut here, {size} bytes in all: the trajectory reached its payload budget of "
            f"{self.limit} bytes{dropped}]"
        )
        keep = len(message.content)
        while True:
            cut = message.model_copy(update={"content": message.content[:keep] + note, "tool_calls": []})
            cut_size = json_bytes(cut)
            if cut_size <= room or keep == 0:
                break
            keep = max(0, min(keep - 1, int(keep * room / cut_size * 0.95)))
        self.used += cut_size
        return cut, False

    def charge(self, value: Any) -> bool:
        """Count `value` (a turn's token data) if it fits; False, counting nothing, if it does not."""
        size = json_bytes(value)
        if self.limit is not None and self.used + size > self.limit:
            return False
        self.used += size
        return True

    def fits(self, messages: list[Message]) -> bool:
        """Count `messages` (the opening of the conversation); False if they alone overflow."""
        self.used += sum(json_bytes(m) for m in messages)
        return self.limit is None or self.used <= self.limit
