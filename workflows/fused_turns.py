"""A rollout's fused turns (workflow code, used by RolloutWorkflow): one `play_turn` activity per turn.

A fused turn runs the model call and the reply's tool calls on the rollout's node in one activity
(gymflow.activities.turn). What the workflow keeps for it lives here: what of the conversation the
node holds (so a turn sends only the messages after it, gymflow.activities.context_cache), and how
a rollout adapts to a node worker older than this code: a node that refuses a turn sent as a delta
gets the rollout's turns whole, and one that refuses the call-lines request gets turns without it.
The workflow's agent loop decides when a turn is fused; this module plays one.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors
    from gymflow.activities.env_schema import RolloutHandle
    from gymflow.activities.model import GenerateInput
    from gymflow.activities.schema import RolloutInput
    from gymflow.activities.turn import CachedContext, PlayTurnInput, PlayTurnResult, TurnActivities, TurnDelta
    from gymflow.envs.contract import Message, TerminationReason
    from gymflow.envs.wire.tokens import TokenPrefix
    from gymflow.workflows.activity_calls import describe, error_type, execute, node_lost
    from gymflow.workflows.rollout_env import ADMISSION_WAIT, ENV_HEARTBEAT, NODE_ERRORS, RolloutEnv, Stop

MAX_TIMED_CALLS = 16
"""A fused turn's start-to-close allows this many tool calls' timeouts at most (each call has its
own timeout inside; the heartbeat notices a lost node within seconds)."""
CALL_LINES_PATCH = "play-turn-call-lines"
"""Patch id, checked only when a node refuses a whole fused turn: the turn goes again without asking
for call lines instead of ending the rollout (histories written before replay as they ended)."""


class FusedTurns:
    """The fused-turn state of one rollout, and the activity call that plays a turn."""

    def __init__(self, input: RolloutInput, rollout_id: str) -> None:
        self.input = input
        self.rollout_id = rollout_id
        self.node_context: tuple[str, CachedContext] | None = None
        """(state key, what of the conversation its node holds): fused turns send only the rest."""
        self.whole_turns = False
        """A node refused a turn sent as a delta (a worker older than this code): send turns whole."""
        self.call_lines = True
        """Fused turns ask for call lines; off once a node refused the request (older than it)."""
        self.call_lines_read_at: str | None = None
        """The state key of the rollout whose node took a turn that asked for call lines."""

    def forget(self) -> None:
        """The rollout's node holds settings that changed (a new model): the next turn goes whole."""
        self.node_context = None

    async def play(
        self,
        handle: RolloutHandle,
        *,
        env: RolloutEnv,
        messages: list[Message],
        turn: int,
        token_prefix: TokenPrefix | None,
        room_bytes: int | None,
        whole: Callable[[], GenerateInput],
    ) -> PlayTurnResult:
        """Play one turn on `handle`'s node; its model input is `whole()` unless the node holds the start.

        Raises:
            ActivityError: The node was lost (the caller's `RolloutEnv.on_node` recovers the rollout).
            Stop: The turn cannot be played (context length, env config, model failure).
        """
        input = self.input
        limits = input.limits
        calls_left = max(0, min(limits.max_tool_calls - env.tool_calls, MAX_TIMED_CALLS))
        held = self.node_context
        cached = held[1] if held is not None and held[0] == handle.state_key and not self.whole_turns else None
        try:
            result = await execute(
                TurnActivities.play_turn,
                PlayTurnInput(
                    generate=whole() if cached is None else self._delta(cached, messages, turn, token_prefix),
                    cached=cached,
                    env=input.env,
                    state_key=handle.state_key,
                    tool_timeout_s=limits.tool_timeout_s,
                    max_output_chars=limits.max_tool_output_chars,
                    tool_calls_made=env.tool_calls,
                    max_tool_calls=limits.max_tool_calls,
                    reward_task=input.task if cached is None else None,  # the node holds it with the rest
                    room_bytes=room_bytes,
                    call_lines=self.call_lines,
                ),
                task_queue=handle.node_queue,
                schedule_to_start_timeout=timedelta(seconds=input.retry.node_timeout_s),
                start_to_close_timeout=timedelta(seconds=input.model.request_timeout_s + 30)
                + ADMISSION_WAIT
                + timedelta(seconds=limits.tool_timeout_s + 30) * calls_left,
                heartbeat_timeout=ENV_HEARTBEAT,
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=30),
                    maximum_attempts=input.retry.model_attempts,
                    non_retryable_error_types=[
                        *(errors.MODEL_REJECTED, errors.CONTEXT_LENGTH, errors.CONTEXT_MISSING),
                        *NODE_ERRORS,
                    ],
                ),
                # No summary: it could not name the calls (the model has not answered yet), and the Web
                # UI's compact view shows a result's head only for activities without one. The result
                # starts with the call lines instead (gymflow.activities.turn).
            )
        except ActivityError as exc:
            if node_lost(exc):
                raise  # on_node re-initialises the rollout and plays the turn again
            again = self._adapt(exc, cached, handle)
            if again:
                return await self.play(
                    handle,
                    env=env,
                    messages=messages,
                    turn=turn,
                    token_prefix=token_prefix,
                    room_bytes=room_bytes,
                    whole=whole,
                )
            if error_type(exc) == errors.CONTEXT_LENGTH:
                raise Stop(TerminationReason.CONTEXT_BUDGET) from exc
            if error_type(exc) == errors.ENV_CONFIG:
                raise Stop(TerminationReason.ENV_ERROR, describe(exc)) from exc
            raise Stop(TerminationReason.MODEL_ERROR, describe(exc)) from exc
        if self.call_lines:
            self.call_lines_read_at = handle.state_key  # this node reads the request: never refused for it
        # The node now holds the conversation with this reply, which the agent loop appends as is
        # (or ends the rollout); the next turn sends only the tool results after it.
        token = result.context_token
        held_count = len(messages) + 1
        self.node_context = (handle.state_key, CachedContext(token=token, messages=held_count)) if token else None
        return result

    def _adapt(self, exc: ActivityError, cached: CachedContext | None, handle: RolloutHandle) -> bool:
        """Whether the turn goes again, sent another way, after the node refused it."""
        if cached is not None and error_type(exc) == errors.CONTEXT_MISSING:
            self.node_context = None  # the node lost what it held: send the turn whole
            return True
        if cached is not None and error_type(exc) == errors.INVALID_INPUT:
            # A node worker older than this workflow code (a fleet mid-upgrade) does not read
            # turn deltas: this rollout's turns go whole from now on, as every version reads them.
            self.whole_turns = True
            return True
        if (
            cached is None
            and self.call_lines
            and self.call_lines_read_at != handle.state_key
            and error_type(exc) == errors.INVALID_INPUT
            and workflow.patched(CALL_LINES_PATCH)
        ):
            # A node older than call lines refuses the request: this rollout's turns go without it.
            self.call_lines = False
            return True
        return False

    def _delta(
        self, after: CachedContext, messages: list[Message], turn: int, token_prefix: TokenPrefix | None
    ) -> TurnDelta:
        """A fused turn's model input when its node holds the conversation's start, the model settings,
        the tools and the task: only the messages after those it holds."""
        return TurnDelta(
            messages=messages[after.messages :],
            rollout_id=self.rollout_id,
            turn=turn,
            token_prefix=token_prefix,
        )
