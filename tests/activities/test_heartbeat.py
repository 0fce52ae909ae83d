"""gymflow.activities.heartbeat: heartbeats beside an awaited call, in the activity's own task."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.testing import ActivityEnvironment

from gymflow.activities.heartbeat import heartbeating, third_of_timeout


def _environment(heartbeat_timeout: timedelta | None) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=heartbeat_timeout)
    return env


async def test_heartbeats_while_the_call_runs_and_returns_its_result() -> None:
    env = _environment(timedelta(seconds=0.15))
    beats = 0
    enough = asyncio.Event()

    def on_heartbeat(*details: object) -> None:
        nonlocal beats
        beats += 1
        if beats == 3:
            enough.set()  # the call finishes only once it has seen heartbeats go out

    env.on_heartbeat = on_heartbeat

    async def slow_call() -> str:
        await enough.wait()
        return "done"

    async def body() -> str:
        return await heartbeating(slow_call(), third_of_timeout(0.05))

    assert await asyncio.wait_for(env.run(body), timeout=10) == "done"
    assert beats == 3


async def test_the_call_runs_in_the_activity_task_and_its_errors_pass_through() -> None:
    env = _environment(timedelta(seconds=10))

    async def failing() -> None:
        assert asyncio.current_task() is outer  # no task per call
        raise ValueError("tool broke")

    async def body() -> None:
        nonlocal outer
        outer = asyncio.current_task()
        await heartbeating(failing(), third_of_timeout(0.05))

    outer: asyncio.Task[object] | None = None
    with pytest.raises(ValueError, match="tool broke"):
        await env.run(body)


async def test_cancelling_the_activity_cancels_the_awaited_call() -> None:
    env = _environment(timedelta(seconds=10))
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hung_call() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def body() -> None:
        await heartbeating(hung_call(), third_of_timeout(0.05))

    run = asyncio.ensure_future(env.run(body))
    await asyncio.wait_for(started.wait(), timeout=10)
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(run, timeout=10)
    assert cancelled.is_set()


def test_interval_from_the_heartbeat_timeout() -> None:
    assert third_of_timeout(0.05) is None  # outside an activity: no heartbeats
    assert third_of_timeout(0.5, default_s=10.0) is None
    assert _environment(timedelta(seconds=9)).run(lambda: third_of_timeout(0.5)) == 3.0
    assert _environment(timedelta(seconds=0.3)).run(lambda: third_of_timeout(0.5)) == 0.5
    assert _environment(None).run(lambda: third_of_timeout(0.5, default_s=10.0)) == 10.0


async def test_no_interval_just_awaits() -> None:
    env = _environment(None)
    env.on_heartbeat = lambda *details: pytest.fail("heartbeat without an interval")

    async def body() -> int:
        assert activity.in_activity()
        return await heartbeating(asyncio.sleep(0, result=7), None)

    assert await env.run(body) == 7
