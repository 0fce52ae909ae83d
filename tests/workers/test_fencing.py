"""An activity attempt that reaches a node after the server timed it out is not run (gymflow.workers.fencing)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio import activity

from gymflow.workers.fencing import CLOCK_SLACK_S, overdue_s

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def info(
    *, started_s_ago: float, heartbeat_s: float | None = 10, start_to_close_s: float = 300, local: bool = False
) -> activity.Info:
    return activity.Info(
        activity_id="1", activity_type="call_tool", attempt=1, current_attempt_scheduled_time=NOW,
        heartbeat_details=[], heartbeat_timeout=timedelta(seconds=heartbeat_s) if heartbeat_s else None,
        is_local=local, namespace="default", schedule_to_close_timeout=None, scheduled_time=NOW,
        start_to_close_timeout=timedelta(seconds=start_to_close_s), started_time=NOW - timedelta(seconds=started_s_ago),
        task_queue="q@n", task_token=b"t", workflow_id="w", workflow_namespace="default", workflow_run_id="r",
        workflow_type="RolloutWorkflow", priority=None, retry_policy=None, activity_run_id=None,  # type: ignore[arg-type]
    )  # fmt: skip


def test_an_attempt_past_its_heartbeat_timeout_is_overdue() -> None:
    assert overdue_s(info(started_s_ago=0.2), NOW) is None  # the normal case: picked up at once
    assert overdue_s(info(started_s_ago=10 + CLOCK_SLACK_S - 1), NOW) is None  # within the clocks' slack
    late = overdue_s(info(started_s_ago=70), NOW)  # a long poll answered across a healed partition
    assert late is not None and late == 70 - 10 - CLOCK_SLACK_S


def test_without_a_heartbeat_timeout_the_start_to_close_one_counts_and_local_attempts_never() -> None:
    assert overdue_s(info(started_s_ago=70, heartbeat_s=None), NOW) is None
    assert overdue_s(info(started_s_ago=400, heartbeat_s=None), NOW) is not None
    assert overdue_s(info(started_s_ago=400, local=True), NOW) is None
