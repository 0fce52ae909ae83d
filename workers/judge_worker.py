"""A worker for the LLM-judge queue, rate limited for the whole queue by the Temporal server.

Judge endpoints are shared, rate-limited APIs; a per-worker limit would multiply with the number
of workers. ``max_task_queue_activities_per_second`` is enforced server-side for the task queue:
every worker polling it shares one budget. Temporal applies the value sent by the latest poller,
so every judge worker must be given the same rate (workers that disagree take turns overriding
each other). Scheduling side: workflows run the ``judge`` activity with
``task_queue=JUDGE_TASK_QUEUE``.

    judge = JudgeActivities(default_base_url=url, default_model="judge", api_key=key)
    async with judge_worker(client, activities=judge, rate_per_second=5):
        ...
    await judge.aclose()
"""

from __future__ import annotations

import math
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from gymflow.activities.judge import JudgeActivities
from gymflow.activities.names import JUDGE_TASK_QUEUE


def judge_queue_options(*, rate_per_second: float | None, max_concurrent_activities: int = 64) -> dict[str, Any]:
    """`Worker` options of a judge queue's worker: the queue-wide rate limit and the calls in flight.

    Args:
        rate_per_second: Judge calls per second started across ALL workers of the judge queue
            (``max_task_queue_activities_per_second``); None for no limit. Give every judge
            worker the same value.
        max_concurrent_activities: Judge calls in flight on this worker at once.

    Raises:
        ValueError: `rate_per_second` is not a positive finite number.
    """
    if rate_per_second is not None and not (math.isfinite(rate_per_second) and rate_per_second > 0):
        raise ValueError(f"rate_per_second must be a positive number or None, got {rate_per_second!r}")
    return {
        "max_concurrent_activities": max_concurrent_activities,
        "max_task_queue_activities_per_second": rate_per_second,
    }


def judge_worker(
    client: Client,
    *,
    activities: JudgeActivities,
    rate_per_second: float | None,
    task_queue: str = JUDGE_TASK_QUEUE,
    max_concurrent_activities: int = 64,
) -> Worker:
    """A worker that runs only the ``judge`` activity, under a queue-wide rate limit.

    Args:
        client: Temporal client (with gymflow's data converter).
        activities: The judge activities (endpoint, model, API key); the caller closes them.
        rate_per_second: Judge calls per second started across ALL workers of `task_queue`
            (``max_task_queue_activities_per_second``); None for no limit. Give every judge
            worker the same value.
        task_queue: The judge queue.
        max_concurrent_activities: Judge calls in flight on this worker at once.

    Returns:
        The worker, not yet started (``async with`` it, or ``await worker.run()``).

    Raises:
        ValueError: `rate_per_second` is not a positive finite number.
    """
    options = judge_queue_options(rate_per_second=rate_per_second, max_concurrent_activities=max_concurrent_activities)
    return Worker(client, task_queue=task_queue, activities=[activities.judge, activities.judge_group], **options)
