"""How a batch's run went for the worker, read from its workflows' histories.

`batch_health` counts, over every workflow of a batch (the parent and its rollouts): activity
attempts that timed out by heartbeat (the worker stopped heartbeating: a starved event loop or a
lost node), other activity timeouts, activity attempts that were retried (history records a
retried attempt only as the next attempt's number and its `last_failure`, so a heartbeat timeout
that was retried is counted from there), workflow tasks that failed or timed out, and workflow tasks
whose WorkflowTaskStarted -> WorkflowTaskCompleted gap exceeded `slow_s` (the worker held a task
that long: a starved loop or GIL). The load benchmark (`bench.load`) and the slow load test use it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import Client

from gymflow.activities.names import SA_BATCH

SLOW_WORKFLOW_TASK_S = 2.0
COUNTS = (
    "heartbeat_timeouts",
    "other_activity_timeouts",
    "retried_activity_attempts",
    "workflow_task_failures",
    "slow_workflow_tasks",
)


def _zero() -> dict[str, Any]:
    """The counts of a history with nothing wrong in it."""
    return {
        "heartbeat_timeouts": 0,
        "other_activity_timeouts": 0,
        "workflow_task_failures": 0,
        "slow_workflow_tasks": 0,
        "max_workflow_task_s": 0.0,
        "retried_activity_attempts": 0,
        "activity_timeouts_by_type": {},
    }


async def workflow_health(client: Client, workflow_id: str, run_id: str | None, *, slow_s: float) -> dict[str, Any]:
    """The counts of one workflow run's history."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    counts = _zero()
    started_at: float | None = None
    activity_types: dict[int, str] = {}
    for event in history.events:
        kind = event.event_type
        at = event.event_time.ToDatetime().timestamp()
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            activity_types[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started_at = at
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and started_at is not None:
            duration = at - started_at
            counts["max_workflow_task_s"] = max(counts["max_workflow_task_s"], duration)
            counts["slow_workflow_tasks"] += duration > slow_s
            started_at = None
        elif kind in (EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED, EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT):
            counts["workflow_task_failures"] += 1
            started_at = None
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs_started = event.activity_task_started_event_attributes
            counts["retried_activity_attempts"] += max(0, attrs_started.attempt - 1)
            last = attrs_started.last_failure
            if attrs_started.attempt > 1 and last.HasField("timeout_failure_info"):
                name = activity_types.get(attrs_started.scheduled_event_id, "?")
                _count_timeout(counts, name, last.timeout_failure_info.timeout_type)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            attrs = event.activity_task_timed_out_event_attributes
            name = activity_types.get(attrs.scheduled_event_id, "?")
            _count_timeout(counts, name, attrs.failure.timeout_failure_info.timeout_type)
    return counts


def _count_timeout(counts: dict[str, Any], name: str, timeout: int) -> None:
    key = f"{name}:{TimeoutType.Name(timeout).removeprefix('TIMEOUT_TYPE_').lower()}"  # type: ignore[arg-type]
    counts["activity_timeouts_by_type"][key] = counts["activity_timeouts_by_type"].get(key, 0) + 1
    if timeout == TimeoutType.TIMEOUT_TYPE_HEARTBEAT:
        counts["heartbeat_timeouts"] += 1
    else:
        counts["other_activity_timeouts"] += 1


async def batch_health(
    client: Client, batch_id: str, *, parent_id: str | None = None, slow_s: float = SLOW_WORKFLOW_TASK_S
) -> dict[str, Any]:
    """Totals over every run of every workflow of batch `batch_id` (and of `parent_id`, if given)."""
    runs = [(w.id, w.run_id) async for w in client.list_workflows(f'{SA_BATCH.name}="{batch_id}"')]
    if parent_id is not None and all(wid != parent_id for wid, _ in runs):
        runs += [(w.id, w.run_id) async for w in client.list_workflows(f'WorkflowId="{parent_id}"')]
    limit = asyncio.Semaphore(16)

    async def one(workflow_id: str, run_id: str | None) -> dict[str, Any]:
        async with limit:
            return await workflow_health(client, workflow_id, run_id, slow_s=slow_s)

    totals = {"workflows": len(runs), **_zero()}
    for counts in await asyncio.gather(*(one(wid, rid) for wid, rid in runs)):
        for key in COUNTS:
            totals[key] += counts[key]
        totals["max_workflow_task_s"] = round(max(totals["max_workflow_task_s"], counts["max_workflow_task_s"]), 3)
        for key, value in counts["activity_timeouts_by_type"].items():
            totals["activity_timeouts_by_type"][key] = totals["activity_timeouts_by_type"].get(key, 0) + value
    totals["slow_workflow_task_s"] = slow_s
    return totals
