"""The Python SDK: start and await rollouts on a client of gymflow.workers.client (`gymflow.connect`).

client = await gymflow.connect()   # TEMPORAL_* / temporal.toml profile / localhost:7233
result = await gymflow.run_rollout(client, RolloutInput(env="math", task=task))
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import TypedSearchAttributes

from gymflow.activities import names
from gymflow.activities.schema import (
    GroupResult,
    RolloutInput,
    RolloutResult,
    initial_search_attributes,
    rollout_memo,
)
from gymflow.envs.contract import Trajectory
from gymflow.workflows.rollout import RolloutWorkflow


async def with_messages(client: Client, group: GroupResult) -> GroupResult:
    """`group` with the conversations it left out of its result (`messages_omitted`, a group too
    large to return inline) read back from its rollout workflows."""
    if not group.messages_omitted:
        return group

    async def read(trajectory: Trajectory) -> Trajectory:
        handle = client.get_workflow_handle(trajectory.rollout_id, result_type=Trajectory)
        try:
            full = await handle.result()
        except WorkflowFailureError:  # a rollout that failed outright has no conversation
            return trajectory
        return trajectory.model_copy(update={"messages": full.messages, "tokens": full.tokens})

    trajectories = await asyncio.gather(*(read(t) for t in group.trajectories))
    return group.model_copy(update={"trajectories": list(trajectories), "messages_omitted": False})


def rollout_id_for(task_id: str) -> str:
    """A fresh workflow id for a rollout of `task_id`."""
    return f"rollout-{task_id}-{uuid.uuid4().hex[:8]}"


async def start_rollout(
    client: Client,
    input: RolloutInput,
    *,
    task_queue: str = names.TASK_QUEUE,
    workflow_id: str | None = None,
) -> WorkflowHandle[Any, RolloutResult]:
    """Start a RolloutWorkflow; search attributes are set at start so the UI can filter at once."""
    return await client.start_workflow(
        RolloutWorkflow.run,
        input,
        id=workflow_id or rollout_id_for(input.task.id),
        task_queue=task_queue,
        search_attributes=TypedSearchAttributes(initial_search_attributes(input)),
        memo=rollout_memo(input),
        static_summary=f"{input.env} rollout of task {input.task.id}",
    )


async def run_rollout(
    client: Client, input: RolloutInput, *, task_queue: str = names.TASK_QUEUE, workflow_id: str | None = None
) -> RolloutResult:
    """Run one rollout to completion and return its trajectory."""
    handle = await start_rollout(client, input, task_queue=task_queue, workflow_id=workflow_id)
    return await handle.result()


async def run_rollouts(
    client: Client,
    inputs: Iterable[RolloutInput],
    *,
    task_queue: str = names.TASK_QUEUE,
    concurrency: int = 64,
) -> AsyncIterator[RolloutResult]:
    """Run many rollouts with at most `concurrency` in flight; yields results as they finish."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(item: RolloutInput) -> RolloutResult:
        async with semaphore:
            return await run_rollout(client, item, task_queue=task_queue)

    tasks = [asyncio.create_task(one(i)) for i in inputs]
    try:
        for next_done in asyncio.as_completed(tasks):
            yield await next_done
    finally:
        for task in tasks:
            task.cancel()
