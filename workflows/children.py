"""A parent workflow's rollouts as child workflows: starting one, telling running ones of a new policy,
cancelling them (workflow code, used by gymflow.workflows.group).

A child that fails outright becomes an infra-failed trajectory (invalid input fails the parent);
children are started with `ParentClosePolicy.REQUEST_CANCEL`, and a cancelled parent asks its
running children to cancel (never terminates them) and waits, bounded, for them to close.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, TypedSearchAttributes
from temporalio.exceptions import ApplicationError, ChildWorkflowError, FailureError
from temporalio.workflow import ChildWorkflowCancellationType, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors, names
    from gymflow.activities.schema import PolicyUpdate, RolloutInput, initial_search_attributes, rollout_memo
    from gymflow.envs.contract import TerminationReason, Trajectory
    from gymflow.workflows.rollout import RolloutWorkflow

CHILD_RETRY = RetryPolicy(maximum_attempts=1)
CHILD_CANCEL_TIMEOUT = timedelta(minutes=2)
"""How long a cancelled parent waits for its children to finish their cancellation (release their
servers) before it closes; the children go on cancelling after that in any case."""


def failed_trajectory(rollout: RolloutInput, rollout_id: str, error: ChildWorkflowError) -> Trajectory:
    """A child that failed outright (not an infra-flagged result) as an infra-failed trajectory."""
    return Trajectory(
        rollout_id=rollout_id,
        task_id=rollout.task.id,
        env=rollout.env,
        model=rollout.model.model,
        messages=[],
        termination=TerminationReason.ENV_ERROR,
        infra_failed=True,
        error=f"rollout workflow failed: {error.cause or error}",
    )


async def run_child(rollout: RolloutInput, child_id: str) -> Trajectory:
    """Run one rollout as a child; invalid input fails the parent, other child failures are data."""
    try:
        return await workflow.execute_child_workflow(
            RolloutWorkflow.run,
            rollout,
            id=child_id,
            retry_policy=CHILD_RETRY,
            search_attributes=TypedSearchAttributes(initial_search_attributes(rollout)),
            memo=rollout_memo(rollout),
            parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            cancellation_type=ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
            static_summary=f"{rollout.env} rollout of task {rollout.task.id}",
        )
    except ChildWorkflowError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type == errors.INVALID_INPUT:
            raise ApplicationError(cause.message, type=errors.INVALID_INPUT, non_retryable=True) from exc
        return failed_trajectory(rollout, child_id, exc)


async def tell(child_id: str, update: PolicyUpdate) -> None:
    """Pass a policy announcement to a running rollout; one that closed meanwhile needs none."""
    with contextlib.suppress(FailureError):
        await workflow.get_external_workflow_handle(child_id).signal(names.POLICY_SIGNAL, update)


async def cancel_children(children: Sequence[asyncio.Task[Any]]) -> None:
    """Ask every running child to cancel, and wait (bounded) until they have closed.

    Cancelling the task that awaits a child sends the child a cancellation request; the task then
    waits until the child has closed (`WAIT_CANCELLATION_COMPLETED`), i.e. has run its own
    cancellation path and released its servers.
    """
    running = [child for child in children if not child.done()]
    for child in running:
        child.cancel()
    if running:
        await workflow.wait(running, timeout=CHILD_CANCEL_TIMEOUT.total_seconds())
