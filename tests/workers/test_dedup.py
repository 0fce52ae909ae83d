"""An activity whose work is done but whose report is lost is retried by Temporal; on a node with
the dedup interceptor the retry gets the first attempt's result and the work is not done twice."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    UnsandboxedWorkflowRunner,
    Worker,
)

from gymflow.workers.dedup import CompletedActivities, DedupInterceptor

RUNS: Counter[str] = Counter()


@activity.defn(name="bump")
async def bump(tag: str) -> int:
    """A side effect that must happen once per call (a stateful tool)."""
    RUNS[tag] += 1
    return RUNS[tag]


@activity.defn(name="release_rollout")
async def release(tag: str) -> None:
    del tag


@workflow.defn(name="BumpTwice")
class BumpTwice:
    @workflow.run
    async def run(self, tag: str) -> list[int]:
        retry = RetryPolicy(initial_interval=timedelta(milliseconds=100), maximum_attempts=3)
        results = []
        for _ in range(2):  # two distinct calls: both must run
            results.append(
                await workflow.execute_activity(
                    bump, tag, start_to_close_timeout=timedelta(seconds=10), retry_policy=retry
                )
            )
        await workflow.execute_activity(release, tag, start_to_close_timeout=timedelta(seconds=10))
        return results


class LoseFirstReport(Interceptor):
    """Outermost: lets attempt 1 do its work, then fails it as a lost completion report would."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        class Inbound(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                result = await self.next.execute_activity(input)
                if activity.info().attempt == 1 and activity.info().activity_type == "bump":
                    raise ApplicationError("completion report lost (simulated)")
                return result

        return Inbound(next)


@pytest.mark.parametrize("dedup", [True, False], ids=["dedup", "without"])
async def test_a_retried_completed_attempt_does_not_run_again(client: Client, dedup: bool) -> None:
    tag, queue = uuid.uuid4().hex, f"dedup-{uuid.uuid4().hex[:8]}"
    store = CompletedActivities()
    interceptors: list[Interceptor] = [LoseFirstReport(), *([DedupInterceptor(store=store)] if dedup else [])]
    async with Worker(
        client, task_queue=queue, workflows=[BumpTwice], activities=[bump, release], interceptors=interceptors,
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):  # fmt: skip
        results = await client.execute_workflow(BumpTwice.run, tag, id=f"bump-{tag[:8]}", task_queue=queue)
    if dedup:
        assert results == [1, 2] and RUNS[tag] == 2  # each call ran once, though each was attempted twice
        assert store.duplicates == 2 and len(store) == 0  # released: nothing kept
    else:
        assert results == [2, 4] and RUNS[tag] == 4  # the control: every retry ran the side effect again
