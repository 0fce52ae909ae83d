"""A trainer's reports survive a server that cannot take them yet, and fail fast on a permanent error.

Seen under load (a 2-core box at load 25): the run's workflow task failed and was being retried when
a report arrived, the server answered "Workflow Task in failed state", and the reference trainer
died of it. Reports carry an update id, so sending one again is safe.
"""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from gymflow.workers.sdk.trainer import TrainerSession


class Handle:
    """A workflow handle whose updates fail with the given errors first."""

    def __init__(self, *errors: RPCError) -> None:
        self.errors = list(errors)
        self.ids: list[str] = []

    async def execute_update(self, update: Any, arg: Any, *, id: str) -> dict[str, Any]:
        self.ids.append(id)
        if self.errors:
            raise self.errors.pop(0)
        return {"applied": id}


def session(handle: Handle) -> TrainerSession:
    session = TrainerSession.__new__(TrainerSession)
    session.handle = handle  # type: ignore[assignment]
    session.retry_delay_s = 0.0
    return session


async def test_a_report_is_sent_again_with_its_id_until_the_server_takes_it() -> None:
    handle = Handle(
        RPCError("Unable to perform workflow execution update due to Workflow Task in failed state.",
                 RPCStatusCode.FAILED_PRECONDITION, b""),
        RPCError("context deadline exceeded", RPCStatusCode.UNAVAILABLE, b""),
    )  # fmt: skip
    assert await session(handle).report(3, {"reward": 0.5}) == {"applied": "report-3"}
    assert handle.ids == ["report-3"] * 3


async def test_a_permanent_error_is_raised_at_once() -> None:
    handle = Handle(RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b""))
    with pytest.raises(RPCError, match="not found"):
        await session(handle).report(1)
    assert handle.ids == ["report-1"]
