"""Workflow-side helpers for activity calls: cancellation and failure classification.

Pure and deterministic (safe inside the workflow sandbox); shared by every workflow that runs
rollout activities.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    FailureError,
    TimeoutError,
    TimeoutType,
)

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors

T = TypeVar("T")


async def execute(method: Callable[..., Awaitable[T]], arg: Any, *, local: bool = False, **options: Any) -> T:
    """Run an activity (a local one with `local`); every failure is an ActivityError, and a
    cancelled activity re-raises as the workflow's own cancellation.

    Depending on timing, cancelling the workflow surfaces either as asyncio.CancelledError or as
    an ActivityError caused by CancelledError; the agent loop must see one thing, or a cancelled
    rollout would be recorded as an env failure. A local activity fails with its own error
    (ApplicationError, TimeoutError, CancelledError) instead of an ActivityError around it; it is
    wrapped here, so callers classify both kinds alike.
    """
    run = workflow.execute_local_activity_method if local else workflow.execute_activity_method
    try:
        return await run(method, arg, **options)
    except ActivityError as exc:
        if isinstance(exc.cause, CancelledError):
            raise asyncio.CancelledError from exc
        raise
    except FailureError as exc:
        if not local or isinstance(exc, ActivityError):
            raise
        if isinstance(exc, CancelledError):
            raise asyncio.CancelledError from exc
        # The SDK keeps an activity's defined name in a private record; the local activities run
        # here (the model turn, `generate`) are named after their methods.
        name = getattr(method, "__name__", "")
        raise ActivityError(
            f"local activity {name} failed",
            scheduled_event_id=0,
            started_event_id=0,
            identity="",
            activity_type=name,
            activity_id="",
            retry_state=None,
        ) from exc


def error_type(exc: ActivityError) -> str | None:
    cause = exc.cause
    return cause.type if isinstance(cause, ApplicationError) else None


def timed_out(exc: ActivityError) -> bool:
    cause = exc.cause
    return isinstance(cause, TimeoutError) and cause.type in {TimeoutType.SCHEDULE_TO_START, TimeoutType.HEARTBEAT}


def node_lost(exc: ActivityError) -> bool:
    """The rollout's env state is unreachable: its node is gone, or its state/server died."""
    return timed_out(exc) or error_type(exc) in {errors.ROLLOUT_NOT_FOUND, errors.ENV_ERROR}


def describe(exc: ActivityError) -> str:
    """`activity: root cause` for the trajectory's error field."""
    cause: BaseException = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    detail = cause.message if isinstance(cause, ApplicationError | TimeoutError) else str(cause)
    if isinstance(cause, TimeoutError) and cause.type is not None:
        detail = f"{cause.type.name.lower()} timeout"
    return f"{exc.activity_type}: {detail}"


def typed_failure(exc: ActivityError) -> ApplicationError | None:
    """The workflow's own failure for an activity's typed one (a refusal the user fixes: an unknown batch,
    a reward that cannot rescore), in its words and type, which the CLI prints as one line; None for an
    untyped failure (a timeout), which the caller re-raises as it is."""
    cause = exc.cause
    if isinstance(cause, ApplicationError) and cause.type:
        return ApplicationError(cause.message, type=cause.type, non_retryable=True)
    return None
