"""Batches read back from Temporal by id: what rescoring and resuming start from.

A batch's id is its workflow id (and the `GymflowBatch` of its rollouts). The input of its latest
run holds what gives its tasks back (inline tasks, or a dataset with its options), its samples,
envs and storage destination; its result holds the URIs of its JSONL parts. A batch that did not
finish (its command's worker died with the command, it was cancelled or terminated) has no result,
and some of its trajectories may never have reached a part: its history is then the record. Every
child rollout that completed is there, trajectory and all, in a `ChildWorkflowExecutionCompleted`
event; so is every child still open. `scan_children` reads them run by run (continue-as-new chains
runs; each run drains its children before it continues), and a batch that resumed another draws
the rest from that one (`resume_chain`).

These are client calls: the SDK makes them before it starts anything (a mistyped id is an exit 2
with nothing started), and activities make them with the activity's client
(gymflow.activities.resume, gymflow.activities.rescore).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from gymflow.activities import names
from gymflow.activities.schema import BatchInput, BatchResult
from gymflow.envs.contract import Trajectory, Wire
from gymflow.envs.errors import BatchError

MAX_CHAIN = 64
"""Batches resumed from one another, at most, in one chain (a guard, not a limit anyone meets)."""


class FoundBatch(Wire):
    """A batch as Temporal holds it."""

    batch_id: str
    """Its workflow id (its `GymflowBatch`)."""
    status: str
    """Its execution status, lower case: running, completed, failed, canceled, terminated, timed_out."""
    task_queue: str
    """The queue its workflow runs on."""
    input: BatchInput
    """The input of its latest run (for a rescored batch: its source's, which gives the tasks)."""
    result: BatchResult | None = None
    """Its result, when it completed."""


def child_index(batch_id: str, child_id: str) -> int | None:
    """The rollout index of a batch's child workflow id (`<batch id>/r<index>`), None for another id."""
    match = re.fullmatch(re.escape(batch_id) + r"/r(\d+)", child_id)
    return int(match[1]) if match else None


def rollout_index(trajectory: Trajectory) -> int | None:
    """The index of a batch's rollout from its trajectory's rollout id (`<batch id>/r<index>`)."""
    match = re.search(r"/r(\d+)$", trajectory.rollout_id)
    return int(match[1]) if match else None


async def find_batch(client: Client, batch_id: str, *, completed: bool = False) -> FoundBatch:
    """The batch `batch_id`: its status, its input and (if it completed) its result.

    Args:
        completed: Refuse a batch that has not completed (rescoring needs all of its parts).

    Raises:
        BatchError: No such workflow, or it is not a batch, or (`completed`) it has not completed.
    """
    handle = client.get_workflow_handle(batch_id)
    try:
        described = await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise BatchError(
                f"no batch {batch_id!r} on this Temporal namespace (`gymflow status` and the Web UI list batches)"
            ) from exc
        raise
    kind = described.workflow_type
    status = described.status.name.lower() if described.status else "unknown"
    if kind not in (names.BATCH_WORKFLOW, names.RESCORE_WORKFLOW):
        raise BatchError(f"{batch_id!r} is a {kind}, not a batch ({names.BATCH_WORKFLOW})")
    result: BatchResult | None = None
    if described.status == WorkflowExecutionStatus.COMPLETED:
        result = await client.get_workflow_handle(batch_id, run_id=described.run_id, result_type=BatchResult).result()
    elif completed:
        raise BatchError(
            f"batch {batch_id} has not completed (it is {status}): only a finished batch can be rescored; "
            f"resume it first (`gymflow eval ENV --resume {batch_id}`)"
        )
    if kind == names.RESCORE_WORKFLOW:  # its tasks are its source's
        if result is None or result.rescored_from is None:
            raise BatchError(f"rescored batch {batch_id} has not completed (it is {status})")
        source = await find_batch(client, result.rescored_from)
        return FoundBatch(batch_id=batch_id, status=status, task_queue=described.task_queue, input=source.input,
                          result=result)  # fmt: skip
    first = await _start(client, batch_id, described.run_id)
    (input,) = await client.data_converter.decode(first.input.payloads, [BatchInput])
    return FoundBatch(batch_id=batch_id, status=status, task_queue=described.task_queue, input=input, result=result)


async def _start(client: Client, workflow_id: str, run_id: str) -> Any:
    """The start event's attributes of one run."""
    async for event in client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events(page_size=1):
        return event.workflow_execution_started_event_attributes
    raise BatchError(f"batch {workflow_id} (run {run_id}) has no history")


async def resume_chain(client: Client, batch_id: str) -> list[FoundBatch]:
    """The batch, the batch it resumed, the one that one resumed, ... (each at most once)."""
    chain = [await find_batch(client, batch_id)]
    while (source := chain[-1].input.resumed_from) is not None:
        if len(chain) >= MAX_CHAIN or any(found.batch_id == source for found in chain):
            raise BatchError(f"batch {batch_id}: its chain of resumed batches is too long or loops at {source}")
        chain.append(await find_batch(client, source))
    return chain


async def terminate(client: Client, workflow_id: str, *, reason: str) -> bool:
    """Terminate a workflow if it is still open; False when it had closed already."""
    try:
        await client.get_workflow_handle(workflow_id).terminate(reason=reason)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:  # closed meanwhile (or never started)
            return False
        raise
    return True


OnCompleted = Callable[[int, Trajectory], Awaitable[None]]


async def scan_children(client: Client, batch_id: str, on_completed: OnCompleted) -> list[str]:
    """Call `on_completed(index, trajectory)` for every child rollout of the batch that completed,
    in every run of its workflow (newest first); returns the ids of the children still open.

    Raises:
        BatchError: No such batch.
    """
    try:
        described = await client.get_workflow_handle(batch_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise BatchError(f"no batch {batch_id!r} on this Temporal namespace") from exc
        raise
    open_children: dict[str, None] = {}  # insertion-ordered
    run_id: str | None = described.run_id
    while run_id:
        handle = client.get_workflow_handle(batch_id, run_id=run_id)
        run_id = None
        async for event in handle.fetch_history_events():
            kind = event.WhichOneof("attributes")
            if kind == "workflow_execution_started_event_attributes":
                run_id = event.workflow_execution_started_event_attributes.continued_execution_run_id or None
            elif kind == "child_workflow_execution_started_event_attributes":
                open_children[
                    event.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
                ] = None
            elif kind == "child_workflow_execution_completed_event_attributes":
                attributes = event.child_workflow_execution_completed_event_attributes
                child = attributes.workflow_execution.workflow_id
                open_children.pop(child, None)
                index = child_index(batch_id, child)
                if index is not None:
                    (trajectory,) = await client.data_converter.decode(attributes.result.payloads, [Trajectory])
                    await on_completed(index, trajectory)
            elif kind is not None and kind.startswith("child_workflow_execution_"):  # failed, canceled, ...
                open_children.pop(getattr(event, kind).workflow_execution.workflow_id, None)
    return list(open_children)
