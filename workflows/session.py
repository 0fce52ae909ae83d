"""RolloutSessionWorkflow: one episode of an env, driven step by step by a trainer that owns generation.

Trainers such as SkyRL or verl-style agent loops generate with their own engine and call the env
per turn. A session gives them the env as a durable workflow, driven by Updates:

* `reset` -> tools, system prompt, the first observation (the env is initialised when the session
  starts; reset waits for it, and answers the same until the first step);
* `step(assistant message or text)` -> the tool observations, `done`, and when done the reward;
* `close` -> the trajectory (also the workflow's result); closing before `done` ends the episode
  unscored (`cancelled`).

The env half is `gymflow.workflows.rollout_env.RolloutEnv`, the one `RolloutWorkflow` uses: the same
isolation (one env state per rollout incarnation), node pinning (env activities go to the node
queue of the worker holding the state) and recovery (a lost node or dead server is re-initialised
elsewhere and, for replayable envs, the recorded tool calls are re-run and checked), so a worker
killed between two steps costs the next step a recovery, not the episode. Updates are serialised
(one lock), so steps apply in order even when a client retries. A session with no update for
`idle_timeout_s` (and no step running) frees its env and ends with `idle_timeout`; after `done`
the workflow completes at once (a later `close` reads its result).
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors, names
    from gymflow.activities.env_schema import RolloutHandle
    from gymflow.activities.session_schema import (
        ResetResult,
        SessionInput,
        SessionResult,
        StepInput,
        StepResult,
        session_search_attributes,
    )
    from gymflow.envs.contract import Message, Reward, TerminationReason, Trajectory
    from gymflow.workflows import status
    from gymflow.workflows.budget import TrajectoryBudget
    from gymflow.workflows.rollout_env import RolloutEnv, Stop


@workflow.defn(name=names.SESSION_WORKFLOW)
class RolloutSessionWorkflow:
    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._env: RolloutEnv | None = None
        self._handle: RolloutHandle | None = None
        """Set once the env is initialised (the first handle: reset reports it)."""
        self._messages: list[Message] = []
        self._opening: list[Message] = []
        """The first observation (what reset answers)."""
        self._budget = TrajectoryBudget(None)
        self._turns = 0
        self._touched = 0
        """Updates seen; the idle timer restarts whenever it moves."""
        self._busy = 0
        self._reset_done = False
        self._closing = False
        self._stop: Stop | None = None
        """Why the episode ended, once it has."""
        self._reward: Reward | None = None
        self._result: Trajectory | None = None

    @workflow.query
    def progress(self) -> dict[str, int | bool]:
        """Steps, tool calls, recoveries so far, and whether the episode is over."""
        env = self._env
        return {
            "turns": self._turns,
            "tool_calls": env.tool_calls if env else 0,
            "recoveries": env.recoveries if env else 0,
            "done": self._stop is not None,
        }

    @workflow.run
    async def run(self, input: SessionInput) -> SessionResult:
        self._input = input
        self._rollout_id = input.rollout_id or workflow.info().workflow_id
        # The starter (gymflow.workers.sdk.sessions) sets the start attributes; `temporal workflow start` gets
        # them here. GymflowStatus is written once, at close (gymflow.workflows.status).
        self._status = status.Closing(session_search_attributes(input))
        self._status.start()
        if workflow.memo_value("task_id", None, type_hint=str) != input.task.id:
            workflow.upsert_memo({"task_id": input.task.id})
        self._env = env = RolloutEnv(
            env=input.env, task=input.task, rollout_id=self._rollout_id, limits=input.limits, retry=input.retry
        )
        try:
            try:
                await self._start(env)
                await self._serve()
            except GeneratorExit:  # evicted from the worker's cache: the replay elsewhere releases
                env.handle = None
                raise
            finally:
                async with self._lock:  # a step still running finishes first
                    await env.release()
        except Stop as exc:
            self._stop = exc
        except BaseException as exc:  # cancelled, or failed (invalid input): the final status
            self._status.end(exc)
            raise
        result = self._finish()  # before waiting on handlers: `close` waits for it
        await workflow.wait_condition(workflow.all_handlers_finished)
        return result

    async def _start(self, env: RolloutEnv) -> None:
        async with self._lock:
            handle = await env.start()
            if handle.roles:  # a trainer's steps name no role: never play such an env as if it had one
                raise ApplicationError(
                    f"env {self._input.env!r} is played by several roles ({', '.join(handle.roles)}); a session "
                    "plays one policy: run it as a rollout (RolloutInput.roles)",
                    type=errors.INVALID_INPUT,
                    non_retryable=True,
                )
            self._messages = [Message(role="system", content=handle.system_prompt)] if handle.system_prompt else []
            self._messages += self._input.task.opening_messages()
            self._budget = TrajectoryBudget(handle.payload_limit_bytes, self._input.task, handle.tools)
            if not self._budget.fits(self._messages):
                raise ApplicationError(
                    f"task {self._input.task.id!r} leaves no room for a conversation under the "
                    f"{handle.payload_limit_bytes}-byte payload limit; set GYMFLOW_PAYLOAD_STORAGE_URI",
                    type=errors.INVALID_INPUT,
                    non_retryable=True,
                )
            self._opening = list(self._messages)
            self._handle = handle

    async def _serve(self) -> None:
        """Wait for updates until the episode is done or closed, or the session idles out."""
        while self._stop is None and not self._closing:
            seen = self._touched
            try:
                await workflow.wait_condition(
                    lambda seen=seen: self._touched != seen or self._stop is not None or self._closing,  # type: ignore[misc]
                    timeout=self._input.idle_timeout_s,
                    timeout_summary="idle timeout",
                )
            except TimeoutError:
                if not self._busy:
                    self._stop = Stop(TerminationReason.IDLE_TIMEOUT, f"no update for {self._input.idle_timeout_s:g}s")
        if self._stop is None:
            self._stop = Stop(TerminationReason.CANCELLED, "closed before the episode was done")

    # -- updates -------------------------------------------------------------------------------
    @workflow.update
    async def reset(self) -> ResetResult:
        """Wait for the env, then return its tools, system prompt and the first observation."""
        self._touched += 1
        await workflow.wait_condition(lambda: self._handle is not None or self._stop is not None)
        if self._handle is None:
            assert self._stop is not None
            raise ApplicationError(f"the session ended before it started: {self._stop}", type=errors.SESSION_ENDED)
        self._reset_done = True
        return ResetResult(
            session_id=self._rollout_id,
            tools=self._handle.tools,
            system_prompt=self._handle.system_prompt,
            messages=self._opening,
            node_id=self._handle.node_id,
        )

    @reset.validator
    def _validate_reset(self) -> None:
        if self._turns:
            raise ValueError("the episode has started: a session is one episode, start a new session")
        self._validate_open()

    @workflow.update
    async def step(self, input: StepInput) -> StepResult:
        """Apply one assistant turn: run its tool calls, and score the episode if it is over."""
        async with self._lock:
            self._touched += 1
            self._busy += 1
            try:
                if self._stop is not None or self._closing:
                    raise ApplicationError("the episode is over", type=errors.SESSION_ENDED)
                return await self._step(input)
            finally:
                self._busy -= 1
                self._touched += 1

    @step.validator
    def _validate_step(self, input: StepInput) -> None:
        del input
        if not self._reset_done:
            raise ValueError("call reset before the first step")
        self._validate_open()

    @workflow.update
    async def close(self) -> SessionResult:
        """End the session (unscored if the episode is not done) and return its trajectory."""
        self._closing = True
        self._touched += 1
        await workflow.wait_condition(lambda: self._result is not None)
        assert self._result is not None
        return self._result

    def _validate_open(self) -> None:
        if self._stop is not None or self._closing:
            raise ValueError(f"the session is over ({self._stop or 'closing'})")

    # -- the step ------------------------------------------------------------------------------
    async def _step(self, input: StepInput) -> StepResult:
        env = self._env
        assert env is not None
        self._turns += 1
        message, whole = self._budget.admit(input.assistant_message(self._turns - 1))
        self._messages.append(message)
        observations: list[Message] = []
        reason: TerminationReason | None = None
        try:
            if not whole:
                reason = TerminationReason.CONTEXT_BUDGET
            elif not message.tool_calls and not (env.handle is not None and env.handle.env_turns):
                reason = TerminationReason.FINAL_ANSWER
            elif not message.tool_calls:  # the env answers the final answer (BaseEnv.env_turns)
                reply = await env.respond(self._messages)
                if reply.done:
                    reason = TerminationReason.FINAL_ANSWER
                for answer in reply.messages:
                    said, whole = self._budget.admit(answer)
                    observations.append(said)
                    self._messages.append(said)
                    if not whole:
                        reason = TerminationReason.CONTEXT_BUDGET
                        break
                if reason is None and self._turns >= self._input.limits.max_turns:
                    reason = TerminationReason.MAX_TURNS
            else:
                for call in message.tool_calls:
                    observation, whole = self._budget.admit(await env.observe(call))
                    observations.append(observation)
                    self._messages.append(observation)
                    if not whole:
                        reason = TerminationReason.CONTEXT_BUDGET
                        break
                if reason is None and env.budget_hit:
                    reason = TerminationReason.TOOL_BUDGET
                elif reason is None and self._turns >= self._input.limits.max_turns:
                    reason = TerminationReason.MAX_TURNS
            if reason is not None:
                self._reward = await env.reward(self._messages)
                self._stop = Stop(reason)
        except Stop as exc:
            self._stop = exc
        workflow.set_current_details(f"step {self._turns}: {len(observations)} observation(s)")
        stop = self._stop
        return StepResult(
            observations=observations,
            done=stop is not None,
            reward=self._reward if stop is not None and not stop.reason.infra_failed else None,
            termination=stop.reason if stop is not None else None,
            infra_failed=stop is not None and stop.reason.infra_failed,
            error=stop.message if stop is not None and stop.reason.infra_failed else None,
            turn=self._turns,
        )

    def _finish(self) -> Trajectory:
        stop = self._stop
        assert stop is not None and self._env is not None
        infra = stop.reason.infra_failed
        reward = None if infra else self._reward
        self._status.close(
            names.Status.INFRA_FAILED if infra else names.Status.COMPLETED,
            reward=reward.total if reward is not None else None,
        )
        workflow.upsert_memo({"termination": stop.reason.value})
        self._result = Trajectory(
            rollout_id=self._rollout_id,
            task_id=self._input.task.id,
            env=self._input.env,
            model=self._input.model,
            messages=self._messages,
            reward=reward,
            termination=stop.reason,
            infra_failed=infra,
            error=stop.message if infra else None,
            turns=self._turns,
            tool_calls=self._env.tool_calls,
            recoveries=self._env.recoveries,
            sandbox=self._env.sandbox,
            env_package=self._env.env_package,
        )
        return self._result
