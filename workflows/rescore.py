"""RescoreBatchWorkflow: a finished batch's stored trajectories scored with another reward, as a new batch.

No model is called and no tool runs: each of the source batch's JSONL parts is read, its
trajectories scored with the reward (gymflow.activities.rescore), and written as the new batch's
part of the same number. The new batch is a batch like any other: its id is its workflow id and
its `GymflowBatch`, it has its JSONL parts and its own report (which names its source and the
reward), a `progress` query, and a final `GymflowStatus`. Its memo and its `BatchResult` record the
lineage (`rescored_from`, `reward`). The source batch is only read.

The work is a few activities per part, a window of `window` parts at a time, in the source's order;
the run continues as new after `max_parts_per_run` parts (or when Temporal suggests it), carrying
its counters. A refusal (an unknown or unfinished batch, its storage gone, a reward that does not
load or needs the live rollout) fails the workflow before anything is written, with the error's
own type (a `UserError`'s class name), which the CLI prints as one line.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors, names
    from gymflow.activities.report import BatchReportInput, BatchReportResult, ReportActivities
    from gymflow.activities.rescore import (
        PreparedRescore,
        PrepareRescoreInput,
        RescoreActivities,
        RescoreInput,
        RescorePartInput,
        RescorePartResult,
        TaskSource,
    )
    from gymflow.activities.schema import BatchResult
    from gymflow.workflows import status
    from gymflow.workflows.activity_calls import describe, execute, typed_failure

PREPARE_TIMEOUT = timedelta(minutes=5)
PART_TIMEOUT = timedelta(minutes=30)
PART_HEARTBEAT = timedelta(minutes=2)
REPORT_TIMEOUT = timedelta(minutes=10)
RETRY = RetryPolicy(maximum_attempts=5, non_retryable_error_types=[errors.STORAGE_ERROR])


@workflow.defn(name=names.RESCORE_WORKFLOW)
class RescoreBatchWorkflow:
    def __init__(self) -> None:
        self._input: RescoreInput | None = None

    @workflow.query
    def progress(self) -> dict[str, int | float | None]:
        """Trajectories rescored, infra-failed among them, parts done of all, and the running mean reward."""
        state = self._input.state if self._input else None
        if state is None:
            return {"completed": 0, "infra_failed": 0, "parts": 0, "of_parts": None, "mean_reward": None, "runs": 0}
        source = state.prepared.source.result if state.prepared else None
        return {
            "completed": state.total,
            "infra_failed": state.infra_failed,
            "parts": len(state.parts),
            "of_parts": len(source.parts) if source else None,
            "mean_reward": state.reward_sum / state.scored if state.scored else None,
            "runs": state.runs,
        }

    @workflow.run
    async def run(self, input: RescoreInput) -> BatchResult:
        batch_id = workflow.info().workflow_id
        self._input = input = input.model_copy(deep=True)
        with status.Closing([SearchAttributePair(names.SA_BATCH, batch_id)]):
            state = input.state
            if state.prepared is None:
                state.prepared = await self._prepare(input, batch_id)
            prepared = state.prepared
            source = prepared.source
            parts = source.result.parts if source.result else []  # prepare_rescore found it completed
            tasks = TaskSource.of(source.input)
            done_this_run = 0
            while state.next_part < len(parts):
                if done_this_run >= input.max_parts_per_run or workflow.info().is_continue_as_new_suggested():
                    state.runs += 1
                    workflow.continue_as_new(input)
                chunk = range(state.next_part, min(state.next_part + input.window, len(parts)))
                results: list[RescorePartResult] = await asyncio.gather(
                    *(
                        self._rescore_part(
                            RescorePartInput(
                                batch_id=batch_id,
                                part=i,
                                source_part=parts[i],
                                reward=input.reward,
                                tasks=tasks,
                                destination=source.input.destination,
                            )
                        )
                        for i in chunk
                    )
                )
                for part in results:  # in the source's order: deterministic under replay
                    state.parts.append(part.uri)
                    state.total += part.total
                    state.scored += part.scored
                    state.infra_failed += part.infra_failed
                    state.reward_sum += part.reward_sum
                    state.reward_errors += part.reward_errors
                    state.env_packages += [p for p in part.env_packages if p not in state.env_packages]
                state.next_part = chunk.stop
                done_this_run += len(chunk)
            result = BatchResult(
                batch_id=batch_id,
                total=state.total,
                completed=state.scored,
                infra_failed=state.infra_failed,
                mean_reward=state.reward_sum / state.scored if state.scored else None,
                parts=state.parts,
                runs=state.runs,
                env_packages=state.env_packages,
                rescored_from=input.source,
                reward=prepared.reward,
            )
            return await self._with_report(input, prepared, result)

    async def _prepare(self, input: RescoreInput, batch_id: str) -> PreparedRescore:
        """Find and check the source batch and the reward; record the lineage and the start attributes."""
        try:
            prepared: PreparedRescore = await execute(
                RescoreActivities.prepare_rescore,
                PrepareRescoreInput(source=input.source, reward=input.reward),
                start_to_close_timeout=PREPARE_TIMEOUT,
                retry_policy=RETRY,
                summary=f"find batch {input.source}",
            )
        except ActivityError as exc:
            failure = typed_failure(exc)
            if failure is None:
                raise
            raise failure from exc
        source = prepared.source
        workflow.upsert_memo({"rescored_from": input.source, "reward": prepared.reward})
        model = source.input.options.model.model or "default"
        # The env and model are known now: set them unless the starter did.
        status.Closing(names.start_attributes(source.input.env, model=model, batch=batch_id)).start()
        return prepared

    async def _rescore_part(self, part: RescorePartInput) -> RescorePartResult:
        try:
            return await execute(
                RescoreActivities.rescore_part,
                part,
                start_to_close_timeout=PART_TIMEOUT,
                heartbeat_timeout=PART_HEARTBEAT,
                retry_policy=RETRY,
                summary=f"rescore part {part.part}",
            )
        except ActivityError as exc:
            failure = typed_failure(exc)
            if failure is None:
                raise
            raise failure from exc

    async def _with_report(self, input: RescoreInput, prepared: PreparedRescore, result: BatchResult) -> BatchResult:
        """The result with its report's URI; a report that fails is named, never a failed rescore."""
        source = prepared.source
        label = input.label or f"{source.input.label or source.input.options.model.model or 'default'} rescored"
        try:
            report: BatchReportResult = await execute(
                ReportActivities.render_batch_report,
                BatchReportInput(
                    batch_id=result.batch_id,
                    env=source.input.env,
                    parts=result.parts,
                    destination=source.input.destination,
                    label=label,
                    lineage=f"rescored from {input.source} with reward {prepared.reward}",
                    rollout_batches=[source.batch_id, *filter(None, [source.input.resumed_from])],
                ),
                start_to_close_timeout=REPORT_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[errors.STORAGE_ERROR]),
                summary=f"report of {result.total} rescored rollouts",
            )
        except ActivityError as exc:
            workflow.logger.warning(
                "rescore has no report", extra={"batch_id": result.batch_id, "error": describe(exc)}
            )
            return result.model_copy(update={"report_error": describe(exc)})
        return result.model_copy(update={"report": report.html_uri})
