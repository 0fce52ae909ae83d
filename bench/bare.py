"""The bare-Temporal ceiling: RolloutWorkflow's activity plan with nothing else.

`BareRolloutWorkflow` schedules the same activities as a gymflow rollout, on the same queues
(init and model turns on the shared queue, tool calls and the end of the rollout on the node queue
that init returns), but each activity returns at once with a few bytes and the workflow keeps no
transcript. Run by a worker with gymflow's worker settings (`workers.worker.worker_tuning`) on
the same server, it is the throughput and latency floor that gymflow's orchestration can approach.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

BARE_WORKFLOW = "BenchBareWorkflow"
TIMEOUT = timedelta(seconds=60)
RETRY = RetryPolicy(maximum_attempts=3)


@dataclass
class BareInput:
    tool_turns: int
    """Model turns with one tool call each; one more model turn ends the rollout."""
    local_model: bool = False
    """Model turns as local activities."""
    finish_in_one: bool = False
    """Reward and release in one activity."""


class BareActivities:
    """No-op activities named after gymflow's, so histories look alike."""

    def __init__(self, node_queue: str) -> None:
        self.node_queue = node_queue

    @activity.defn(name="bare_init")
    async def init(self, rollout_id: str) -> str:
        return self.node_queue

    @activity.defn(name="bare_generate")
    async def generate(self, turn: int) -> str:
        return f"turn {turn}"

    @activity.defn(name="bare_call_tool")
    async def call_tool(self, turn: int) -> str:
        return f"step {turn} done"

    @activity.defn(name="bare_reward")
    async def reward(self, rollout_id: str) -> float:
        return 1.0

    @activity.defn(name="bare_release")
    async def release(self, rollout_id: str) -> None:
        return None


@workflow.defn(name=BARE_WORKFLOW)
class BareRolloutWorkflow:
    @workflow.run
    async def run(self, input: BareInput) -> float:
        rollout_id = workflow.info().workflow_id
        node = await workflow.execute_activity_method(
            BareActivities.init, rollout_id, start_to_close_timeout=TIMEOUT, retry_policy=RETRY
        )
        for turn in range(input.tool_turns + 1):
            if input.local_model:
                await workflow.execute_local_activity_method(
                    BareActivities.generate, turn, start_to_close_timeout=TIMEOUT, retry_policy=RETRY
                )
            else:
                await workflow.execute_activity_method(
                    BareActivities.generate, turn, start_to_close_timeout=TIMEOUT, retry_policy=RETRY
                )
            if turn < input.tool_turns:
                await workflow.execute_activity_method(
                    BareActivities.call_tool, turn, task_queue=node, start_to_close_timeout=TIMEOUT, retry_policy=RETRY
                )
        reward = await workflow.execute_activity_method(
            BareActivities.reward, rollout_id, task_queue=node, start_to_close_timeout=TIMEOUT, retry_policy=RETRY
        )
        if input.finish_in_one:
            return reward
        await workflow.execute_activity_method(
            BareActivities.release, rollout_id, task_queue=node, start_to_close_timeout=TIMEOUT, retry_policy=RETRY
        )
        return reward
