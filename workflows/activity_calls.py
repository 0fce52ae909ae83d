"""Workflow-side helpers for activity calls: cancellation, failure classification, summaries.

Pure and deterministic (safe inside the workflow sandbox); shared by every workflow that runs
rollout activities.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError, TimeoutType

with workflow.unsafe.imports_passed_through():
    from activities import errors
    from envs.contract import ToolCall

T = TypeVar("T")


async def execute(method: Callable[..., Awaitable[T]], arg: Any, **options: Any) -> T:
    """Run an activity; a cancelled activity re-raises as the workflow's own cancellation.

    Depending on timing, cancelling the workflow surfaces either as asyncio.CancelledError or as
    an ActivityError caused by CancelledError; the agent loop must see one thing, or a cancelled
    rollout would be recorded as an env failure.
    """
    try:
        return await workflow.execute_activity_method(method, arg, **options)
    except ActivityError as exc:
        if isinstance(exc.cause, CancelledError):
            raise asyncio.CancelledError from exc
        raise


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


def call_summary(call: ToolCall, limit: int = 120) -> str:
    args = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in call.arguments.items())
    text = f"{call.name}({args})"
    return text if len(text) <= limit else text[: limit - 3] + "..."
