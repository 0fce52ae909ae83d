"""The harness half of a rollout: an agent program plays it, each of its model calls a durable turn.

A harness env (gymflow.envs.harness) hands the rollout an agent program instead of tools. The
rollout then runs:

1. `run_program` on the rollout's node (gymflow.activities.harness): the program runs for as long
   as it likes, heartbeating, its model clients pointed at the node's gateway;
2. meanwhile every model call the program makes arrives as a `model_call` Update
   (gymflow.workers.servers.gateway), whose handler here answers it: from the rollout's record when
   a restarted program asks what it asked before, else by running the `model_call` activity
   (gymflow.activities.gateway). The handler returns the activity's result, so the program gets
   exactly what history holds, and only once it holds it;
3. the program's exit ends the rollout (``agent_exit``), as does a budget: model calls
   (`RolloutLimits.max_turns`), generated tokens (`max_output_tokens`), or wall time
   (`Harness.timeout_s`) stop the program (its activity is cancelled, which kills it) and end the
   rollout ``max_turns`` / ``output_budget`` / ``time_budget``; the env's reward applies either way.

Why Updates and an activity that waits: workflow code does no I/O, so the program cannot run in
the workflow and its requests cannot be awaited there; a long-running heartbeating activity owns the
process, and Updates are Temporal's way to ask a running workflow something and wait for its answer.
The handler decides everything a call needs decided (budgets, the record, the upstream model),
deterministically, so a replay of the history answers alike. Signals would need a second channel
back; querying would record nothing.

Durability. The program is not replayable: after its node is lost (a heartbeat or schedule-to-start
timeout, or the state gone on a restarted worker) the rollout is re-initialised like any replayable
env (gymflow.workflows.rollout_env: a fresh workspace) and the program starts again, ``start``
one higher. Its calls are answered from the record, in order, while each request is the same
(its fingerprint: SHA-256 of the canonical JSON of the chat request it means, messages and
parameters); the first call that differs ends the replay, and from there calls go to the model,
whose turns replace the recorded ones not asked again (`ProgramRun.abandoned_calls`). A completed
call is therefore never sent upstream again; only a call in flight when its node died is. Calls of
a program a restart replaced are refused (the validator), and so is every call after the rollout
decided to stop.

Calls are answered one at a time (a lock): turns are recorded in a definite order, and token data
(each turn's prompt checked against the previous turn's prompt + completion) stays exact.

Workflow code only: deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors
    from gymflow.activities.env_schema import RolloutHandle
    from gymflow.activities.gateway import (
        GatewayActivities,
        GatewayAnswer,
        GatewayCall,
        ModelCallInput,
        ModelCallResult,
    )
    from gymflow.activities.harness import HarnessActivities, RunProgramInput, RunProgramResult
    from gymflow.activities.schema import RolloutInput
    from gymflow.envs.contract import Message, ProgramRun, Task, TerminationReason, Usage
    from gymflow.envs.harness.env import HarnessInfo
    from gymflow.envs.wire.chat import ChatFormatError, parse_assistant_message, read_request
    from gymflow.envs.wire.tokens import TurnTokens
    from gymflow.workflows.activity_calls import describe, error_type, execute
    from gymflow.workflows.rollout_env import ENV_HEARTBEAT, RolloutEnv, Stop

MODEL_HEARTBEAT = timedelta(seconds=10)
PROGRAM_SLACK = timedelta(seconds=60)
"""start_to_close of `run_program` beyond the program's wall time (its stop and the heartbeats)."""


def fingerprint(request: dict[str, Any]) -> str:
    """SHA-256 of a chat request's canonical JSON: same messages and parameters, same fingerprint."""
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class Turn:
    """One answered model call."""

    fingerprint: str
    result: ModelCallResult


class HarnessRun:
    """The program half of one rollout: its starts, its record of model turns, its budgets.

    Args:
        input: The rollout's input (model, limits, retries, task).
        env: The rollout's env half (node, recovery).
        rollout_id: The rollout's id.
    """

    def __init__(self, input: RolloutInput, env: RolloutEnv, rollout_id: str) -> None:
        self._input = input
        self._env = env
        self._rollout_id = rollout_id
        self.record: list[Turn] = []
        """The turns of the program's latest start, in order (what the trajectory holds)."""
        self._pending: list[Turn] = []
        """Turns of an earlier start not yet asked again by the current one (the replay)."""
        self.start = 0
        """The program start whose calls are taken (`GatewayCall.start`)."""
        self.starts = 0
        self.replayed = 0
        self.abandoned = 0
        self.stop: Stop | None = None
        """Why the rollout stops, once decided (a budget, a failed model)."""
        self.ended: RunProgramResult | None = None
        self._info: HarnessInfo | None = None
        self._last_request: dict[str, Any] | None = None
        self._lock = asyncio.Lock()
        self._done = False

    # -- the program ---------------------------------------------------------------------------
    async def run(self, handle: RolloutHandle) -> Stop:
        """Run the program (again after each recovery) until it exits or a budget stops it."""
        info = handle.harness
        assert info is not None
        # The task's own agent timeout (a Harbor task's, counted from the first init) wins over the harness's.
        deadline = self._env.deadline
        wall = (deadline - workflow.now()).total_seconds() if deadline is not None else info.timeout_s
        self._info = info = info.model_copy(update={"timeout_s": max(wall, 1.0)})
        running = asyncio.ensure_future(self._env.on_node(self._run_program))
        try:
            await workflow.wait_condition(
                lambda: running.done() or self.stop is not None,
                timeout=timedelta(seconds=info.timeout_s),
                timeout_summary="program wall time",
            )
        except TimeoutError:
            self._end(TerminationReason.TIME_BUDGET, f"the program ran past its {info.timeout_s:g}s")
        if not running.done():
            running.cancel()  # kills the program (its activity waits for that)
            with contextlib.suppress(asyncio.CancelledError, ActivityError, Stop):
                await running
        else:
            try:
                running.result()
            except Stop as exc:
                self.stop = self.stop or exc
        self._done = True
        return self.stop or Stop(TerminationReason.AGENT_EXIT)

    async def _run_program(self, handle: RolloutHandle) -> RunProgramResult:
        start = self._env.recoveries
        if start != self.start:  # a fresh incarnation: its program replays the record first
            self.start = start
            self._pending = self.record
            self.record = []
        self.starts += 1
        info = self._info
        assert info is not None
        result = await execute(
            HarnessActivities.run_program,
            RunProgramInput(
                env=self._input.env, state_key=handle.state_key, prompt=prompt_text(self._input.task), start=start
            ),
            task_queue=handle.node_queue,
            schedule_to_start_timeout=timedelta(seconds=self._input.retry.node_timeout_s),
            start_to_close_timeout=timedelta(seconds=info.timeout_s) + PROGRAM_SLACK,
            heartbeat_timeout=ENV_HEARTBEAT,
            retry_policy=RetryPolicy(maximum_attempts=1, non_retryable_error_types=[errors.ENV_CONFIG]),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"run {' '.join(info.command)[:120]}" + (f" (start {start + 1})" if start else ""),
        )
        self.ended = result
        return result

    # -- model calls (the update handler) --------------------------------------------------------
    def refusal(self, call: GatewayCall) -> str | None:
        """Why a call is refused before it enters history (the update's validator), or None."""
        if self._done:
            return "the rollout is over: its program has ended"
        if call.start != self.start:
            return f"this program (start {call.start + 1}) was replaced by a restart (start {self.start + 1})"
        return None

    async def answer(self, call: GatewayCall) -> GatewayAnswer:
        """The answer to one call: recorded (a restarted program asking again) or the model's."""
        async with self._lock:
            problem = self.refusal(call) or (f"the rollout is stopping: {self.stop}" if self.stop else None)
            if problem is not None:
                raise ApplicationError(problem, type=errors.CALL_REFUSED, non_retryable=True)
            key = fingerprint(call.request)
            if self._pending and self._pending[0].fingerprint == key:
                turn = self._pending.pop(0)
                self.record.append(turn)
                self.replayed += 1
                self._last_request = call.request
                return GatewayAnswer(completion=turn.result.completion, turn=len(self.record) - 1, replayed=True)
            self.abandoned += len(self._pending)
            self._pending = []
            limits = self._input.limits
            if len(self.record) >= limits.max_turns:
                self._end(TerminationReason.MAX_TURNS, f"the program asked for model call {len(self.record) + 1}")
                raise ApplicationError(
                    f"the rollout's budget of {limits.max_turns} model calls is spent",
                    type=errors.CALL_REFUSED,
                    non_retryable=True,
                )
            result = await self._model_call(call)
            self.record.append(Turn(key, result))
            self._last_request = call.request
            spent = self.usage().completion_tokens
            if limits.max_output_tokens is not None and spent >= limits.max_output_tokens:
                self._end(TerminationReason.OUTPUT_BUDGET, f"{spent} tokens generated")
            workflow.set_current_details(f"model call {len(self.record)} answered")
            return GatewayAnswer(completion=result.completion, turn=len(self.record) - 1)

    async def _model_call(self, call: GatewayCall) -> ModelCallResult:
        config = self._input.model
        local = config.local_activity
        previous = self.record[-1].result.token_prefix if self.record else None
        model = config.model or "model"
        try:
            return await execute(
                GatewayActivities.model_call,
                ModelCallInput(
                    model=config,
                    request=call.request,
                    rollout_id=self._rollout_id,
                    turn=len(self.record),
                    token_prefix=previous,
                ),
                local=local,
                start_to_close_timeout=timedelta(seconds=config.request_timeout_s + 30),
                **({} if local else {"heartbeat_timeout": MODEL_HEARTBEAT}),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=30),
                    maximum_attempts=self._input.retry.model_attempts,
                    non_retryable_error_types=[errors.MODEL_REJECTED, errors.CONTEXT_LENGTH],
                ),
                summary=summary(model, len(self.record), call),
            )
        except ActivityError as exc:
            kind = error_type(exc)
            if kind in (errors.CONTEXT_LENGTH, errors.MODEL_REJECTED):  # the program's to handle, as with any API
                raise ApplicationError(describe(exc), type=kind, non_retryable=True) from None
            self._end(TerminationReason.MODEL_ERROR, describe(exc))
            raise ApplicationError(describe(exc), type=errors.MODEL_ERROR, non_retryable=True) from None

    def _end(self, reason: TerminationReason, message: str) -> None:
        if self.stop is None:
            self.stop = Stop(reason, message)

    # -- the record, for the trajectory ----------------------------------------------------------
    def usage(self) -> Usage:
        prompt = sum(t.result.usage.prompt_tokens for t in self.record)
        completion = sum(t.result.usage.completion_tokens for t in self.record)
        last = self.record[-1].result.usage.prompt_tokens if self.record else 0
        return Usage(prompt_tokens=prompt, completion_tokens=completion, last_prompt_tokens=last)

    def tokens(self) -> list[TurnTokens]:
        """Each recorded turn's token data, numbered by its place in the record."""
        out = []
        for index, turn in enumerate(self.record):
            if turn.result.tokens is not None:
                out.append(turn.result.tokens.model_copy(update={"turn": index}))
        return out

    def messages(self, opening: list[Message]) -> list[Message]:
        """The conversation of the last call and its answer (`opening` when there was none, or it
        cannot be read as a chat)."""
        if self._last_request is None or not self.record:
            return opening
        try:
            request = read_request(self._last_request.get("messages"), self._last_request.get("tools"))
            choice = (self.record[-1].result.completion.get("choices") or [{}])[0]
            fmt = request.tool_format
            reply = parse_assistant_message(choice.get("message") or {}, fmt, id_prefix=f"call_{len(self.record)}")
        except (ChatFormatError, AttributeError, TypeError, ValueError):
            return opening
        return [*request.messages, reply]

    def program(self) -> ProgramRun:
        info = self._info
        ended = self.ended
        stopped = self.stop is not None
        return ProgramRun(
            command=info.command if info else [],
            exit_code=None if stopped or ended is None else ended.exit_code,
            output=ended.output if ended else "",
            starts=self.starts,
            replayed_calls=self.replayed,
            abandoned_calls=self.abandoned + len(self._pending),
        )


def prompt_text(task: Task) -> str:
    """The task's prompt as one text (the last user message of a message prompt)."""
    if isinstance(task.prompt, str):
        return task.prompt
    return next((m.content for m in reversed(task.prompt) if m.role == "user"), "")


def summary(model: str, turn: int, call: GatewayCall) -> str:
    """The Web UI's line for a model call: model, turn, API and the request's size."""
    messages = call.request.get("messages")
    count = len(messages) if isinstance(messages, list) else 0
    tools = call.request.get("tools")
    extra = f", {len(tools)} tools" if isinstance(tools, list) and tools else ""
    return f"{model} call {turn + 1} ({call.api}: {count} messages{extra})"
