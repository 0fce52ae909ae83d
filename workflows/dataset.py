"""DatasetGenerationWorkflow: a corpus, a trace file or an env generator -> a dataset in storage.

Orchestration only (the work is `gymflow.activities.dataset`):

1. `scan_dataset_source`: read the source, reject what is unusable, assign splits by source
   group, write the plan of candidates to storage.
2. A window of `generate_dataset_batch` activities over consecutive slices of the plan (each
   many candidates: generation, guards, too-easy, judge), merged strictly in batch order by
   `merge_dataset_batch` (target, quotas, near-duplicates), until `n` items are accepted or the
   plan is exhausted. Batches still running when the target is reached are cancelled.
3. `finalize_dataset`: splits as JSONL + Parquet, corpus, rejections, manifest.

History holds counters and URIs only. Before it grows large (`max_batches_per_run`, or when the
server suggests it) the workflow drains its window and continues as new with its state. Every
activity's output is keyed by the workflow id and batch index and is deterministic, and model
replies are recorded as they arrive (`gymflow.activities.dataset_calls`), so a crash of any worker
resumes where it stopped: no accepted item lost or duplicated, no completed model call repeated.
A batch that fails for good becomes rejections (``batch/batch_failed``), never a failed run.
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors, names
    from gymflow.activities.dataset import DatasetActivities
    from gymflow.activities.dataset_models import (
        BatchInput,
        BatchSummary,
        FinalizeInput,
        FinalizeResult,
        MergeInput,
        MergeSummary,
        ScanInput,
        ScanResult,
    )
    from gymflow.activities.schema import DatasetInput, DatasetResult, DatasetState
    from gymflow.envs.datagen.filters import quota_caps
    from gymflow.workflows import status
    from gymflow.workflows.activity_calls import describe, error_type, execute

SCAN_TIMEOUT = timedelta(hours=2)
BATCH_TIMEOUT = timedelta(hours=1)
MERGE_TIMEOUT = timedelta(minutes=30)
EXTRA_ATTEMPTS = 5
"""Attempts of a batch beyond `call_attempts`, for infrastructure failures (a worker killed, storage
unreachable): a model call is still tried at most `call_attempts` times."""
EXACT = 1.0
"""The dedup threshold when near-duplicates are let through: identical questions are still dropped."""
STEP_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
    non_retryable_error_types=[errors.INVALID_INPUT],
)


def _add(counts: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    merged = dict(counts)
    for key, value in sorted(more.items()):
        merged[key] = merged.get(key, 0) + value
    return merged


@workflow.defn(name=names.DATASET_WORKFLOW)
class DatasetGenerationWorkflow:
    def __init__(self) -> None:
        self._state = DatasetState()
        self._in_flight = 0
        self._target = 0
        self._plan_size = 0

    @workflow.query
    def progress(self) -> dict[str, Any]:
        """Stage, accepted / target, rejections by reason, batches done and in flight."""
        state = self._state
        return {
            "stage": state.stage,
            "accepted": state.accepted,
            "target": self._target,
            "processed": state.processed,
            "planned": self._plan_size,
            "rejected": sum(state.rejections.values()),
            "rejections": dict(state.rejections),
            "batches_merged": state.merged,
            "batches_in_flight": self._in_flight,
            "calls_made": state.calls_made,
            "calls_reused": state.calls_reused,
            "runs": state.runs,
        }

    @workflow.run
    async def run(self, input: DatasetInput) -> DatasetResult:
        self._input = input
        self._id = workflow.info().workflow_id
        self._state = input.state.model_copy(deep=True)
        self._target = input.n
        with status.Closing(names.start_attributes(input.env_name(), run=self._id)):
            if input.options.overlap_tokens >= input.options.chunk_tokens:
                raise ApplicationError(
                    "options.overlap_tokens: must be smaller than options.chunk_tokens",
                    type=errors.INVALID_INPUT,
                    non_retryable=True,
                )
            result = await self._run()
            if result is None:  # the next run closes (and writes the final status)
                workflow.continue_as_new(self._input.model_copy(update={"state": self._state}))
            return result

    async def _run(self) -> DatasetResult | None:
        input, state = self._input, self._state
        if state.scan is None:
            state.scan = await self._step(
                DatasetActivities.scan_dataset_source,
                ScanInput(workflow_id=self._id, source=input.source, out=input.out, seed=input.seed, n=input.n,
                          options=input.options),
                SCAN_TIMEOUT, f"scan {input.source.kind}:{input.source.location}"[:200],
            )  # fmt: skip
            state.rejections = _add(state.rejections, state.scan.rejections)
        scan = state.scan
        self._plan_size = scan.plan_size
        state.stage = "generating"
        batches = math.ceil(scan.plan_size / input.batch_size)
        running: dict[int, asyncio.Task[BatchSummary | str]] = {}
        generated: dict[int, BatchSummary | str] = {}
        started = 0
        while True:
            while (
                len(running) < input.window
                and state.next_batch < batches
                and state.accepted < input.n
                and started < input.max_batches_per_run
                and not workflow.info().is_continue_as_new_suggested()
            ):
                running[state.next_batch] = asyncio.ensure_future(self._generate(scan, state.next_batch))
                state.next_batch += 1
                started += 1
            self._in_flight = len(running)
            if not running:
                break
            await workflow.wait(list(running.values()), return_when=asyncio.FIRST_COMPLETED)
            for index in sorted(i for i, task in running.items() if task.done()):  # sorted: deterministic
                generated[index] = running.pop(index).result()
            while state.merged in generated and state.accepted < input.n:
                await self._merge(scan, state.merged, generated.pop(state.merged))
            if state.accepted >= input.n:
                for task in running.values():  # the target is met: what they would add is surplus
                    task.cancel()
                await asyncio.gather(*running.values(), return_exceptions=True)
                running.clear()
        self._in_flight = 0
        exhausted = state.merged >= batches
        if state.accepted < input.n and not exhausted:
            state.runs += 1
            return None
        state.stage = "finalizing"
        final: FinalizeResult = await self._step(
            DatasetActivities.finalize_dataset,
            FinalizeInput(
                workflow_id=self._id, out=scan.out, env=input.env_name(), merged=state.merged, source=input.source,
                config=input.model_dump(mode="json", exclude={"state"}), seed=input.seed, target=input.n, scan=scan,
                counts={"candidates": scan.plan_size, "processed": state.processed, "accepted": state.accepted,
                        "rejected": sum(state.rejections.values())},
                rejections=state.rejections, accepted_by_type=state.accepted_by_type,
                created_at=workflow.now().isoformat(), eval_fraction=input.options.eval_fraction,
            ),
            MERGE_TIMEOUT, f"write dataset ({state.accepted} items)",
        )  # fmt: skip
        state.stage = "done"
        return DatasetResult(
            uri=final.uri,
            manifest_uri=final.manifest_uri,
            env=input.env_name(),
            accepted=state.accepted,
            target_met=state.accepted >= input.n,
            target=input.n,
            splits=final.splits,
            rejected=sum(state.rejections.values()),
            rejections=dict(state.rejections),
            calls_made=state.calls_made,
            calls_reused=state.calls_reused,
            runs=state.runs,
        )

    async def _step(self, method: Any, arg: Any, limit: timedelta, summary: str) -> Any:
        """A scan / merge / finalize step; invalid input fails the run, other failures are retried."""
        try:
            return await execute(
                method,
                arg,
                start_to_close_timeout=limit,
                heartbeat_timeout=timedelta(seconds=self._input.options.heartbeat_s),
                retry_policy=STEP_RETRY,
                summary=summary,
            )
        except ActivityError as exc:
            if error_type(exc) == errors.INVALID_INPUT:
                raise ApplicationError(describe(exc), type=errors.INVALID_INPUT, non_retryable=True) from exc
            raise

    async def _generate(self, scan: ScanResult, index: int) -> BatchSummary | str:
        """One batch; its summary, or why it failed for good (its candidates become rejections)."""
        input = self._input
        offset = index * input.batch_size
        try:
            return await execute(
                DatasetActivities.generate_dataset_batch,
                BatchInput(
                    workflow_id=self._id, out=scan.out, kind=input.source.kind, index=index, offset=offset,
                    limit=input.batch_size, plan_uri=scan.plan_uri, chunks_uri=scan.chunks_uri, options=input.options,
                ),
                start_to_close_timeout=BATCH_TIMEOUT,
                heartbeat_timeout=timedelta(seconds=input.options.heartbeat_s),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30),
                    maximum_attempts=input.options.call_attempts + EXTRA_ATTEMPTS,
                    non_retryable_error_types=[errors.INVALID_INPUT],
                ),
                summary=f"batch {index}: candidates {offset}..{min(offset + input.batch_size, scan.plan_size) - 1}",
            )  # fmt: skip
        except ActivityError as exc:
            if error_type(exc) == errors.INVALID_INPUT:
                raise ApplicationError(describe(exc), type=errors.INVALID_INPUT, non_retryable=True) from exc
            return describe(exc)

    async def _merge(self, scan: ScanResult, index: int, generated: BatchSummary | str) -> None:
        input, state = self._input, self._state
        failed = isinstance(generated, str)
        candidates = min(input.batch_size, scan.plan_size - index * input.batch_size)
        summary: MergeSummary = await self._step(
            DatasetActivities.merge_dataset_batch,
            MergeInput(
                workflow_id=self._id, out=scan.out, index=index,
                batch_uri=None if isinstance(generated, str) else generated.uri,
                failed=generated if isinstance(generated, str) else "", failed_candidates=candidates if failed else 0,
                target=input.n, accepted=state.accepted, accepted_by_type=state.accepted_by_type,
                caps=quota_caps(input.options.quotas, input.n) if input.options.applies("quota") else {},
                dedup_threshold=input.options.dedup_threshold if input.options.applies("dedup") else EXACT,
            ),
            MERGE_TIMEOUT, f"merge batch {index}",
        )  # fmt: skip
        state.merged += 1
        state.accepted += summary.accepted
        state.accepted_by_type = _add(state.accepted_by_type, summary.by_type)
        state.processed += summary.candidates
        state.rejections = _add(state.rejections, summary.rejections)
        if isinstance(generated, BatchSummary):
            state.calls_made += generated.calls_made
            state.calls_reused += generated.calls_reused
