"""The workflow side of resuming a batch (`BatchInput.resumed_from`, gymflow.activities.resume).

A resuming batch's first run carries the old batch's finished rollouts over (one activity, which
also stops the old batch), counts them as finished, and then starts only the indices that were not
carried over: `after_done` moves the batch's next index past every carried range. A batch that
resumes nothing never calls either, so its commands, and the histories recorded before, are those
of any batch. Pure orchestration: deterministic, no I/O.
"""

from __future__ import annotations

import bisect
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors
    from gymflow.activities.resume import BatchLayout, CarryOverInput, CarryOverResult, ResumeActivities
    from gymflow.activities.schema import BatchInput, BatchState
    from gymflow.workflows.activity_calls import execute, typed_failure

BATCH_RESUME = "batch-resume"
"""Patch id: a batch with `resumed_from` carries the old batch's finished rollouts over and skips them."""
CARRY_TIMEOUT = timedelta(hours=1)
CARRY_HEARTBEAT = timedelta(minutes=2)


async def carry_over(input: BatchInput, batch_id: str, state: BatchState) -> None:
    """Carry `input.resumed_from`'s finished rollouts into `state` (its parts, counters and skipped ranges)."""
    source = input.resumed_from or ""
    try:
        result: CarryOverResult = await execute(
            ResumeActivities.carry_over,
            CarryOverInput(
                batch_id=batch_id,
                source=source,
                layout=BatchLayout.of(input),
                destination=input.destination,
                flush_bytes=input.flush_bytes,
            ),
            start_to_close_timeout=CARRY_TIMEOUT,
            heartbeat_timeout=CARRY_HEARTBEAT,
            retry_policy=RetryPolicy(maximum_attempts=5, non_retryable_error_types=[errors.STORAGE_ERROR]),
            summary=f"carry over the finished rollouts of {source}",
        )
    except ActivityError as exc:
        failure = typed_failure(exc)
        if failure is None:
            raise
        raise failure from exc
    state.parts += result.parts
    state.finished += result.carried
    state.scored += result.carried
    state.reward_sum += result.reward_sum
    state.env_packages += [p for p in result.env_packages if p not in state.env_packages]
    state.done = result.done
    state.carried = result.carried
    if result.terminated:
        workflow.logger.info("took the old batch over", extra={"source": source, "terminated": len(result.terminated)})


def after_done(done: list[tuple[int, int]], index: int) -> int:
    """`index`, or the end of the carried range [start, end) it falls in (`done` sorted and disjoint)."""
    position = bisect.bisect_right(done, index, key=lambda span: span[0]) - 1
    if position >= 0 and done[position][0] <= index < done[position][1]:
        return done[position][1]
    return index


def lineage(input: BatchInput, state: BatchState) -> str | None:
    """What a resumed batch's report says of where its rollouts come from (None for another batch)."""
    if input.resumed_from is None:
        return None
    return f"resumes {input.resumed_from} ({state.carried or 0} finished rollouts carried over)"
