"""Heartbeats while an activity awaits a call: a dead worker is noticed within the heartbeat timeout,
while a slow but live call keeps its activity open (a hung tool told apart from a slow one).

The call is awaited in the activity's own task, and a timer on the event loop heartbeats beside it:
no task per call, no wake-ups of the awaiting task. Each model turn and tool call of a rollout goes
through here, so what this costs per call is paid on every step of every rollout; the task-and-wait
form cost measurably more CPU (docs/benchmarks.md). Cancelling the activity cancels the awaited
call with it. Outside an activity (an env driven directly) there is nothing to heartbeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")


async def heartbeating(awaitable: Awaitable[T], interval_s: float | None) -> T:
    """Await `awaitable`, heartbeating every `interval_s` seconds until it finishes (None: just await)."""
    if not interval_s:
        return await awaitable
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle

    def beat() -> None:  # runs in the activity's context (the timer copied it), so heartbeat() knows it
        nonlocal timer
        activity.heartbeat()
        timer = loop.call_later(interval_s, beat)

    timer = loop.call_later(interval_s, beat)
    try:
        return await awaitable
    finally:
        timer.cancel()


def third_of_timeout(floor_s: float, default_s: float | None = None) -> float | None:
    """A third of this activity's heartbeat timeout (at least `floor_s`), `default_s` without one, and
    None outside an activity."""
    if not activity.in_activity():
        return None
    timeout = activity.info().heartbeat_timeout
    return max(timeout.total_seconds() / 3, floor_s) if timeout else default_s


async def with_heartbeats(awaitable: Awaitable[T]) -> T:
    """Await, heartbeating at a third of the heartbeat timeout when the activity has one.

    A long call (a generation, a dataset batch) then reveals a dead worker within the heartbeat
    timeout instead of start_to_close, and activity cancellation reaches the call.
    """
    return await heartbeating(awaitable, third_of_timeout(0.05))
