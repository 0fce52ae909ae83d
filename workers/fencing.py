"""A node never runs an env step the server has already given up on.

When a node is cut off from its server, the server goes on handing tasks of the node's queue to
the long polls the node opened before the cut (they stay open on the server's side until their
deadline, ~70 s): each such task is recorded as started, then times out (heartbeat or
start-to-close) and is retried, and the rollout moves on without it. If the node's connection
survives the cut (TCP retransmits once the link is back), those responses still arrive, late,
for rollouts that have since moved to other nodes. Running them would serve a moved rollout:
a tool call on a server nobody reads any more, counted twice by anything it touches outside.

So the node's activities check, before they run, how long ago the server started them: an attempt
older than its heartbeat timeout (else its start-to-close timeout), plus `CLOCK_SLACK_S` for the
clocks of node and server, has timed out on the server, and is refused without running. The
server ignores what a timed-out attempt reports, so refusing changes nothing else.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

log = logging.getLogger(__name__)

CLOCK_SLACK_S = 5.0
"""Allowance for the node's clock running ahead of the server's."""
STALE = "StaleTask"
"""ApplicationError type of a refused attempt (reported to a server that no longer waits for it)."""


def overdue_s(info: activity.Info, now: datetime | None = None) -> float | None:
    """Seconds past the point where the server timed this attempt out; None if it may still run."""
    limit = info.heartbeat_timeout or info.start_to_close_timeout
    if info.is_local or limit is None or info.started_time is None:  # a local activity is this worker's own
        return None
    now = now or datetime.now(UTC)
    late = (now - info.started_time).total_seconds() - limit.total_seconds() - CLOCK_SLACK_S
    return late if late > 0 else None


class StaleTaskGuard(Interceptor):
    """Refuses activity attempts that reach this worker after the server has timed them out."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Guard(next)


class _Guard(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        late = overdue_s(info)
        if late is not None:
            log.warning(
                "activity task arrived after the server timed it out; not run",
                extra={"activity": info.activity_type, "workflow_id": info.workflow_id, "late_s": round(late, 1)},
            )
            raise ApplicationError(f"{info.activity_type} arrived {late:.0f} s after it timed out", type=STALE)
        return await self.next.execute_activity(input)
