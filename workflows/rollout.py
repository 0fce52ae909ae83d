"""RolloutWorkflow: one agent rollout — model turns, tool calls, reward — as a durable workflow.

Every model turn, tool call and reward is an activity, so a crashed worker or server loses
nothing: the workflow resumes from history and completed calls are never run again. Env
activities after `init_rollout` go to the node queue of the worker holding the rollout's
servers. When that node is lost (schedule-to-start timeout) or the rollout's state is gone
(RolloutNotFound, a dead server), the rollout is re-initialised elsewhere: stateless envs just
continue, replayable envs get their recorded tool calls re-executed first, others end with a
typed infra failure. Bad model output is data: it becomes an error observation, never a crash.

Round trips (bench/: at zero latency each costs the server and worker more CPU than the work it
does). `compute_reward` frees the rollout's state when it succeeds, so a finished rollout needs no
separate `release_rollout`; every failure path still releases in `finally`. With
`ModelConfig.local_activity` (opt-in) model turns are local activities: `generate` needs no node,
so the workflow's own worker runs it and records the reply in the workflow task that schedules the
next tool call — one server round trip per turn instead of two, and the conversation (the
activity's input) never enters history. It is off by default because a local activity holds a
workflow task slot for the whole generation and a worker's graceful shutdown waits for (and the
SDK re-runs) in-flight local turns: fine for turns of a few seconds, wrong for long generations.
Starters (the SDK, parent workflows) set the initial search attributes and memo, so the workflow
upserts only what is missing. All three sit behind the `ROLLOUT_PLAN_2` patch: histories written
before it replay on the old plan.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities import errors
    from activities.env import (
        CallToolInput,
        ComputeRewardInput,
        EnvActivities,
        InitRolloutInput,
        ReleaseInput,
        RolloutHandle,
    )
    from activities.model import GenerateInput, GenerateResult, ModelActivities
    from envs.contract import Message, Reward, TerminationReason, ToolCall, ToolResult, Trajectory, Usage
    from envs.rewards.rubric import Rubric
    from workflows import judging, names
    from workflows.activity_calls import call_summary, describe, error_type, execute, node_lost, timed_out
    from workflows.budget import TrajectoryBudget
    from workflows.judging import JudgeConfig
    from workflows.schema import RolloutInput, RolloutResult, initial_search_attributes


T = TypeVar("T")
ROLLOUT_PLAN_2 = "rollout-plan-2"
"""Patch id: release folded into a successful compute_reward, only the start search attributes and
memo the starter did not set are upserted, model turns as local activities if asked."""
INIT_TIMEOUT = timedelta(minutes=2)
REWARD_TIMEOUT = timedelta(minutes=10)
RELEASE_TIMEOUT = timedelta(seconds=30)
ENV_HEARTBEAT = timedelta(seconds=10)
"""Env activities heartbeat every ~3 s while they run (activities.env), so the loss of the worker
running one is noticed within this; a tool that is slow but alive keeps its activity open."""
MODEL_HEARTBEAT = timedelta(seconds=10)
"""Generations heartbeat every ~3 s once they have run that long (activities.model): quick turns
never send one, and a worker killed mid-generation is noticed within this."""


class _Stop(Exception):
    """Unwinds the agent loop with a termination reason."""

    def __init__(self, reason: TerminationReason, message: str | None = None) -> None:
        super().__init__(message or reason.value)
        self.reason = reason
        self.message = message


@workflow.defn(name=names.ROLLOUT_WORKFLOW)
class RolloutWorkflow:
    def __init__(self) -> None:
        self._messages: list[Message] = []
        self._usage = Usage()
        self._turns = 0
        self._tool_calls = 0
        self._recoveries = 0
        self._executed: list[tuple[ToolCall, ToolResult]] = []
        """Successful tool calls and their results, in order: what a replay re-runs and checks."""
        self._handle: RolloutHandle | None = None
        self._rubric: Rubric | None = None
        self._budget_hit = False
        self._pending_chars = 0
        self._last_completion_tokens = 0
        self._plan_2 = False
        self._budget = TrajectoryBudget(None)

    @workflow.query
    def progress(self) -> dict[str, int]:
        """Turns, tool calls and recoveries so far."""
        return {"turns": self._turns, "tool_calls": self._tool_calls, "recoveries": self._recoveries}

    @workflow.run
    async def run(self, input: RolloutInput) -> RolloutResult:
        self._input = input
        self._rollout_id = input.rollout_id or workflow.info().workflow_id
        self._plan_2 = workflow.patched(ROLLOUT_PLAN_2)
        # Starters that set these already (the SDK, parent workflows) save the history events and
        # the visibility writes; a plain `temporal workflow start` gets them here.
        present = workflow.info().typed_search_attributes
        missing = [
            pair.key.value_set(pair.value)
            for pair in initial_search_attributes(input)
            if not self._plan_2 or present.get(pair.key) != pair.value
        ]
        if missing:
            workflow.upsert_search_attributes(missing)
        if not self._plan_2 or workflow.memo_value("task_id", None, type_hint=str) != input.task.id:
            workflow.upsert_memo({"task_id": input.task.id})
        reward: Reward | None = None
        try:
            try:
                self._handle = await self._init_held(incarnation=0)
                self._rubric = input.judge.rubric if input.judge and input.judge.rubric else self._handle.rubric
                self._messages = [Message(role="system", content=self._handle.system_prompt)]
                self._messages += input.task.opening_messages()
                self._budget = TrajectoryBudget(
                    self._handle.payload_limit_bytes, input.task, self._handle.tools, self._rubric
                )
                if not self._budget.fits(self._messages):
                    raise ApplicationError(
                        f"task {input.task.id!r} leaves no room for a conversation under the "
                        f"{self._handle.payload_limit_bytes}-byte payload limit; set "
                        "GYMFLOW_PAYLOAD_STORAGE_URI for external payload storage",
                        type=errors.INVALID_INPUT,
                        non_retryable=True,
                    )
                reason = await self._agent_loop()
                reward = await self._on_node(self._reward)
            except GeneratorExit:
                # The worker evicted this run from its cache: there is no event loop left to
                # schedule a release on, and the run goes on elsewhere as a replay that releases.
                self._handle = None
                raise
            finally:
                await self._release()  # the judge needs no env state: free the servers first
            if reward is not None and self._rubric is not None:
                reward = await self._judged(reward)
            stop = _Stop(reason)
        except _Stop as exc:
            stop = exc
        except asyncio.CancelledError:
            workflow.upsert_search_attributes([names.SA_STATUS.value_set("cancelled")])
            raise
        return self._finish(stop, reward)

    async def _judged(self, reward: Reward) -> Reward:
        config = self._input.judge or JudgeConfig()
        assert self._rubric is not None
        try:
            verdict = await judging.judge(config, self._rubric, self._input.task, self._messages)
        except ActivityError as exc:
            raise _Stop(TerminationReason.REWARD_ERROR, f"judge failed: {describe(exc)}") from exc
        return judging.combine(reward, verdict, config)

    # -- the agent loop ----------------------------------------------------------------------
    async def _agent_loop(self) -> TerminationReason:
        limits = self._input.limits
        while self._turns < limits.max_turns:
            self._check_context_budget()
            result = await self._generate()
            self._turns += 1
            self._usage = Usage(
                prompt_tokens=self._usage.prompt_tokens + result.usage.prompt_tokens,
                completion_tokens=self._usage.completion_tokens + result.usage.completion_tokens,
                last_prompt_tokens=result.usage.prompt_tokens,
            )
            self._last_completion_tokens = result.usage.completion_tokens
            message, whole = self._budget.admit(result.message)
            self._messages.append(message)
            if not whole:
                return TerminationReason.CONTEXT_BUDGET
            workflow.set_current_details(f"turn {self._turns}: {len(message.tool_calls)} tool call(s)")
            if not message.tool_calls:
                return TerminationReason.FINAL_ANSWER
            self._pending_chars = 0
            for call in message.tool_calls:
                observation, whole = self._budget.admit(await self._observe(call))
                self._pending_chars += len(observation.content)
                self._messages.append(observation)
                if not whole:
                    return TerminationReason.CONTEXT_BUDGET
            if self._budget_hit:
                return TerminationReason.TOOL_BUDGET
            if limits.max_output_tokens is not None and self._usage.completion_tokens >= limits.max_output_tokens:
                return TerminationReason.OUTPUT_BUDGET
        return TerminationReason.MAX_TURNS

    def _check_context_budget(self) -> None:
        budget = self._input.limits.max_context_tokens
        if budget is None or not self._turns:
            return
        # The next prompt is the last one plus what was added since: the reply and observations.
        estimate = self._usage.last_prompt_tokens + self._last_completion_tokens + self._pending_chars // 4
        if estimate + (self._input.model.max_tokens or 0) > budget:
            raise _Stop(TerminationReason.CONTEXT_BUDGET)

    async def _generate(self) -> GenerateResult:
        input = self._input
        assert self._handle is not None
        local = self._plan_2 and input.model.local_activity
        try:
            return await execute(
                ModelActivities.generate,
                GenerateInput(
                    model=input.model,
                    messages=self._messages,
                    tools=self._handle.tools,
                    rollout_id=self._rollout_id,
                    turn=self._turns,
                ),
                local=local,
                start_to_close_timeout=timedelta(seconds=input.model.request_timeout_s + 30),
                # A worker that dies mid-generation is noticed within this, not after request_timeout_s
                # (a local turn is the workflow task's: its timeout notices the dead worker instead).
                **({} if local else {"heartbeat_timeout": MODEL_HEARTBEAT}),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=30),
                    maximum_attempts=input.retry.model_attempts,
                    non_retryable_error_types=[errors.MODEL_REJECTED, errors.CONTEXT_LENGTH],
                ),
                summary=f"{input.model.model or 'model'} turn {self._turns + 1}",
            )
        except ActivityError as exc:
            if error_type(exc) == errors.CONTEXT_LENGTH:
                raise _Stop(TerminationReason.CONTEXT_BUDGET) from exc
            raise _Stop(TerminationReason.MODEL_ERROR, describe(exc)) from exc

    async def _observe(self, call: ToolCall) -> Message:
        """The observation for one tool call; only well-formed calls of known tools reach the env."""
        assert self._handle is not None
        if call.parse_error is not None:
            result = ToolResult(text=f"error: could not parse tool call: {call.parse_error}", is_error=True)
        elif call.name not in {t.name for t in self._handle.tools}:
            known = ", ".join(t.name for t in self._handle.tools)
            result = ToolResult(text=f"error: unknown tool {call.name!r}; available tools: {known}", is_error=True)
        elif self._tool_calls >= self._input.limits.max_tool_calls:
            self._budget_hit = True
            limit = self._input.limits.max_tool_calls
            result = ToolResult(text=f"error: tool call budget exhausted ({limit} calls); not executed", is_error=True)
        else:
            self._tool_calls += 1
            result = await self._on_node(lambda handle: self._call_tool(handle, call))
            if not result.is_error:
                self._executed.append((call, result))
        return Message(role="tool", content=result.text, tool_call_id=call.id, name=call.name, is_error=result.is_error)

    # -- env activities ----------------------------------------------------------------------
    async def _init_held(self, incarnation: int) -> RolloutHandle:
        """`_init`, finished even when the rollout is cancelled meanwhile.

        Cancelling the init activity does not undo it: the node may already hold the rollout's
        servers, or finish starting them, and only a handle lets the `finally` of `run` release them
        (without one they would live until that worker exits). So the init is shielded from the
        cancellation, awaited to its end, and its handle kept before the cancellation goes on.
        """
        if not self._plan_2:
            return await self._init(incarnation)
        init = asyncio.ensure_future(self._init(incarnation))
        try:
            return await asyncio.shield(init)
        except asyncio.CancelledError:
            with contextlib.suppress(_Stop, ApplicationError):  # a failed init holds nothing
                self._handle = await init
            raise

    async def _init(self, incarnation: int) -> RolloutHandle:
        input = self._input
        try:
            return await execute(
                EnvActivities.init_rollout,
                InitRolloutInput(env=input.env, rollout_id=self._rollout_id, incarnation=incarnation, task=input.task),
                start_to_close_timeout=INIT_TIMEOUT,
                heartbeat_timeout=ENV_HEARTBEAT,  # a node lost mid-init is noticed in seconds, not minutes
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_attempts=input.retry.env_attempts,
                    non_retryable_error_types=[errors.ENV_CONFIG],
                ),
                summary=f"init {input.env} task {input.task.id}"
                + (f" (recovery {incarnation})" if incarnation else ""),
            )
        except ActivityError as exc:
            if error_type(exc) == errors.ENV_CONFIG:
                raise ApplicationError(describe(exc), type=errors.INVALID_INPUT, non_retryable=True) from exc
            raise _Stop(TerminationReason.ENV_ERROR, describe(exc)) from exc

    async def _call_tool(self, handle: RolloutHandle, call: ToolCall, *, replay: bool = False) -> ToolResult:
        limits = self._input.limits
        server = next((t.server for t in handle.tools if t.name == call.name), None)
        return await execute(
            EnvActivities.call_tool,
            CallToolInput(
                env=self._input.env,
                state_key=handle.state_key,
                call=call,
                timeout_s=limits.tool_timeout_s,
                max_output_chars=limits.max_tool_output_chars,
            ),
            task_queue=handle.node_queue,
            schedule_to_start_timeout=timedelta(seconds=self._input.retry.node_timeout_s),
            start_to_close_timeout=timedelta(seconds=limits.tool_timeout_s + 30),
            heartbeat_timeout=ENV_HEARTBEAT,
            retry_policy=self._env_retry(),
            summary=("replay " if replay else "") + (f"{server}." if server else "") + call_summary(call),
        )

    async def _reward(self, handle: RolloutHandle) -> Reward:
        reward = await self._compute_reward(handle)
        if self._plan_2 and self._handle is handle:
            self._handle = None  # compute_reward released it
        return reward

    async def _compute_reward(self, handle: RolloutHandle) -> Reward:
        try:
            return await execute(
                EnvActivities.compute_reward,
                ComputeRewardInput(
                    env=self._input.env,
                    state_key=handle.state_key,
                    messages=self._messages,
                    task=self._input.task,
                    release=self._plan_2,
                ),
                task_queue=handle.node_queue,
                schedule_to_start_timeout=timedelta(seconds=self._input.retry.node_timeout_s),
                start_to_close_timeout=REWARD_TIMEOUT,
                heartbeat_timeout=ENV_HEARTBEAT,
                retry_policy=self._env_retry(),
                summary=f"reward {self._input.env}" + (" + release" if self._plan_2 else ""),
            )
        except ActivityError as exc:
            if node_lost(exc):
                raise
            raise _Stop(TerminationReason.REWARD_ERROR, describe(exc)) from exc

    async def _release(self) -> None:
        handle = self._handle
        if handle is None:
            return
        self._handle = None
        try:
            await execute(
                EnvActivities.release_rollout,
                ReleaseInput(env=self._input.env, state_key=handle.state_key),
                task_queue=handle.node_queue,
                schedule_to_start_timeout=timedelta(seconds=self._input.retry.node_timeout_s),
                start_to_close_timeout=RELEASE_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=2),
                summary=f"release {self._input.env}",
            )
        except ActivityError as exc:  # the node's reaper frees what a lost node held
            workflow.logger.warning("release of %s failed: %s", handle.state_key, describe(exc))

    async def _on_node(self, step: Callable[[RolloutHandle], Awaitable[T]]) -> T:
        """Run an env step on the rollout's node, recovering the rollout if the node is lost."""
        while True:
            assert self._handle is not None
            try:
                return await step(self._handle)
            except ActivityError as exc:
                if not node_lost(exc):
                    raise _Stop(TerminationReason.ENV_ERROR, describe(exc)) from exc
                await self._recover(exc)

    async def _recover(self, cause: ActivityError) -> None:
        handle = self._handle
        assert handle is not None
        lost = describe(cause)
        reason = TerminationReason.NODE_LOST if timed_out(cause) else TerminationReason.ENV_ERROR
        if not (handle.stateless or handle.replayable):
            raise _Stop(reason, f"{lost}; env {self._input.env} is neither stateless nor replayable")
        if self._recoveries >= self._input.retry.max_recoveries:
            raise _Stop(reason, f"{lost}; gave up after {self._recoveries} recoveries")
        self._recoveries += 1
        workflow.logger.warning("rollout %s lost its env (%s); recovering", self._rollout_id, lost)
        if not timed_out(cause):  # the node is alive, only the state is gone: free what is left
            await self._release()
        self._handle = await self._init_held(incarnation=self._recoveries)
        if handle.replayable and not handle.stateless:
            await self._replay()

    async def _replay(self) -> None:
        """Re-run the successful tool calls on the fresh instance; they must give the same results.

        Failed calls are not replayed (a hung or refused call is presumed to have changed nothing).
        A replayed call whose result differs means the env did not rebuild its state: stop, rather
        than train on a trajectory whose observations no longer match the env.
        """
        assert self._handle is not None
        for index, (call, recorded) in enumerate(self._executed):
            try:
                replayed = await self._call_tool(self._handle, call, replay=True)
            except ActivityError as exc:
                raise _Stop(TerminationReason.ENV_ERROR, f"replay failed: {describe(exc)}") from exc
            if replayed.text != recorded.text or replayed.is_error:
                raise _Stop(
                    TerminationReason.ENV_ERROR,
                    f"replay diverged at tool call {index} ({call.name}): {recorded.text[:80]!r} became "
                    f"{replayed.text[:80]!r}",
                )

    def _env_retry(self) -> RetryPolicy:
        return RetryPolicy(
            initial_interval=timedelta(seconds=1),
            maximum_attempts=self._input.retry.env_attempts,
            non_retryable_error_types=[
                errors.ENV_CONFIG,
                errors.ROLLOUT_NOT_FOUND,
                errors.ENV_ERROR,
                errors.REWARD_ERROR,
            ],
        )

    def _finish(self, stop: _Stop, reward: Reward | None) -> RolloutResult:
        infra = stop.reason.infra_failed
        workflow.upsert_search_attributes(
            [
                names.SA_STATUS.value_set("infra_failed" if infra else "completed"),
                *([names.SA_REWARD.value_set(reward.total)] if reward is not None and not infra else []),
            ]
        )
        workflow.upsert_memo({"termination": stop.reason.value})
        return Trajectory(
            rollout_id=self._rollout_id,
            task_id=self._input.task.id,
            env=self._input.env,
            model=self._input.model.model,
            messages=self._messages,
            reward=None if infra else reward,
            termination=stop.reason,
            infra_failed=infra,
            error=stop.message if infra else None,
            turns=self._turns,
            tool_calls=self._tool_calls,
            usage=self._usage,
            recoveries=self._recoveries,
        )
