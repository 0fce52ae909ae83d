"""kill -9 a worker process twice during a batch of fused-turn rollouts (math) on two worker processes.

A fused turn (gymflow.activities.turn) runs the model call and the tool calls in one activity on the
rollout's node; a killed node takes the turn and the rollout's calculator server with it. Every
rollout must still complete, scored once and right: the turn in flight is noticed by its heartbeat,
a turn scheduled on the dead node's queue finds its state gone, and both re-initialise the rollout
and play the turn again (math is stateless, so re-running its calls is sound).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from pathlib import Path

import figures
import pytest
from chaos_support import fleet, fleet_spec
from mcp_support import node_ids, wait_polling
from temporalio.client import Client

from bench.workload import LatencyMiddleware, endpoint
from gymflow.activities.model import ModelConfig
from gymflow.activities.names import node_queue
from gymflow.activities.schema import BatchInput, BatchResult, RetrySettings, RolloutLimits, RolloutOptions
from gymflow.activities.storage import read_trajectories
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.workers.servers.policy import AppServer, build_app
from gymflow.workflows.group import BatchRolloutWorkflow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROLLOUTS = 100
KILL_AT = (30, 60)


async def test_fused_turns_survive_two_kill_9s_of_a_worker(
    client: Client, temporal_address: str, tmp_path: Path
) -> None:
    queue = f"chaos-{uuid.uuid4().hex[:8]}"
    spec = fleet_spec(tmp_path, temporal_address, queue)
    tasks = generate_tasks(ROLLOUTS, seed=41, difficulty=3)
    started = time.monotonic()
    # 300 ms per model turn: at each kill, the killed worker holds rollouts mid-conversation.
    async with AppServer(LatencyMiddleware(build_app(CalculatorPolicy()))) as policy:
        with fleet(spec, tmp_path / "fleet") as workers:
            await wait_polling(client, [node_queue(queue, node) for node in node_ids(2)])
            handle = await client.start_workflow(
                BatchRolloutWorkflow.run,
                BatchInput(
                    env="math",
                    tasks=tasks,
                    window=32,
                    destination=(tmp_path / "results").as_uri(),
                    options=RolloutOptions(
                        model=ModelConfig(base_url=endpoint(policy.url.removesuffix("/v1"), 0.3), request_timeout_s=10),
                        limits=RolloutLimits(tool_timeout_s=10),
                        retry=RetrySettings(node_timeout_s=3, max_recoveries=5),
                    ),
                ),
                id=f"chaos-fused-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
            )
            for n, threshold in enumerate(KILL_AT):
                deadline = time.monotonic() + 600
                while int((await handle.query(BatchRolloutWorkflow.progress))["completed"]) < threshold:
                    assert time.monotonic() < deadline, f"batch stalled before {threshold} rollouts"
                    await asyncio.sleep(0.2)
                rank = n % 2
                workers.kill(rank)  # restarted at once under the same node id: its queue is polled, its state gone
                workers.start(rank)
            result: BatchResult = await asyncio.wait_for(handle.result(), timeout=900)
    elapsed = time.monotonic() - started

    trajectories = await read_trajectories(result.parts)
    ids = Counter(t.rollout_id for t in trajectories)
    assert result.total == ROLLOUTS and len(ids) == ROLLOUTS and set(ids.values()) == {1}
    failed = [(t.task_id, t.termination, t.error) for t in trajectories if t.infra_failed or not t.reward]
    assert not failed, failed
    assert all(t.reward and t.reward.total == 1.0 for t in trajectories)
    recovered = [t for t in trajectories if t.recoveries]
    assert recovered, "no rollout was on a killed worker: the kills tested nothing"
    history = await client.get_workflow_handle(recovered[0].rollout_id).fetch_history()
    kinds = Counter(
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    )
    assert kinds["play_turn"] >= recovered[0].turns and not kinds["call_tool"] and not kinds["generate"]
    figures.record(
        "chaos", "kill -9 a worker 2x, 100 fused-turn math rollouts, 2 worker processes",
        started=ROLLOUTS, completed=sum(not t.infra_failed for t in trajectories), lost=ROLLOUTS - len(ids),
        rollouts_recovered=len(recovered), recoveries=sum(t.recoveries for t in trajectories),
        batch_s=round(elapsed, 1),
    )  # fmt: skip
