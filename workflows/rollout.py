"""RolloutWorkflow: one agent rollout — model turns, tool calls, reward — as a durable workflow.

Every model turn, tool call and reward is an activity, so a crashed worker or server loses
nothing: the workflow resumes from history and completed calls are never run again. Env
activities after `init_rollout` go to the node queue of the worker holding the rollout's
servers. When that node is lost (schedule-to-start timeout) or the rollout's state is gone
(RolloutNotFound, a dead server), the rollout is re-initialised elsewhere: stateless envs just
continue, replayable envs get their recorded tool calls re-executed first, others end with a
typed infra failure (that env half lives in gymflow.workflows.rollout_env, shared with the trainer-driven
RolloutSessionWorkflow). Bad model output is data: it becomes an error observation, never a crash.

Round trips (docs/benchmarks.md: at zero latency each costs the server and worker more CPU than the work it
does). `compute_reward` frees the rollout's state when it succeeds, so a finished rollout needs no
separate `release_rollout`; every failure path still releases in `finally`. With
`ModelConfig.local_activity` (opt-in) model turns are local activities: `generate` needs no node,
so the workflow's own worker runs it and records the reply in the workflow task that schedules the
next tool call — one server round trip per turn instead of two, and the conversation (the
activity's input) never enters history. It is off by default because a local activity holds a
workflow task slot for the whole generation and a worker's graceful shutdown waits for (and the
SDK re-runs) in-flight local turns: fine for turns of a few seconds, wrong for long generations.
Fused turns (gymflow.activities.turn; the default of stateless envs that set `BaseEnv.fused_turns`, or
`RolloutInput.fuse_turns`): a turn is one `play_turn` activity on the rollout's node — model call,
tool calls, and for a final answer the reward and the release — so a rollout of n tool turns is
n + 2 activities instead of 2n + 3. A retry re-runs the whole turn, hence stateless envs only.
A fused turn sends its node only the messages the node does not hold yet, and after the first turn
neither the model settings, the tools nor the task (gymflow.activities.context_cache); a node that refuses
such a turn as invalid input (a worker older than this code) gets the rollout's turns whole. A fused
turn carries no summary: its calls are decided inside it, so it heads its result with them for the
Web UI (`PlayTurnInput.call_lines`), and a node too old to read that request gets turns without it.
That half of the workflow (what the node holds, the fallbacks) is gymflow.workflows.fused_turns.
An env of several roles (a solver and its critic) has each model turn played by the role whose turn it
is, with that role's model and view of the conversation (gymflow.workflows.role_play).
Starters (the SDK, parent workflows) set the initial search attributes and memo, so the workflow
upserts only what is missing. All three sit behind the `ROLLOUT_PLAN_2` patch: histories written
before it replay on the old plan. Starters that declare the plan in the memo (`names.MEMO_PLAN`) need
no patch marker.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors, names
    from gymflow.activities.env_schema import RolloutHandle
    from gymflow.activities.gateway import MODEL_CALL_UPDATE, GatewayAnswer, GatewayCall
    from gymflow.activities.judge import JudgeConfig
    from gymflow.activities.model import GenerateInput, GenerateResult, ModelActivities, ModelConfig
    from gymflow.activities.schema import (
        ROLLOUT_PLAN,
        PolicyUpdate,
        RolloutInput,
        RolloutResult,
        initial_search_attributes,
    )
    from gymflow.activities.turn import PlayTurnResult
    from gymflow.envs.contract import Message, Reward, TerminationReason, Trajectory, Usage
    from gymflow.envs.wire.rubric import Rubric
    from gymflow.envs.wire.tokens import TokenPrefix, TurnTokens
    from gymflow.workflows import judging, spans, status
    from gymflow.workflows.activity_calls import describe, error_type, execute
    from gymflow.workflows.budget import TrajectoryBudget
    from gymflow.workflows.fused_turns import FusedTurns
    from gymflow.workflows.harness import HarnessRun
    from gymflow.workflows.role_play import RolePlay
    from gymflow.workflows.rollout_env import RolloutEnv
    from gymflow.workflows.rollout_env import Stop as _Stop


ROLLOUT_PLAN_2 = "rollout-plan-2"
"""Patch id: release folded into a successful compute_reward, only the start search attributes and
memo the starter did not set are upserted, model turns as local activities if asked."""
ROLLOUT_TASK_SA = "rollout-task-sa"
"""Patch id: a rollout whose starter did not set GymflowTask upserts it (histories written before the
attribute existed replay without it)."""
MODEL_HEARTBEAT = timedelta(seconds=10)
"""Generations heartbeat every ~3 s once they have run that long (gymflow.activities.model): quick turns
never send one, and a worker killed mid-generation is noticed within this."""


@workflow.defn(name=names.ROLLOUT_WORKFLOW)
class RolloutWorkflow:
    def __init__(self) -> None:
        self._messages: list[Message] = []
        self._usage = Usage()
        self._turns = 0
        self._env: RolloutEnv | None = None
        """Init, tool calls, reward, release and recovery on the rollout's node (gymflow.workflows.rollout_env)."""
        self._rubric: Rubric | None = None
        self._pending_chars = 0
        self._last_completion_tokens = 0
        self._plan_2 = False
        self._budget = TrajectoryBudget(None)
        self._tokens: list[TurnTokens] = []
        self._token_prefix: TokenPrefix | None = None
        self._fused = False
        """Turns are `play_turn` activities on the rollout's node (decided once the env is up)."""
        self._fused_reward: Reward | None = None
        """The reward a fused final turn computed (the rollout's state is then freed)."""
        self._harness: HarnessRun | None = None
        """Set when an agent program plays the rollout (a harness env, gymflow.workflows.harness)."""
        self._model: ModelConfig | None = None
        """The model the next turn calls: the input's, until the trainer announces newer weights."""
        self._policy: PolicyUpdate | None = None
        """The newest policy announcement received (`policy` signal)."""
        self._versions: list[int | None] = []
        """The policy version of every model turn played, in order."""
        self._roles: RolePlay | None = None
        """Who speaks, when the env declares roles (gymflow.workflows.role_play)."""
        self._draining = False

    @workflow.signal(name=names.POLICY_SIGNAL)
    def policy(self, update: PolicyUpdate) -> None:
        """The trainer's new policy version: applied at the next turn boundary (`RolloutInput.policy_mode`)."""
        current = self._policy
        if current is None or (update.version, update.live) > (current.version, current.live):
            self._policy = update

    @workflow.query
    def progress(self) -> dict[str, int]:
        """Turns, tool calls and recoveries so far; the policy version of the next turn (-1: unversioned),
        the newest one announced to it, and whether it waits for announced weights to go live (`drain`)."""
        env = self._env
        model = self._model
        return {
            "turns": self._turns,
            "tool_calls": env.tool_calls if env else 0,
            "recoveries": env.recoveries if env else 0,
            "version": -1 if model is None or model.version is None else model.version,
            "announced": -1 if self._policy is None else self._policy.version,
            "draining": int(self._draining),
        }

    @workflow.run
    async def run(self, input: RolloutInput) -> RolloutResult:
        rollout_id = input.rollout_id or workflow.info().workflow_id
        with spans.rollout(input.env, input.task.id, rollout_id):  # a trace of its own, if the worker traces
            return await self._run(input)

    async def _run(self, input: RolloutInput) -> RolloutResult:
        self._input = input
        self._model = input.model
        if input.policy is not None:
            self.policy(input.policy)
        self._rollout_id = input.rollout_id or workflow.info().workflow_id
        self._fused_turns = FusedTurns(input, self._rollout_id)
        self._plan_2 = self._declared_plan_2() or workflow.patched(ROLLOUT_PLAN_2)
        self._env = env = RolloutEnv(
            env=input.env,
            task=input.task,
            rollout_id=self._rollout_id,
            limits=input.limits,
            retry=input.retry,
            plan_2=self._plan_2,
            node_queue=input.node_queue,
            hold=input.agentic_judge is not None,  # the judge inspects the state before it is freed
        )
        # Starters that set these already (the SDK, parent workflows) save the history events and
        # the visibility writes; a plain `temporal workflow start` gets them here. GymflowStatus is
        # written only when the rollout closes (gymflow.workflows.status). GymflowTask came later: only runs
        # with its patch add it when the starter did not.
        attributes = initial_search_attributes(input)
        if workflow.info().typed_search_attributes.get(names.SA_TASK) is None and not workflow.patched(ROLLOUT_TASK_SA):
            attributes = [pair for pair in attributes if pair.key.name != names.SA_TASK.name]
        self._closing = status.Closing(attributes)
        self._closing.start(only_missing=self._plan_2)
        if not self._plan_2 or workflow.memo_value("task_id", None, type_hint=str) != input.task.id:
            workflow.upsert_memo({"task_id": input.task.id})
        reward: Reward | None = None
        try:
            try:
                handle = await env.start()
                self._open(handle)
                # No patch: the recorded handle decides. Handles recorded before fused turns existed
                # carry no `fused_turns` (False), so those histories replay on the classic plan; nor
                # a `harness`, which only harness envs' handles carry.
                if handle.harness is not None:
                    reason = await self._program(handle)
                else:
                    self._fused = self._wants_fused(handle)
                    reason = await self._agent_loop()
                with spans.span("reward"):
                    reward = self._fused_reward if self._fused_reward is not None else await env.reward(self._messages)
                if reward is not None and input.agentic_judge is not None:
                    reward = await self._agentic(handle, reward)
            except GeneratorExit:
                # The worker evicted this run from its cache: there is no event loop left to
                # schedule a release on, and the run goes on elsewhere as a replay that releases.
                env.handle = None
                raise
            finally:
                await env.release()  # the judge needs no env state: free the servers first
            if reward is not None and self._rubric is not None:
                reward = await self._judged(reward)
            stop = _Stop(reason)
        except _Stop as exc:
            stop = exc
        except BaseException as exc:  # cancelled, or failed (invalid input): the final status
            self._closing.end(exc)
            raise
        result = self._finish(stop, reward)
        if self._harness is not None:  # model calls still being answered finish first
            await workflow.wait_condition(workflow.all_handlers_finished)
        return result

    def _open(self, handle: RolloutHandle) -> None:
        """What the rollout takes from its env's first handle: the opening conversation, the rubric,
        the payload budget and the roles; an input that cannot play fails (InvalidInput)."""
        input = self._input
        self._roles = RolePlay.of(input, handle)
        self._rubric = input.judge.rubric if input.judge and input.judge.rubric else handle.rubric
        self._messages = [Message(role="system", content=handle.system_prompt)]
        self._messages += handle.opening_messages or input.task.opening_messages()
        self._budget = TrajectoryBudget(handle.payload_limit_bytes, input.task, handle.tools, self._rubric)
        if not self._budget.fits(self._messages):
            raise ApplicationError(
                f"task {input.task.id!r} leaves no room for a conversation under the "
                f"{handle.payload_limit_bytes}-byte payload limit; set "
                "GYMFLOW_PAYLOAD_STORAGE_URI for external payload storage",
                type=errors.INVALID_INPUT,
                non_retryable=True,
            )

    # -- harness rollouts: an agent program plays, its model calls arrive as updates -------------
    async def _program(self, handle: RolloutHandle) -> TerminationReason:
        self._harness = harness = HarnessRun(self._input, self._env_steps(), self._rollout_id)
        try:
            stop = await harness.run(handle)
        finally:
            self._messages = harness.messages(self._messages)
            self._turns = len(harness.record)
            self._usage = harness.usage()
            self._tokens = harness.tokens()
        if stop.reason.infra_failed:
            raise stop
        return stop.reason

    @workflow.update(name=MODEL_CALL_UPDATE)
    async def model_call(self, call: GatewayCall) -> GatewayAnswer:
        """One model call of the rollout's agent program (sent by the node's gateway)."""
        if self._harness is None:
            raise ApplicationError("this rollout runs no agent program", type=errors.CALL_REFUSED, non_retryable=True)
        return await self._harness.answer(call)

    @model_call.validator
    def _validate_model_call(self, call: GatewayCall) -> None:
        problem = "this rollout runs no agent program" if self._harness is None else self._harness.refusal(call)
        if problem is not None:
            raise ValueError(problem)

    @staticmethod
    def _declared_plan_2() -> bool:
        """Whether the starter declared plan 2 in the memo (schema.rollout_memo: the SDK, parent
        workflows). Such a rollout runs it without the patch marker and the TemporalChangeVersion
        upsert that comes with one: one event and one visibility write fewer. The memo is in the start
        event, so a replay decides alike. Without it (a plain `temporal workflow start`, histories from
        before) the patch decides, as it always did."""
        plan = workflow.memo_value(names.MEMO_PLAN, None)  # untyped: a stray memo value must not fail the task
        if not (isinstance(plan, int) and plan >= ROLLOUT_PLAN):
            return False
        if workflow.unsafe.is_replaying():
            # A worker older than the memo key ignored it and wrote the marker: it must be consumed
            # again (a marker no `patched` call matches is nondeterminism). Where the first run wrote
            # none, a replayed `patched` finds none and records nothing.
            workflow.patched(ROLLOUT_PLAN_2)
        return True

    async def _agentic(self, handle: RolloutHandle, reward: Reward) -> Reward:
        config = self._input.agentic_judge
        assert config is not None
        try:
            verdict = await judging.agentic_judge(config, self._input.task, self._messages, handle, self._rollout_id)
        except judging.JudgeFailed as exc:
            raise _Stop(TerminationReason.REWARD_ERROR, str(exc)) from exc
        return judging.combine(reward, verdict, config)

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
            if self._env_steps().time_up():  # the task's agent timeout: the reward still runs
                return TerminationReason.TIME_BUDGET
            if self._policy is not None:  # only rollouts a trainer announced weights to
                await self._follow_policy()
            with spans.span("turn", turn=self._turns + 1):
                self._check_context_budget()
                version = self._current_model().version
                turn = await self._play_turn() if self._fused else None
                result = turn.generated if turn else await self._generate()
                self._turns += 1
                self._versions.append(version)
                if self._roles is not None:
                    self._roles.played(result.token_prefix)
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
                self._token_prefix = result.token_prefix
                if result.tokens is not None:
                    if not self._budget.charge(result.tokens):
                        return TerminationReason.CONTEXT_BUDGET
                    self._tokens.append(result.tokens)
                workflow.set_current_details(f"turn {self._turns}: {len(message.tool_calls)} tool call(s)")
                if not message.tool_calls:
                    if turn is not None and turn.reward is not None:
                        self._fused_reward = turn.reward
                        self._env_steps().handle = None  # the fused turn freed the state with the reward
                        return TerminationReason.FINAL_ANSWER
                    if not self._wants_env_turn():
                        return TerminationReason.FINAL_ANSWER
                    reply = await self._env_steps().respond(self._messages)
                    if reply.done:
                        return TerminationReason.FINAL_ANSWER
                    if self._roles is not None:
                        self._roles.pass_to(reply.next_role)
                    self._pending_chars = 0
                    for answer in reply.messages:
                        said, whole = self._budget.admit(answer)
                        self._pending_chars += len(said.content)
                        self._messages.append(said)
                        if not whole:
                            return TerminationReason.CONTEXT_BUDGET
                    continue
                self._pending_chars = 0
                ran = turn.results if turn else []
                for index, call in enumerate(message.tool_calls):
                    done = ran[index] if index < len(ran) else None
                    observation, whole = self._budget.admit(await self._env_steps().observe(call, done))
                    self._pending_chars += len(observation.content)
                    self._messages.append(observation)
                    if not whole:
                        return TerminationReason.CONTEXT_BUDGET
                if self._env_steps().budget_hit:
                    return TerminationReason.TOOL_BUDGET
                if limits.max_output_tokens is not None and self._usage.completion_tokens >= limits.max_output_tokens:
                    return TerminationReason.OUTPUT_BUDGET
        return TerminationReason.MAX_TURNS

    async def _follow_policy(self) -> None:
        """At a turn boundary: wait for announced weights to go live (`drain`), and move to the newest
        live version (the next turn calls it; the turn in flight finished on the weights it started with).
        With roles, only the roles that play the rollout's `model` follow it."""
        model = self._model
        assert model is not None
        mine = -1 if model.version is None else model.version
        pending = self._policy
        if pending is not None and not pending.live and pending.version > mine and self._input.policy_mode == "drain":
            workflow.set_current_details(f"waiting for policy version {pending.version} to go live")
            self._draining = True
            await workflow.wait_condition(
                lambda: self._policy is not None and (self._policy.live or self._policy.version > pending.version)
            )
            self._draining = False
        update = self._policy
        if update is not None and update.live and update.version > mine:
            base = update.model or model
            self._model = base.model_copy(update={"version": update.version})
            self._fused_turns.forget()  # the rollout's node holds the old model settings

    def _current_model(self) -> ModelConfig:
        assert self._model is not None
        return self._roles.model(self._model) if self._roles is not None else self._model

    def _check_context_budget(self) -> None:
        budget = self._input.limits.max_context_tokens
        if budget is None or not self._turns:
            return
        # The next prompt is the last one plus what was added since: the reply and observations.
        estimate = self._usage.last_prompt_tokens + self._last_completion_tokens + self._pending_chars // 4
        if estimate + (self._current_model().max_tokens or 0) > budget:
            raise _Stop(TerminationReason.CONTEXT_BUDGET)

    async def _generate(self) -> GenerateResult:
        input, model = self._input, self._current_model()
        handle = self._env_steps().handle
        assert handle is not None
        local = self._plan_2 and model.local_activity
        try:
            return await execute(
                ModelActivities.generate,
                self._generate_input(handle),
                local=local,
                start_to_close_timeout=timedelta(seconds=model.request_timeout_s + 30),
                # A worker that dies mid-generation is noticed within this, not after request_timeout_s
                # (a local turn is the workflow task's: its timeout notices the dead worker instead).
                **({} if local else {"heartbeat_timeout": MODEL_HEARTBEAT}),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=30),
                    maximum_attempts=input.retry.model_attempts,
                    non_retryable_error_types=[errors.MODEL_REJECTED, errors.CONTEXT_LENGTH],
                ),
                summary=(f"{self._roles.speaker}: " if self._roles else "")
                + f"{model.model or 'model'} turn {self._turns + 1}",
            )
        except ActivityError as exc:
            if error_type(exc) == errors.CONTEXT_LENGTH:
                raise _Stop(TerminationReason.CONTEXT_BUDGET) from exc
            raise _Stop(TerminationReason.MODEL_ERROR, describe(exc)) from exc

    def _wants_fused(self, handle: RolloutHandle) -> bool:
        """Fused turns: asked for by the rollout, or by the env unless the rollout asked for local
        model turns; for a stateless env only, and not for one that answers final answers."""
        asked = self._input.fuse_turns
        if asked is None:
            asked = handle.fused_turns and not (self._plan_2 and self._input.model.local_activity)
        held = self._input.agentic_judge is not None  # a fused reward frees the state the judge reads
        return handle.stateless and asked and not handle.env_turns and not held and not handle.roles

    def _wants_env_turn(self) -> bool:
        """Whether the env answers a final answer (`RolloutHandle.env_turns`; handles recorded before
        it existed say no, so their histories replay as they ran)."""
        handle = self._env_steps().handle
        return handle is not None and (handle.env_turns or bool(handle.roles))

    async def _play_turn(self) -> PlayTurnResult:
        """One fused turn on the rollout's node (recovered like any env step if the node is lost)."""
        env = self._env_steps()

        async def play(handle: RolloutHandle) -> PlayTurnResult:
            return await self._fused_turns.play(
                handle,
                env=env,
                messages=self._messages,
                turn=self._turns,
                token_prefix=self._token_prefix,
                room_bytes=None if self._budget.limit is None else self._budget.limit - self._budget.used,
                whole=lambda: self._generate_input(handle),
            )

        return await env.on_node(play)

    def _generate_input(self, handle: RolloutHandle) -> GenerateInput:
        """The model turn's whole input."""
        return GenerateInput(
            model=self._current_model(),
            messages=self._messages,
            tools=handle.tools,
            rollout_id=self._rollout_id,
            turn=self._turns,
            token_prefix=self._roles.prefix() if self._roles else self._token_prefix,
            speaker=self._roles.speaker if self._roles else None,
        )

    def _env_steps(self) -> RolloutEnv:
        assert self._env is not None
        return self._env

    def _finish(self, stop: _Stop, reward: Reward | None) -> RolloutResult:
        infra = stop.reason.infra_failed
        self._closing.close(
            names.Status.INFRA_FAILED if infra else names.Status.COMPLETED,
            reward=reward.total if reward is not None and not infra else None,
        )
        workflow.upsert_memo({"termination": stop.reason.value})
        outcome = "infra-failed" if infra or reward is None else f"reward {reward.total:.3f}"
        calls = self._env.tool_calls if self._env else 0
        workflow.set_current_details(
            f"{outcome} · {stop.reason.value} · {self._turns} turn(s), {calls} tool call(s)"
            + (f" · {stop.message}" if infra and stop.message else "")
        )
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
            tool_calls=self._env_steps().tool_calls,
            usage=self._usage,
            recoveries=self._env_steps().recoveries,
            sandbox=self._env.sandbox if self._env else None,
            env_package=self._env.env_package if self._env else None,
            tokens=self._tokens,
            program=self._harness.program() if self._harness is not None else None,
            versions=self._versions if any(v is not None for v in self._versions) else [],
            speakers=self._roles.speakers if self._roles else [],
        )
