"""A rollout's environment as seen from workflow code: init, tool calls, reward, release, recovery.

Shared by `RolloutWorkflow` (the model plays) and `RolloutSessionWorkflow` (a trainer plays), so
both get the same isolation (one env state per rollout incarnation), node pinning (every env
activity after `init_rollout` goes to the node queue of the worker holding the state) and recovery:
when that node is lost (schedule-to-start or heartbeat timeout) or its state is gone
(RolloutNotFound, a dead server), the rollout is re-initialised elsewhere; stateless envs just
continue, replayable envs get their recorded tool calls re-executed and checked first, others end
with a typed infra failure (`Stop`).

The activity calls, their options and their order are exactly those `RolloutWorkflow` always made
(its recorded histories replay), so this module changes nothing a history can see. Workflow code
only: deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors
    from gymflow.activities.env import EnvActivities
    from gymflow.activities.env_schema import (
        CallToolInput,
        ComputeRewardInput,
        EnvResponse,
        EnvResponseInput,
        InitRolloutInput,
        ReleaseInput,
        RolloutHandle,
    )
    from gymflow.activities.schema import MAX_TIMEOUT_S, RetrySettings, RolloutLimits
    from gymflow.activities.turn import named_call, refusal
    from gymflow.envs.contract import EnvPackageRef, Message, Reward, Task, TerminationReason, ToolCall, ToolResult
    from gymflow.workflows.activity_calls import describe, error_type, execute, node_lost, timed_out

T = TypeVar("T")

ADMISSION_WAIT = timedelta(minutes=10)
"""How long an env step may wait on its node for a slot (gymflow.envs.runtime.admission) before it runs: a busy
node queues server starts, sandboxed runs and rewards instead of running them all at once. The
waiting activity heartbeats, so a lost node is still noticed within ENV_HEARTBEAT."""
INIT_TIMEOUT = timedelta(minutes=2) + ADMISSION_WAIT
REWARD_TIMEOUT = timedelta(minutes=10)
RELEASE_TIMEOUT = timedelta(seconds=30)
ENV_HEARTBEAT = timedelta(seconds=10)
NODE_ERRORS = (errors.ENV_CONFIG, errors.ROLLOUT_NOT_FOUND, errors.ENV_ERROR)
"""Env failures no retry on the same node mends: bad config, and state that is gone (recovery's)."""
TOOL_IMAGES_PATCH = "tool-images"
"""Patch id: tool observations carry the images a tool returned inline (`Message.images`)."""
"""Env activities heartbeat every ~3 s while they run (gymflow.activities.env), so the loss of the worker
running one is noticed within this; a tool that is slow but alive keeps its activity open."""


class Stop(Exception):
    """Ends a rollout with a termination reason (and, for infra failures, what went wrong)."""

    def __init__(self, reason: TerminationReason, message: str | None = None) -> None:
        super().__init__(message or reason.value)
        self.reason = reason
        self.message = message


class RolloutEnv:
    """The env half of one rollout: its handle, its successful tool calls, its recoveries.

    Args:
        env: Registered env name or env-file path.
        task: The task being played.
        rollout_id: The rollout's id (state keys are derived from it).
        limits: Tool budgets and timeouts.
        retry: Attempts, node timeout, recoveries.
        plan_2: `RolloutWorkflow`'s ROLLOUT_PLAN_2 patch (init shielded from cancellation, release
            folded into a successful reward); new workflow types always pass True.
    """

    def __init__(
        self,
        *,
        env: str,
        task: Task,
        rollout_id: str,
        limits: RolloutLimits,
        retry: RetrySettings,
        plan_2: bool = True,
        node_queue: str | None = None,
        hold: bool = False,
    ) -> None:
        self.env = env
        self.task = task
        self.rollout_id = rollout_id
        self.limits = limits
        self.retry = retry
        self.plan_2 = plan_2
        self.node_queue = node_queue
        """Where the init must run (`RolloutInput.node_queue`); None: any node of the shared queue."""
        self.hold = hold
        """The state outlives the reward (an agentic judge inspects it): `release` frees it."""
        self.handle: RolloutHandle | None = None
        self.tool_calls = 0
        """Tool calls sent to the env (the budget counts these)."""
        self.budget_hit = False
        """A call was refused because the tool budget was spent."""
        self.recoveries = 0
        self.sandbox: str | None = None
        """The sandbox opt-out any incarnation's env reported (`RolloutHandle.sandbox`), for the trajectory."""
        self.env_package: EnvPackageRef | None = None
        """The env package the first incarnation ran (`RolloutHandle.env_package`), for the trajectory."""
        self.executed: list[tuple[ToolCall, ToolResult]] = []
        """Successful tool calls and their results, in order: what a replay re-runs and checks."""
        self.deadline: datetime | None = None
        """When the agent's time is up (`Task.timeouts.agent_s`, counted from the first init); None: no limit."""

    # -- the task's own time (Task.timeouts) -------------------------------------------------
    def time_up(self) -> bool:
        """Whether the agent's time (the task's agent timeout) has run out."""
        return self.deadline is not None and workflow.now() >= self.deadline

    def _task_seconds(self, name: str) -> float | None:
        timeouts = self.task.timeouts
        value = getattr(timeouts, name) if timeouts is not None else None
        return min(value, MAX_TIMEOUT_S) if value is not None else None

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> RolloutHandle:
        """The first `init_rollout`; the handle is kept (`handle`)."""
        self.handle = await self.init_held(incarnation=0)
        agent_s = self._task_seconds("agent_s")
        if agent_s is not None:
            self.deadline = workflow.now() + timedelta(seconds=agent_s)
        return self.handle

    async def init_held(self, incarnation: int) -> RolloutHandle:
        """`init`, finished even when the rollout is cancelled meanwhile.

        Cancelling the init activity does not undo it: the node may already hold the rollout's
        servers, or finish starting them, and only a handle lets the rollout's `release` free them
        (without one they would live until that worker exits). So the init is shielded from the
        cancellation, awaited to its end, and its handle kept before the cancellation goes on.
        """
        if not self.plan_2:
            return await self.init(incarnation)
        init = asyncio.ensure_future(self.init(incarnation))
        try:
            return await asyncio.shield(init)
        except asyncio.CancelledError:
            with contextlib.suppress(Stop, ApplicationError):  # a failed init holds nothing
                self.handle = await init
            raise

    async def init(self, incarnation: int) -> RolloutHandle:
        try:
            handle = await execute(
                EnvActivities.init_rollout,
                InitRolloutInput(env=self.env, rollout_id=self.rollout_id, incarnation=incarnation, task=self.task),
                **self._init_queue(),
                # A task's setup (an image build) may take many minutes: its own time on top. The init
                # heartbeats meanwhile, so a node lost mid-build is still noticed in seconds.
                start_to_close_timeout=INIT_TIMEOUT + timedelta(seconds=self._task_seconds("setup_s") or 0),
                heartbeat_timeout=ENV_HEARTBEAT,  # a node lost mid-init is noticed in seconds, not minutes
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_attempts=self.retry.env_attempts,
                    non_retryable_error_types=[errors.ENV_CONFIG],
                ),
                summary=f"init {self.env} task {self.task.id}" + (f" (recovery {incarnation})" if incarnation else ""),
            )
        except ActivityError as exc:
            if error_type(exc) == errors.ENV_CONFIG:
                raise ApplicationError(describe(exc), type=errors.INVALID_INPUT, non_retryable=True) from exc
            if error_type(exc) == errors.ENV_UNAVAILABLE:  # every attempt found a node that lacks it
                raise Stop(TerminationReason.ENV_UNAVAILABLE, describe(exc)) from exc
            raise Stop(TerminationReason.ENV_ERROR, describe(exc)) from exc
        self.sandbox = self.sandbox or handle.sandbox
        self.env_package = self.env_package or handle.env_package
        return handle

    def _init_queue(self) -> dict[str, Any]:
        """A pinned rollout's init goes to its node's queue; others to any node of the shared queue."""
        return {"task_queue": self.node_queue} if self.node_queue else {}

    async def release(self) -> None:
        """Free the rollout's state, if it holds any; a failure is logged (the node's reaper frees it)."""
        handle = self.handle
        if handle is None:
            return
        self.handle = None
        try:
            await execute(
                EnvActivities.release_rollout,
                ReleaseInput(env=self.env, state_key=handle.state_key),
                task_queue=handle.node_queue,
                schedule_to_start_timeout=timedelta(seconds=self.retry.node_timeout_s),
                start_to_close_timeout=RELEASE_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=2),
                summary=f"release {self.env}",
            )
        except ActivityError as exc:  # the node's reaper frees what a lost node held
            workflow.logger.warning(
                "release failed", extra={"env": self.env, "state_key": handle.state_key, "error": describe(exc)}
            )

    # -- tools -------------------------------------------------------------------------------
    async def observe(self, call: ToolCall, ran: ToolResult | None = None) -> Message:
        """The observation for one tool call; only well-formed calls of known tools reach the env.

        `ran`: the call's result from a fused turn (gymflow.activities.turn), which decided alike what to
        refuse; without it the call runs here, as its own activity.
        """
        assert self.handle is not None
        result = refusal(call, self.handle.tools, self.tool_calls, self.limits.max_tool_calls)
        if result is not None:
            self.budget_hit = self.budget_hit or (call.parse_error is None and call.name in self.tool_names())
        else:
            self.tool_calls += 1
            result = ran if ran is not None else await self.on_node(lambda handle: self.call_tool(handle, call))
            if not result.is_error:
                self.executed.append((call, result))
        images = [a for a in result.attachments if a.kind == "image" and a.data is not None]
        # Histories recorded before images reached the model replay without them (the budget's sizes).
        if images and not workflow.patched(TOOL_IMAGES_PATCH):
            images = []
        return Message(
            role="tool",
            content=result.text,
            tool_call_id=call.id,
            name=call.name,
            is_error=result.is_error,
            images=images,
        )

    def tool_names(self) -> set[str]:
        assert self.handle is not None
        return {t.name for t in self.handle.tools}

    def tool_timeout_s(self, *, replay: bool) -> float:
        """A call's time limit: the rollout's, or under a task's agent timeout what is left of it (a
        replayed call gets the whole agent time: it ran within it before)."""
        agent_s = self._task_seconds("agent_s")
        if agent_s is None or self.deadline is None:
            return self.limits.tool_timeout_s
        if replay:
            return agent_s
        return max(1.0, (self.deadline - workflow.now()).total_seconds())

    async def call_tool(self, handle: RolloutHandle, call: ToolCall, *, replay: bool = False) -> ToolResult:
        limits = self.limits
        timeout_s = self.tool_timeout_s(replay=replay)
        return await execute(
            EnvActivities.call_tool,
            CallToolInput(
                env=self.env,
                state_key=handle.state_key,
                call=call,
                timeout_s=timeout_s,
                max_output_chars=limits.max_tool_output_chars,
            ),
            task_queue=handle.node_queue,
            schedule_to_start_timeout=timedelta(seconds=self.retry.node_timeout_s),
            start_to_close_timeout=timedelta(seconds=timeout_s + 30) + ADMISSION_WAIT,
            heartbeat_timeout=ENV_HEARTBEAT,
            retry_policy=self.env_retry(),
            summary=("replay " if replay else "") + named_call(call, handle.tools),
        )

    # -- env turns ---------------------------------------------------------------------------
    async def respond(self, messages: list[Message]) -> EnvResponse:
        """The env's answer to the model's final answer (`RolloutHandle.env_turns` envs), on the
        rollout's node (recovering it if the node is lost)."""
        return await self.on_node(lambda handle: self._respond(handle, messages))

    async def _respond(self, handle: RolloutHandle, messages: list[Message]) -> EnvResponse:
        return await execute(
            EnvActivities.env_response,
            EnvResponseInput(env=self.env, state_key=handle.state_key, messages=messages),
            task_queue=handle.node_queue,
            schedule_to_start_timeout=timedelta(seconds=self.retry.node_timeout_s),
            start_to_close_timeout=timedelta(seconds=self.limits.tool_timeout_s + 30) + ADMISSION_WAIT,
            heartbeat_timeout=ENV_HEARTBEAT,
            retry_policy=self.env_retry(),
            summary=f"{self.env} answers",
        )

    # -- reward ------------------------------------------------------------------------------
    async def reward(self, messages: list[Message]) -> Reward:
        """Score the conversation on the rollout's node (recovering it if the node is lost);
        under plan 2 a successful reward also frees the state."""
        return await self.on_node(lambda handle: self._reward(handle, messages))

    async def _reward(self, handle: RolloutHandle, messages: list[Message]) -> Reward:
        reward = await self._compute_reward(handle, messages)
        if self.plan_2 and not self.hold and self.handle is handle:
            self.handle = None  # compute_reward released it
        return reward

    async def _compute_reward(self, handle: RolloutHandle, messages: list[Message]) -> Reward:
        try:
            return await execute(
                EnvActivities.compute_reward,
                ComputeRewardInput(
                    env=self.env,
                    state_key=handle.state_key,
                    messages=messages,
                    task=self.task,
                    release=self.plan_2 and not self.hold,
                ),
                task_queue=handle.node_queue,
                schedule_to_start_timeout=timedelta(seconds=self.retry.node_timeout_s),
                start_to_close_timeout=max(REWARD_TIMEOUT, timedelta(seconds=self._task_seconds("reward_s") or 0)),
                heartbeat_timeout=ENV_HEARTBEAT,
                retry_policy=self.env_retry(),
                summary=f"reward {self.env}" + (" + release" if self.plan_2 and not self.hold else ""),
            )
        except ActivityError as exc:
            if node_lost(exc):
                raise
            raise Stop(TerminationReason.REWARD_ERROR, describe(exc)) from exc

    # -- recovery ----------------------------------------------------------------------------
    async def on_node(self, step: Callable[[RolloutHandle], Awaitable[T]]) -> T:
        """Run an env step on the rollout's node, recovering the rollout if the node is lost."""
        while True:
            assert self.handle is not None
            try:
                return await step(self.handle)
            except ActivityError as exc:
                if not node_lost(exc):
                    raise Stop(TerminationReason.ENV_ERROR, describe(exc)) from exc
                await self._recover(exc)

    async def _recover(self, cause: ActivityError) -> None:
        handle = self.handle
        assert handle is not None
        lost = describe(cause)
        reason = TerminationReason.NODE_LOST if timed_out(cause) else TerminationReason.ENV_ERROR
        if not (handle.stateless or handle.replayable):
            raise Stop(reason, f"{lost}; env {self.env} is neither stateless nor replayable")
        if self.recoveries >= self.retry.max_recoveries:
            raise Stop(reason, f"{lost}; gave up after {self.recoveries} recoveries")
        self.recoveries += 1
        workflow.logger.warning(
            "rollout lost its env; recovering", extra={"env": self.env, "rollout_id": self.rollout_id, "lost": lost}
        )
        if not timed_out(cause):  # the node is alive, only the state is gone: free what is left
            await self.release()
        self.handle = await self.init_held(incarnation=self.recoveries)
        if handle.replayable and not handle.stateless:
            await self._replay()

    async def _replay(self) -> None:
        """Re-run the successful tool calls on the fresh instance; they must give the same results.

        Failed calls are not replayed (a hung or refused call is presumed to have changed nothing).
        A replayed call whose result differs means the env did not rebuild its state: stop, rather
        than train on a trajectory whose observations no longer match the env.
        """
        assert self.handle is not None
        for index, (call, recorded) in enumerate(self.executed):
            try:
                replayed = await self.call_tool(self.handle, call, replay=True)
            except ActivityError as exc:
                raise Stop(TerminationReason.ENV_ERROR, f"replay failed: {describe(exc)}") from exc
            if replayed.text != recorded.text or replayed.is_error:
                raise Stop(
                    TerminationReason.ENV_ERROR,
                    f"replay diverged at tool call {index} ({call.name}): {recorded.text[:80]!r} became "
                    f"{replayed.text[:80]!r}",
                )

    def env_retry(self) -> RetryPolicy:
        return RetryPolicy(
            initial_interval=timedelta(seconds=1),
            maximum_attempts=self.retry.env_attempts,
            non_retryable_error_types=[*NODE_ERRORS, errors.REWARD_ERROR],
        )
