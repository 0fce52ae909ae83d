"""A fused turn: one model turn and its tool calls in one activity, for envs whose calls may re-run.

A classic rollout turn is two or more activities: `generate` on the shared queue, then one
`call_tool` per tool call on the rollout's node queue. Each costs the Temporal server two round
trips and its own history events, and on a small deployment the server's CPU per activity is what
bounds throughput (docs/benchmarks.md). `play_turn` runs on the node queue (the rollout's servers
live there): it asks the model, runs the reply's tool calls on the rollout's state, and when the
reply is a final answer that fits the rollout's payload budget, computes the reward and frees the
state — one activity per turn, and none for the reward.

The price is what a retry does: a failed or lost attempt runs the whole turn again, model call and
tool calls. That is only sound for envs whose tool calls change nothing (`BaseEnv.stateless`), so
the workflow fuses turns only for those, and only when the env asks for it (`BaseEnv.fused_turns`)
or the rollout does (`RolloutInput.fuse_turns`). Stateful envs keep one activity per tool call:
a completed call is never run again.

The node keeps what each turn saw (gymflow.activities.context_cache), so the next turn's input carries only
the messages added since — the tool results — and the rollout's history grows with its conversation,
not with its square. A node that no longer holds it fails the turn with CONTEXT_MISSING before the
model is asked, and the workflow sends the turn whole.

What the Web UI shows of a turn without expanding it is the head of its result (its first few dozen
characters, in the event list and in the compact view; the compact view drops it for an activity that
has a summary). The turn's tool calls are only known once the model has answered, inside the
activity, so no summary set when the workflow schedules it could name them: the result names them
instead, first, one line per call (`PlayTurnResult.calls`: `calculator.add(a=17, b=2) -> 19`), and the
turn carries no summary. Workflows ask for these lines (`PlayTurnInput.call_lines`): a workflow worker
older than them would refuse a result that has them, and a node worker older than them refuses the
field, after which the workflow sends its turns without it.

Failures keep their types: the model's (MODEL_ERROR, MODEL_REJECTED, CONTEXT_LENGTH) and the env's
(ROLLOUT_NOT_FOUND, ENV_ERROR: the workflow re-initialises the rollout and plays the turn again).
A reward that fails here is not an error of the turn: the reply comes back without a reward and
with the state held, and the workflow scores it the classic way, with the reward's own retries and
error types.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from pydantic import Field, model_validator
from temporalio import activity

from gymflow.activities import errors
from gymflow.activities.env import CallToolInput, ComputeRewardInput, EnvActivities, log_context
from gymflow.activities.model import GenerateInput, GenerateResult, ModelActivities
from gymflow.envs.contract import Message, Reward, Task, ToolCall, ToolResult, ToolSpec, Wire, json_bytes
from gymflow.envs.wire.tokens import TokenPrefix

log = logging.getLogger(__name__)

TURN_ACTIVITY = "play_turn"
RESULT_HEAD_CHARS = 80
"""How much of a tool's output a call line (`call_line`) shows; the result itself is whole."""


def call_summary(call: ToolCall, limit: int = 120) -> str:
    """`tool(arg=value, ...)`, values as JSON, cut to `limit` characters."""
    args = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in call.arguments.items())
    text = f"{call.name}({args})"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def named_call(call: ToolCall, tools: Sequence[ToolSpec]) -> str:
    """`server.tool(arg=value, ...)`: a call as an activity summary (classic turns) and a call line
    (fused turns) name it; without the server's name for a tool no server provides."""
    server = next((t.server for t in tools if t.name == call.name), None)
    return (f"{server}." if server else "") + call_summary(call)


def call_line(call: ToolCall, tools: Sequence[ToolSpec], result: ToolResult) -> str:
    """`server.tool(arg=value, ...) -> result`: one call of a fused turn and the head of its result, on
    one line (whitespace collapsed, cut to RESULT_HEAD_CHARS), errors marked as such."""
    head = " ".join(result.text.split())
    if result.is_error and not head.lower().startswith("error"):
        head = f"error: {head}"
    if len(head) > RESULT_HEAD_CHARS:
        head = head[: RESULT_HEAD_CHARS - 3] + "..."
    return f"{named_call(call, tools)} -> {head}"


def refusal(call: ToolCall, tools: Sequence[ToolSpec], calls_made: int, max_calls: int) -> ToolResult | None:
    """The error observation for a call that must not reach the env, or None if it may run.

    Malformed calls, unknown tools and calls past the rollout's tool budget are refused; the
    workflow (classic turns) and `play_turn` (fused turns) decide alike.
    """
    if call.parse_error is not None:
        return ToolResult(text=f"error: could not parse tool call: {call.parse_error}", is_error=True)
    if call.name not in {t.name for t in tools}:
        known = ", ".join(t.name for t in tools)
        return ToolResult(text=f"error: unknown tool {call.name!r}; available tools: {known}", is_error=True)
    if calls_made >= max_calls:
        return ToolResult(text=f"error: tool call budget exhausted ({max_calls} calls); not executed", is_error=True)
    return None


class CachedContext(Wire):
    """The start of a turn's conversation that this node already holds (gymflow.activities.context_cache)."""

    token: str
    """What the node's previous turn of this rollout returned as `PlayTurnResult.context_token`."""
    messages: int = Field(ge=1)
    """How many messages, from the first, the node holds under `token`."""


class TurnDelta(Wire):
    """A turn's model input when its node holds the rest (`PlayTurnInput.cached`): the messages after
    the held ones. The held turn's model settings, tools and reward task complete it."""

    messages: list[Message]
    rollout_id: str
    turn: int
    token_prefix: TokenPrefix | None = None


class PlayTurnInput(Wire):
    """One fused turn of a rollout whose state lives on this node."""

    compact_json = True

    generate: GenerateInput | TurnDelta
    """The model turn: whole (conversation so far, tools, model settings), or with `cached` set,
    a `TurnDelta` (or, as turns were sent before deltas, a GenerateInput whose messages are only
    those after the cached ones and whose tools the cached ones replace)."""
    cached: CachedContext | None = None
    """The conversation's start as this node holds it, or None: `generate` is whole."""
    env: str
    state_key: str
    tool_timeout_s: float = Field(gt=0)
    max_output_chars: int = Field(ge=256)
    tool_calls_made: int = Field(ge=0)
    """Tool calls the rollout sent to the env before this turn (the budget counts these)."""
    max_tool_calls: int = Field(ge=0)
    reward_task: Task | None = None
    """Set when a final answer may be scored here: the task to score it against. A `TurnDelta`
    turn scores against the task held with its conversation instead."""
    room_bytes: int | None = None
    """What the rollout's payload budget still admits (None: unbounded). A final answer is scored
    here only if it and its token data fit, i.e. the workflow keeps it whole."""
    call_lines: bool = False
    """Head the result with the turn's call lines (`PlayTurnResult.calls`). Only workflows that read
    them ask: a workflow worker older than them would refuse a result that has them."""

    @model_validator(mode="after")
    def _delta_needs_cached(self) -> PlayTurnInput:
        if isinstance(self.generate, TurnDelta) and self.cached is None:
            raise ValueError("a turn sent as a delta (no model settings) needs `cached`: the start it extends")
        return self


class PlayTurnResult(Wire):
    """What a turn gave: its calls with their results, and a final answer's reward, first, then the
    model's reply (the Web UI shows the head of a payload: see the module docstring)."""

    compact_json = True

    calls: list[str] = Field(default_factory=list)
    """One line per result in `results`, `server.tool(arg=value, ...) -> result head` (`call_line`), when
    the turn asked (`PlayTurnInput.call_lines`). For people reading the history: the workflow reads
    the reply and `results`."""
    results: list[ToolResult] = Field(default_factory=list)
    """One result per tool call of the reply, in order (refusals included). Shorter than the calls
    only if the turn's results would not fit one payload: the workflow runs the rest classically."""
    reward: Reward | None = None
    """The reward of the conversation ending with this reply, when it was final and scored here;
    the rollout's state was then freed."""
    generated: GenerateResult
    context_token: str | None = None
    """The token under which this node now holds the turn's conversation, reply included, and its
    tools, for the next turn's `PlayTurnInput.cached` (None: not held, send the next turn whole)."""


class TurnActivities:
    """`play_turn` of one worker node: its model client and its env activities."""

    def __init__(self, model: ModelActivities, env: EnvActivities) -> None:
        self.model = model
        self.env = env

    @activity.defn(name=TURN_ACTIVITY)
    async def play_turn(self, input: PlayTurnInput) -> PlayTurnResult:
        """Ask the model, run its tool calls, and score a final answer; see the module docstring."""
        log_context(input.env, state_key=input.state_key)  # the model's lines too, not only the tools'
        cached = input.cached
        input, generate = self._whole(input)
        generated = await self.model.generate(generate)
        message = generated.message
        if not message.tool_calls:
            return await self._final(input, generate, generated)
        results: list[ToolResult] = []
        lines: list[str] = []
        made = input.tool_calls_made
        budget = self._result_budget(generated)
        for call in message.tool_calls:
            result = refusal(call, generate.tools, made, input.max_tool_calls)
            if result is None:
                made += 1
                result = await self.env.call_tool(
                    CallToolInput(
                        env=input.env,
                        state_key=input.state_key,
                        call=call,
                        timeout_s=input.tool_timeout_s,
                        max_output_chars=input.max_output_chars,
                    )
                )
            line = call_line(call, generate.tools, result) if input.call_lines else None
            if budget is not None:
                budget -= json_bytes(result) + (json_bytes(line) if line is not None else 0)
                if budget < 0:  # the workflow runs this call and the rest one activity each
                    break
            results.append(result)
            if line is not None:
                lines.append(line)
        token = self.env.contexts.put(
            input.state_key,
            [*generate.messages, message],
            generate.tools,
            extends=None if cached is None else (cached.token, cached.messages),
            model=generate.model,
            task=input.reward_task,
        )
        return PlayTurnResult(calls=lines, generated=generated, results=results, context_token=token)

    def _whole(self, input: PlayTurnInput) -> tuple[PlayTurnInput, GenerateInput]:
        """`input` with the conversation's cached start (and for a `TurnDelta`, the held model settings,
        tools and reward task) put back, and its whole model input; CONTEXT_MISSING if not held here."""
        delta = input.generate
        if input.cached is None:
            assert isinstance(delta, GenerateInput)  # PlayTurnInput refuses a delta without `cached`
            return input, delta
        held = self.env.contexts.get(input.state_key, input.cached.token, input.cached.messages)
        if held is None or (isinstance(delta, TurnDelta) and held.model is None):
            raise errors.non_retryable(
                f"this node no longer holds the first {input.cached.messages} messages of rollout state "
                f"{input.state_key}; send the turn whole",
                type=errors.CONTEXT_MISSING,
            )
        messages = [*held.messages, *delta.messages]
        if isinstance(delta, TurnDelta):
            assert held.model is not None
            generate = GenerateInput(
                model=held.model,
                messages=messages,
                tools=held.tools,
                rollout_id=delta.rollout_id,
                turn=delta.turn,
                token_prefix=delta.token_prefix,
            )
            task = held.task
        else:
            generate = delta.model_copy(update={"messages": messages, "tools": held.tools})
            task = input.reward_task
        return input.model_copy(update={"generate": generate, "cached": None, "reward_task": task}), generate

    def _result_budget(self, generated: GenerateResult) -> int | None:
        limit = self.env.payload_limit_bytes
        return None if limit is None else limit // 2 - json_bytes(generated)

    async def _final(self, input: PlayTurnInput, generate: GenerateInput, generated: GenerateResult) -> PlayTurnResult:
        if input.reward_task is None:
            return PlayTurnResult(generated=generated)
        size = json_bytes(generated.message) + (json_bytes(generated.tokens) if generated.tokens is not None else 0)
        if input.room_bytes is not None and size > input.room_bytes:
            return PlayTurnResult(generated=generated)  # the workflow cuts the reply: it scores what it keeps
        scored = ComputeRewardInput(
            env=input.env,
            state_key=input.state_key,
            messages=[*generate.messages, generated.message],
            task=input.reward_task,
            release=True,
        )
        try:
            reward = await self.env.compute_reward(scored)
        except Exception:
            log.warning("the fused turn's reward failed; the workflow scores the rollout itself", exc_info=True)
            return PlayTurnResult(generated=generated)
        return PlayTurnResult(generated=generated, reward=reward)
