"""A scan of the suite's server for search attributes that lie about how a workflow ended.

At the end of the session (tests/conftest.py), across every workflow the suite ran:

* no closed workflow carries `GymflowStatus="running"` (nothing in gymflow writes it any more,
  see gymflow.workflows.status; a workflow that did would keep it after it closed);
* every gymflow workflow that closed by its own code (Completed, Canceled, Failed) carries a
  final `GymflowStatus` and its `GymflowEnv`. The one allowed exception is a workflow whose input
  could not be decoded: it fails with InvalidInput before any gymflow code runs, so its history
  records no command at all (not even the patch marker every gymflow workflow records first).

Terminated and timed-out workflows carry no status on purpose: `ExecutionStatus` is theirs.
Candidates come from visibility (eventually consistent) and are confirmed with DescribeWorkflow.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from gymflow.activities import names

SELF_TEST_NAMESPACE = "gymflow-status-scan-test"
"""The session's dev server also hosts this namespace, where the scan's own test plants a stale
status the session-wide scan (of the default namespace) must not see."""
GYMFLOW_TYPES = (
    names.ROLLOUT_WORKFLOW,
    names.GROUP_WORKFLOW,
    names.BATCH_WORKFLOW,
    names.DATASET_WORKFLOW,
    names.TRAINING_WORKFLOW,
    names.SESSION_WORKFLOW,
    names.RESCORE_WORKFLOW,
)

CLOSED_BY_CODE = (
    WorkflowExecutionStatus.COMPLETED,
    WorkflowExecutionStatus.CANCELED,
    WorkflowExecutionStatus.FAILED,
)


@dataclass
class StatusReport:
    """What the scan checked and what it found wrong."""

    closed: int = 0
    problems: list[str] = field(default_factory=list)


async def _ran_no_code(client: Client, workflow_id: str, run_id: str | None) -> bool:
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    commands = {
        EventType.EVENT_TYPE_MARKER_RECORDED,
        EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
        EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
        EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
    }
    return not any(e.event_type in commands for e in history.events)


async def scan_statuses(client: Client) -> StatusReport:
    """Check the search attributes of every closed gymflow workflow on the server."""
    report = StatusReport()
    types = ", ".join(f'"{t}"' for t in GYMFLOW_TYPES)
    closed = f'WorkflowType IN ({types}) AND ExecutionStatus IN ("Completed", "Canceled", "Failed")'
    report.closed = (await client.count_workflows(closed)).count
    queries = ['GymflowStatus = "running"', f"{closed} AND (GymflowStatus IS NULL OR GymflowEnv IS NULL)"]
    candidates = {(w.id, w.run_id) for query in queries async for w in client.list_workflows(query)}
    semaphore = asyncio.Semaphore(16)

    async def confirm(workflow_id: str, run_id: str | None) -> None:
        async with semaphore:
            try:
                described = await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    return  # deleted since the list
                raise
            attrs = described.typed_search_attributes
            state, env = attrs.get(names.SA_STATUS), attrs.get(names.SA_ENV)
            if state == "running" and described.status != WorkflowExecutionStatus.RUNNING:
                report.problems.append(f"{workflow_id}: GymflowStatus='running' while {described.status}")
                return
            if described.status not in CLOSED_BY_CODE or (state is not None and env is not None):
                return  # visibility was behind
            if described.status == WorkflowExecutionStatus.FAILED and await _ran_no_code(client, workflow_id, run_id):
                return  # its input could not be decoded: no gymflow code ran
            report.problems.append(
                f"{workflow_id}: closed {described.status} with GymflowStatus={state!r}, GymflowEnv={env!r}"
            )

    await asyncio.gather(*(confirm(w, r) for w, r in sorted(candidates, key=str)))
    return report
