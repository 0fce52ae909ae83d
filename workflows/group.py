"""Parent workflows: a GRPO group (n samples of one task) and a batch over a dataset.

GroupRolloutWorkflow runs n RolloutWorkflows of the same task as children, then the env's group
reward and GRPO-style advantages. Infra-failed samples are excluded from the statistics and get
no advantage: a trainer must drop them, never treat them as reward 0.

BatchRolloutWorkflow runs a dataset split (or a task list) x samples with a sliding window of at
most `window` children. It keeps its history bounded: trajectories are written to storage as JSONL
parts (only URIs and counters stay in history), and before the history grows large it
drains its window and continues as new, carrying its progress. Tasks are read a page at a time
through an activity, so a dataset never sits whole in history either.

Cancellation reaches every child: a parent that is cancelled asks its running children to cancel
(never terminates them), so each one runs its own cancellation path and releases its servers,
and waits up to `CHILD_CANCEL_TIMEOUT` for them to close before it closes itself. Children are
started with `ParentClosePolicy.REQUEST_CANCEL`, so a parent that is terminated or times out also
gets its children cancelled, not terminated. Both record their final GymflowStatus
(gymflow.workflows.status).
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors, names
    from gymflow.activities.env import EnvActivities
    from gymflow.activities.env_schema import GroupRewardInput
    from gymflow.activities.report import BatchReportInput, BatchReportResult, ReportActivities
    from gymflow.activities.schema import (
        GROUP_INLINE_BYTES,
        BatchInput,
        BatchResult,
        BatchState,
        GroupInput,
        GroupResult,
        PolicyUpdate,
        RolloutInput,
        batch_search_attributes,
        group_search_attributes,
    )
    from gymflow.activities.storage import LoadTasksInput, StorageActivities, WriteJsonlInput
    from gymflow.envs.contract import Reward, Task, TerminationReason, Trajectory, json_bytes
    from gymflow.envs.rewards.group import group_advantages
    from gymflow.envs.rewards.group_judge import GroupJudgement
    from gymflow.workflows import status
    from gymflow.workflows.activity_calls import describe, error_type, execute
    from gymflow.workflows.children import cancel_children, run_child, tell
    from gymflow.workflows.judging import group_judged, judge_group
    from gymflow.workflows.resume import BATCH_RESUME, after_done, carry_over, lineage


BATCH_PART_BYTES = "batch-part-bytes"
"""Patch id: a batch sizes its JSONL parts in bytes, not characters."""
BATCH_REPORT = "batch-report"
"""Patch id: a batch renders its report (gymflow.activities.report) when it ends."""
STORAGE_TIMEOUT = timedelta(minutes=2)
REPORT_TIMEOUT = timedelta(minutes=10)
TASK_PAGE = 256
PARENT_STATUS = "parent-status"
"""Patch id: groups and batches set their start search attributes and a final GymflowStatus, and
cancel their children (and wait for them) when cancelled."""


@workflow.defn(name=names.GROUP_WORKFLOW)
class GroupRolloutWorkflow:
    def __init__(self) -> None:
        self._policy: PolicyUpdate | None = None
        """The trainer's newest policy announcement (`names.POLICY_SIGNAL`), passed to every sample."""
        self._children: dict[str, asyncio.Task[Trajectory]] = {}

    @workflow.signal(name=names.POLICY_SIGNAL)
    async def policy(self, update: PolicyUpdate) -> None:
        """New weights: samples not started yet begin with them, running ones are told (a signal each)."""
        current = self._policy
        if current is not None and (update.version, update.live) <= (current.version, current.live):
            return
        self._policy = update
        running = [child_id for child_id, child in self._children.items() if not child.done()]
        await asyncio.gather(*(tell(child_id, update) for child_id in running))

    @workflow.run
    async def run(self, input: GroupInput) -> GroupResult:
        patched = workflow.patched(PARENT_STATUS)
        with status.Closing(group_search_attributes(input), enabled=patched):
            return await self._run(input, patched)

    async def _run(self, input: GroupInput, patched: bool) -> GroupResult:
        parent = workflow.info().workflow_id
        template = input.rollout
        samples = []
        for i in range(input.n):
            model = template.model
            if model.seed is not None:
                model = model.model_copy(update={"seed": model.seed + i})
            samples.append(template.model_copy(update={"model": model, "rollout_id": None, "policy": self._policy}))
        if patched:
            children = [asyncio.ensure_future(run_child(s, f"{parent}/s{i}")) for i, s in enumerate(samples)]
            self._children = {f"{parent}/s{i}": child for i, child in enumerate(children)}
            try:
                await workflow.wait(children)
            except asyncio.CancelledError:
                await cancel_children(children)
                raise
            trajectories = [child.result() for child in children]
        else:
            trajectories = list(await asyncio.gather(*(run_child(s, f"{parent}/s{i}") for i, s in enumerate(samples))))
        rewards: list[float | None] = [t.reward.total if t.reward else None for t in trajectories]
        valid = [i for i, t in enumerate(trajectories) if t.reward is not None]
        # Conversations too large to carry inline stay in the children's histories.
        inline = sum(json_bytes(t.messages) + json_bytes(t.tokens) for t in trajectories) <= GROUP_INLINE_BYTES
        if input.group_reward and valid:
            extra = await execute(
                EnvActivities.compute_group_reward,
                GroupRewardInput(
                    env=template.env,
                    rollout_ids=[trajectories[i].rollout_id for i in valid],
                    completions=[trajectories[i].messages for i in valid] if inline else None,
                    tasks=[template.task for _ in valid],
                ),
                start_to_close_timeout=timedelta(minutes=10),
                retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[errors.REWARD_ERROR]),
                summary=f"group reward {template.env} x{len(valid)}",
            )
            for i, components in zip(valid, extra, strict=True):
                if components:
                    base = trajectories[i].reward
                    assert base is not None
                    merged = Reward(
                        total=base.total + math.fsum(components.values()),
                        components={**base.components, **{f"group/{k}": v for k, v in components.items()}},
                        info=base.info,
                    )
                    trajectories[i] = trajectories[i].model_copy(update={"reward": merged})
                    rewards[i] = merged.total
        judgement, note = None, ""
        if input.group_judge is not None and len(valid) >= 2:
            judgement, note = await self._judge(input, trajectories, rewards, valid, inline)
        if not inline:
            trajectories = [t.model_copy(update={"messages": [], "tokens": []}) for t in trajectories]
        advantages = group_advantages(rewards, scale_by_std=input.scale_by_std)
        scored = [r for r in rewards if r is not None]
        return GroupResult(
            task_id=template.task.id,
            trajectories=trajectories,
            rewards=rewards,
            advantages=advantages,
            mean_reward=math.fsum(scored) / len(scored) if scored else None,
            infra_failed=len(trajectories) - len(scored),
            messages_omitted=not inline,
            judgement=judgement,
            judge_note=note,
        )

    async def _judge(
        self,
        input: GroupInput,
        trajectories: list[Trajectory],
        rewards: list[float | None],
        valid: list[int],
        inline: bool,
    ) -> tuple[GroupJudgement | None, str]:
        """The group judge's pass: each judged sample's reward gains `group/judge` (in place). A
        judge that fails, or a group too large to show it, leaves the judged samples infra-failed."""
        config = input.group_judge
        assert config is not None
        failure = None if inline else "the group's conversations are too large to judge inline"
        judgement = None
        if failure is None:
            try:
                judgement = await judge_group(config, input.rollout.task, [trajectories[i].messages for i in valid])
            except ActivityError as exc:
                failure = f"group judge failed: {describe(exc)}"
        if failure is not None or judgement is None:
            for i in valid:
                update = {"reward": None, "infra_failed": True, "termination": TerminationReason.REWARD_ERROR}
                trajectories[i] = trajectories[i].model_copy(update={**update, "error": failure})
                rewards[i] = None
            return None, failure or ""
        if config.min_agreement is not None and (judgement.agreement or 0.0) < config.min_agreement:
            agreed = f"{judgement.agreement:.2f}" if judgement.agreement is not None else "-"
            return judgement, f"orders agreed {agreed} < min_agreement {config.min_agreement:g}: not used"
        for i, score in zip(valid, judgement.scores, strict=True):
            base = trajectories[i].reward
            assert base is not None
            trajectories[i] = trajectories[i].model_copy(update={"reward": group_judged(base, score, config)})
            rewards[i] = trajectories[i].reward.total  # type: ignore[union-attr]
        return judgement, ""


@workflow.defn(name=names.BATCH_WORKFLOW)
class BatchRolloutWorkflow:
    def __init__(self) -> None:
        self._state = BatchState()
        self._in_flight = 0

    @workflow.query
    def progress(self) -> dict[str, int | float | None]:
        """Rollouts finished, in flight and infra-failed so far, and the running mean reward."""
        state = self._state
        return {
            "completed": state.finished,
            "in_flight": self._in_flight,
            "infra_failed": state.infra_failed,
            "mean_reward": state.reward_sum / state.scored if state.scored else None,
            "parts": len(self._state.parts),
            "runs": self._state.runs,
        }

    @workflow.run
    async def run(self, input: BatchInput) -> BatchResult:
        self._batch_id = workflow.info().workflow_id
        patched = workflow.patched(PARENT_STATUS)
        with status.Closing(batch_search_attributes(input, self._batch_id), enabled=patched):
            if not input.tasks and input.dataset is None:
                raise ApplicationError(
                    "a batch needs `tasks` or a `dataset`", type=errors.INVALID_INPUT, non_retryable=True
                )
            self._input = input
            self._state = input.state.model_copy(deep=True)
            self._pages: dict[int, list[Task]] = {}
            self._buffer: list[Trajectory] = []
            self._buffer_bytes = 0
            self._part_bytes = workflow.patched(BATCH_PART_BYTES)
            if not patched:
                workflow.upsert_search_attributes(
                    [names.SA_ENV.value_set(input.env), names.SA_BATCH.value_set(self._batch_id)]
                )
            self._running: list[asyncio.Task[Trajectory]] = []
            try:
                if input.resumed_from and self._state.carried is None and workflow.patched(BATCH_RESUME):
                    await carry_over(input, self._batch_id, self._state)
                await self._run_window()
            except asyncio.CancelledError:
                if patched:
                    await cancel_children(self._running)
                raise
            await self._flush()
            if not self._state.exhausted:
                self._state.runs += 1
                workflow.continue_as_new(input.model_copy(update={"state": self._state}))
            if workflow.patched(BATCH_REPORT) and self._state.finished:
                return await self._with_report(self._result())
            return self._result()

    async def _run_window(self) -> None:
        """Keep up to `window` children running until the tasks (or this run's share) are done."""
        input = self._input
        running = self._running
        started_this_run = 0
        while True:
            while (
                len(running) < input.window
                and started_this_run < input.max_children_per_run
                and not workflow.info().is_continue_as_new_suggested()
                and (rollout := await self._next_rollout()) is not None
            ):
                child_id = f"{self._batch_id}/r{self._state.next_index - 1}"
                running.append(asyncio.ensure_future(run_child(rollout, child_id)))
                started_this_run += 1
            self._in_flight = len(running)
            if not running:
                break
            await workflow.wait(running, return_when=asyncio.FIRST_COMPLETED)
            # Split before recording: a flush inside _record awaits, and children finishing
            # meanwhile must stay in `running` to be recorded next round. List order, not set
            # order: deterministic under replay.
            done = [task for task in running if task.done()]
            running[:] = [task for task in running if not task.done()]
            for task in done:
                await self._record(task.result())

    async def _with_report(self, result: BatchResult) -> BatchResult:
        """The result with its report's URI; a report that fails is named, never a failed batch."""
        input = self._input
        try:
            report: BatchReportResult = await execute(
                ReportActivities.render_batch_report,
                BatchReportInput(
                    batch_id=self._batch_id,
                    env=input.env,
                    parts=self._state.parts,
                    destination=input.destination,
                    label=input.label or input.options.model.model or "default",
                    lineage=lineage(input, self._state),
                    rollout_batches=[self._batch_id, input.resumed_from] if input.resumed_from else [],
                ),
                start_to_close_timeout=REPORT_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[errors.STORAGE_ERROR]),
                summary=f"report of {self._state.finished} rollouts",
            )
        except ActivityError as exc:
            workflow.logger.warning("batch has no report", extra={"batch_id": self._batch_id, "error": describe(exc)})
            return result.model_copy(update={"report_error": describe(exc)})
        return result.model_copy(update={"report": report.html_uri})

    async def _next_rollout(self) -> RolloutInput | None:
        """The next rollout to start, or None when the tasks are exhausted."""
        input = self._input
        index = self._state.next_index = after_done(self._state.done, self._state.next_index)
        envs = [input.env, *input.also_envs]
        task_index, rest = divmod(index, input.samples_per_task * len(envs))
        env_index, sample = divmod(rest, input.samples_per_task)
        if input.num_tasks is not None and task_index >= input.num_tasks:
            self._state.exhausted = True
            return None
        task = await self._task(task_index)
        if task is None:
            self._state.exhausted = True
            return None
        self._state.next_index += 1
        options = input.options
        model = options.model
        if model.seed is not None:
            model = model.model_copy(update={"seed": model.seed + sample})
        return options.rollout(envs[env_index], task, batch_id=self._batch_id, model=model)

    async def _task(self, task_index: int) -> Task | None:
        input = self._input
        if input.tasks:
            return input.tasks[task_index] if task_index < len(input.tasks) else None
        page_number, offset = divmod(task_index, TASK_PAGE)
        if page_number not in self._pages:
            try:
                page = await execute(
                    StorageActivities.load_tasks,
                    LoadTasksInput(
                        env=input.env,
                        dataset=input.dataset or "",
                        options=dict(input.dataset_options),
                        offset=page_number * TASK_PAGE,
                        limit=TASK_PAGE,
                    ),
                    start_to_close_timeout=STORAGE_TIMEOUT,
                    retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[errors.ENV_CONFIG]),
                    summary=f"load tasks {page_number * TASK_PAGE}..{(page_number + 1) * TASK_PAGE - 1}",
                )
            except ActivityError as exc:
                if error_type(exc) == errors.ENV_CONFIG:
                    raise ApplicationError(describe(exc), type=errors.INVALID_INPUT, non_retryable=True) from exc
                raise
            self._pages = {page_number: page}
        page = self._pages[page_number]
        return page[offset] if offset < len(page) else None

    async def _record(self, trajectory: Trajectory) -> None:
        state = self._state
        state.finished += 1
        if trajectory.reward is not None:
            state.scored += 1
            state.reward_sum += trajectory.reward.total
        state.infra_failed += trajectory.infra_failed
        if trajectory.env_package is not None and trajectory.env_package not in state.env_packages:
            state.env_packages.append(trajectory.env_package)
        # Bytes, as the converter writes them (characters undercounted non-ASCII text 2-4x).
        size = json_bytes(trajectory) if self._part_bytes else len(trajectory.model_dump_json())
        if self._buffer and self._buffer_bytes + size > self._input.flush_bytes:
            await self._flush()
        self._buffer.append(trajectory)
        self._buffer_bytes += size

    async def _flush(self) -> None:
        if not self._buffer:
            return
        key = f"{self._batch_id}/trajectories/part-{len(self._state.parts):05d}.jsonl"
        uri = await execute(
            StorageActivities.write_jsonl,
            WriteJsonlInput(key=key, trajectories=self._buffer, destination=self._input.destination),
            start_to_close_timeout=STORAGE_TIMEOUT,
            retry_policy=RetryPolicy(maximum_attempts=5),
            summary=f"write {len(self._buffer)} trajectories",
        )
        self._state.parts.append(uri)
        self._buffer = []
        self._buffer_bytes = 0

    def _result(self) -> BatchResult:
        state = self._state
        return BatchResult(
            batch_id=self._batch_id,
            total=state.finished,
            completed=state.scored,
            infra_failed=state.infra_failed,
            mean_reward=state.reward_sum / state.scored if state.scored else None,
            parts=state.parts,
            runs=state.runs,
            env_packages=state.env_packages,
            resumed_from=self._input.resumed_from,
            carried=state.carried or 0,
        )
