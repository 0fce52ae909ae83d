"""The bare-Temporal ceiling: RolloutWorkflow's activity plan with nothing else.

Three plans, as gymflow's: classic (model turns and tool calls each an activity), local model
turns, and fused turns (one activity per turn on the node queue, the last one with the reward).

`BareRolloutWorkflow` schedules the same activities as a gymflow rollout, on the same queues
(init and model turns on the shared queue, tool calls and the end of the rollout on the node queue
that init returns; model turns as local activities when gymflow's are), but each activity returns
a few bytes after the scenario's model or tool latency (none in (a) and (b)) and the workflow keeps no
transcript. Run by a worker with gymflow's worker settings (`gymflow.workers.worker.worker_tuning`) on
the same server, it is the throughput and latency floor that gymflow's orchestration can approach.

With `BareInput.model_url` (fused plan), each turn does the rollout's real work instead, as the
direct loop does it (`bench.direct.DirectRunner.turn`: the model call over HTTP, the tool call, the
reward at the end), the node holding the conversation in memory: Temporal running the same plan
and the same work, with nothing of gymflow's (durability of the conversation, budgets, recovery).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from bench.direct import DirectRun, DirectRunner
    from bench.workload import bench_task
    from gymflow.activities.model import ModelConfig
    from gymflow.activities.names import SA_REWARD, SA_STATUS

BARE_WORKFLOW = "BenchBareWorkflow"
TIMEOUT = timedelta(seconds=60)
RETRY = RetryPolicy(maximum_attempts=3)
NODE_HEARTBEAT = timedelta(seconds=10)
"""RolloutWorkflow's node activities' heartbeat timeout (rollout_env.ENV_HEARTBEAT); their
schedule-to-start timeout is RetryConfig.node_timeout_s's default, TIMEOUT's 60 s."""


@dataclass
class BareInput:
    tool_turns: int
    """Model turns with one tool call each; one more model turn ends the rollout."""
    local_model: bool = False
    """Model turns as local activities."""
    finish_in_one: bool = True
    """Reward and release in one activity, as gymflow's rollout does (plan 2)."""
    model_delay_s: float = 0.0
    """Seconds each model turn sleeps (scenario (c): the model's latency)."""
    tool_delay_s: float = 0.0
    """Seconds each tool call sleeps."""
    patch: bool = False
    """Call `workflow.patched` once, as RolloutWorkflow does (a marker and a TemporalChangeVersion
    upsert); `bench.server_cost` measures what each of these extras costs the server."""
    finish_upserts: bool = False
    """Upsert a status and a reward search attribute and a memo field at the end, as RolloutWorkflow does."""
    fused: bool = False
    """Each turn one activity on the node queue (model latency, then the tool's), the last one with
    the reward: gymflow's fused turns (gymflow.activities.turn)."""
    node_timeouts: bool = False
    """Give each turn on the node queue the schedule-to-start and heartbeat timeouts RolloutWorkflow's
    node activities have (a lost node, a dead worker): the server keeps a timer for each."""
    pad_bytes: int = 0
    """Bytes added to every activity's input per turn so far (RolloutWorkflow's model turns carry the
    whole conversation, so its history grows quadratically with the turns)."""
    model_url: str | None = None
    """Fused plan: each turn does the real work against this model endpoint (see the module doc)."""


@dataclass
class BareStep:
    turn: int
    delay_s: float = 0.0
    pad: str = ""


@dataclass
class BareTurn:
    turn: int
    model_delay_s: float = 0.0
    tool_delay_s: float = 0.0
    """0 for the last turn (a final answer calls no tool)."""
    pad: str = ""
    rollout_id: str = ""
    model_url: str | None = None
    """Set: do the turn's work (BareInput.model_url)."""
    tool_turns: int = 0


class BareActivities:
    """No-op activities named after gymflow's, so histories look alike; with `work`, the fused turns
    can do the rollout's real work (BareInput.model_url)."""

    def __init__(self, node_queue: str, work: DirectRunner | None = None) -> None:
        self.node_queue = node_queue
        self.work = work
        self._runs: dict[str, DirectRun] = {}

    @activity.defn(name="bare_init")
    async def init(self, rollout_id: str) -> str:
        return self.node_queue

    @activity.defn(name="bare_generate")
    async def generate(self, step: BareStep) -> str:
        if step.delay_s:
            await asyncio.sleep(step.delay_s)
        return f"turn {step.turn}"

    @activity.defn(name="bare_call_tool")
    async def call_tool(self, step: BareStep) -> str:
        if step.delay_s:
            await asyncio.sleep(step.delay_s)
        return f"step {step.turn} done"

    @activity.defn(name="bare_turn")
    async def turn(self, step: BareTurn) -> str:
        if step.model_url is not None:
            return await self._work_turn(step)
        await asyncio.sleep(step.model_delay_s + step.tool_delay_s)
        return f"turn {step.turn} done"

    async def _work_turn(self, step: BareTurn) -> str:
        if self.work is None:
            raise RuntimeError("this bare worker was started without a runner for the work")
        run = self._runs.get(step.rollout_id)
        if run is None:
            task = bench_task(0, tool_turns=step.tool_turns, tool_delay_s=step.tool_delay_s)
            run = self._runs[step.rollout_id] = await self.work.start(step.rollout_id, task)
        if not await self.work.turn(run, ModelConfig(base_url=step.model_url), step.turn):
            return f"turn {step.turn} done"
        del self._runs[step.rollout_id]
        try:
            await self.work.env.compute_reward(run.rollout_id, run.messages, run.task.ground_truth, task_id=run.task.id)
        finally:
            await self.work.env.release_rollout(run.rollout_id)
        return "scored"

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
        if input.patch:
            workflow.patched("bench-patch")
        node = await workflow.execute_activity_method(
            BareActivities.init, rollout_id, start_to_close_timeout=TIMEOUT, retry_policy=RETRY
        )
        if input.fused:
            for turn in range(input.tool_turns + 1):
                tool_s = input.tool_delay_s if turn < input.tool_turns else 0.0
                step = BareTurn(
                    turn,
                    input.model_delay_s,
                    tool_s,
                    "x" * (input.pad_bytes * turn),
                    rollout_id=rollout_id,
                    model_url=input.model_url,
                    tool_turns=input.tool_turns,
                )
                await workflow.execute_activity_method(
                    BareActivities.turn,
                    step,
                    task_queue=node,
                    start_to_close_timeout=TIMEOUT,
                    retry_policy=RETRY,
                    schedule_to_start_timeout=TIMEOUT if input.node_timeouts else None,
                    heartbeat_timeout=NODE_HEARTBEAT if input.node_timeouts else None,
                )
            if input.finish_upserts:
                workflow.upsert_search_attributes([SA_STATUS.value_set("completed"), SA_REWARD.value_set(1.0)])
                workflow.upsert_memo({"termination": "final_answer"})
            return 1.0  # the last turn scored the answer and freed the state
        for turn in range(input.tool_turns + 1):
            pad = "x" * (input.pad_bytes * turn)
            generate = BareStep(turn, input.model_delay_s, pad)
            if input.local_model:
                await workflow.execute_local_activity_method(
                    BareActivities.generate, generate, start_to_close_timeout=TIMEOUT, retry_policy=RETRY
                )
            else:
                await workflow.execute_activity_method(
                    BareActivities.generate, generate, start_to_close_timeout=TIMEOUT, retry_policy=RETRY
                )
            if turn < input.tool_turns:
                await workflow.execute_activity_method(
                    BareActivities.call_tool,
                    BareStep(turn, input.tool_delay_s, pad),
                    task_queue=node,
                    start_to_close_timeout=TIMEOUT,
                    retry_policy=RETRY,
                )
        reward = await workflow.execute_activity_method(
            BareActivities.reward, rollout_id, task_queue=node, start_to_close_timeout=TIMEOUT, retry_policy=RETRY
        )
        if input.finish_upserts:
            workflow.upsert_search_attributes([SA_STATUS.value_set("completed"), SA_REWARD.value_set(reward)])
            workflow.upsert_memo({"termination": "final_answer"})
        if input.finish_in_one:
            return reward
        await workflow.execute_activity_method(
            BareActivities.release, rollout_id, task_queue=node, start_to_close_timeout=TIMEOUT, retry_policy=RETRY
        )
        return reward
