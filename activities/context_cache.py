"""What a node remembers of its fused rollouts' conversations, so a turn's input carries only what is new.

A fused turn (gymflow.activities.turn) needs the whole conversation and the tool list. Sent whole every
turn, the conversation makes a rollout's history grow with the square of its turns (turn k carries
k turns of messages), many times the size of the messages themselves, converted to and from JSON on
both sides of every turn. The node that plays a
rollout's turns is always the same one (the rollout is pinned to its node queue), so it keeps what
the last turn saw — the conversation, the reply it gave, the tools, the model settings and the task
to score a final answer against — under a fresh random token, and the next turn sends the token,
how many messages it covers, and the messages after them (the tool results the workflow added) as
an `gymflow.activities.turn.TurnDelta`. History then grows with the conversation, not its square, and a
turn's input carries nothing that does not change between turns.

The cache is only an optimisation; the workflow's transcript stays the record. A token names one
attempt's conversation: a late attempt that wrote after the accepted one cannot be mistaken for it,
while the token a turn was given stays good for its start, so a retried turn still finds it.
A turn whose token this node does not hold (evicted, the worker restarted, a stale attempt) fails
with CONTEXT_MISSING and the workflow sends the turn again whole. Entries are dropped when the
rollout's state is released, and the least recently used ones when the cache is over its size.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from gymflow.activities.model import ModelConfig
from gymflow.envs.contract import Message, Task, ToolSpec, json_bytes

DEFAULT_MAX_CHARS = 256 * 1024 * 1024
"""Default bound on the characters held (content, raw tool-call arguments, inline images' base64)."""
MESSAGE_OVERHEAD_CHARS = 256
"""What a message counts for besides its content (role, tool calls, ids), for the bound."""


@dataclass(frozen=True)
class Held:
    """What a token gives back: the conversation's start, and the turn's tools, model settings and
    reward task (None: the turn that was held had none to score against)."""

    messages: list[Message]
    tools: list[ToolSpec]
    model: ModelConfig | None
    task: Task | None


@dataclass(frozen=True)
class Context:
    tokens: dict[str, int]
    """Token -> how many of `messages` it names: the entry's own token names all of them, the
    token of the turn it extends names the start that turn held (so a retried turn finds it)."""
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    sizes: tuple[int, ...]
    """`sizes[i]`: the size of `messages[: i + 1]`, so the next turn sizes only what it adds."""
    model: ModelConfig | None
    task: Task | None
    settings_size: int
    """What the model settings and the task count for (their JSON, sized once per rollout)."""

    @property
    def size(self) -> int:
        return (self.sizes[-1] if self.sizes else 0) + self.settings_size


def _size(message: Message) -> int:
    """About the characters `message` holds: content, tool calls' raw arguments, inline images."""
    return (
        len(message.content)
        + sum(len(c.raw_arguments or str(c.arguments)) for c in message.tool_calls)
        + sum(len(a.data or "") for a in message.images)
        + MESSAGE_OVERHEAD_CHARS
    )


def _settings_size(model: ModelConfig | None, task: Task | None) -> int:
    return sum(json_bytes(part) for part in (model, task) if part is not None)


class ContextCache:
    """Per-process, per-state-key conversation contexts of fused rollouts (LRU, bounded)."""

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, got {max_chars}")
        self.max_chars = max_chars
        self._entries: OrderedDict[str, Context] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, state_key: object) -> bool:
        return state_key in self._entries

    @property
    def chars(self) -> int:
        return self._chars

    def get(self, state_key: str, token: str, count: int) -> Held | None:
        """The first `count` messages stored under `token`, with the turn's tools, model settings and
        task; None if not held."""
        entry = self._entries.get(state_key)
        if entry is None or count > entry.tokens.get(token, -1):
            return None
        self._entries.move_to_end(state_key)
        return Held(list(entry.messages[:count]), list(entry.tools), entry.model, entry.task)

    def put(
        self,
        state_key: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        extends: tuple[str, int] | None = None,
        model: ModelConfig | None = None,
        task: Task | None = None,
    ) -> str | None:
        """Hold `messages`, `tools`, `model` and `task` for `state_key` under a fresh token; None if
        they cannot fit.

        `extends` is the (token, count) the turn was given: its first `count` messages, which start
        `messages`, stay held under that token too, for a retry of the same turn.
        """
        previous = self._entries.get(state_key)
        kept: tuple[int, ...] = ()  # the sizes of the start held already: a turn sizes only its own part
        settings_size: int | None = None
        if extends is not None and previous is not None and previous.tokens.get(extends[0], -1) >= extends[1]:
            kept = previous.sizes[: min(extends[1], len(messages))]
            if previous.model == model and previous.task == task:
                settings_size = previous.settings_size
        if settings_size is None:
            settings_size = _settings_size(model, task)
        sizes = kept + tuple(accumulate(map(_size, messages[len(kept) :]), initial=kept[-1] if kept else 0))[1:]
        size = (sizes[-1] if sizes else 0) + settings_size
        self.forget(state_key)
        if size > self.max_chars:
            return None
        while self._entries and self._chars + size > self.max_chars:
            _, evicted = self._entries.popitem(last=False)
            self._chars -= evicted.size
        token = uuid.uuid4().hex
        tokens = {token: len(messages)}
        if extends is not None:
            tokens[extends[0]] = min(extends[1], len(messages))
        self._entries[state_key] = Context(tokens, tuple(messages), tuple(tools), sizes, model, task, settings_size)
        self._chars += size
        return token

    def forget(self, state_key: str) -> None:
        entry = self._entries.pop(state_key, None)
        if entry is not None:
            self._chars -= entry.size

    def clear(self) -> None:
        self._entries.clear()
        self._chars = 0
