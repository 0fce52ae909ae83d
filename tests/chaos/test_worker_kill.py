"""kill -9 a worker process three times during a 200-rollout batch on two real worker processes.

Every rollout completes and is written once; every tool call that completed before a crash ran
exactly once on the server side, apart from the replays a replayable env does on purpose after a
recovery; the only other re-executions are of calls that were in flight when a worker died.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import figures
import pytest
from chaos_support import (
    CountingPolicy,
    RolloutLedger,
    call_ledger,
    counting_env_file,
    counting_tasks,
    executions,
    fleet,
    fleet_spec,
    reexecutions,
)
from mcp_support import node_ids, wait_polling
from temporalio.client import Client, WorkflowHandle

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import node_queue
from gymflow.activities.schema import BatchInput, BatchResult, RetrySettings, RolloutLimits, RolloutOptions
from gymflow.activities.storage import read_trajectories
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workflows.group import BatchRolloutWorkflow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROLLOUTS = 200
STEPS = 3
KILL_AT = (50, 100, 150)
"""Kill a worker when the batch has finished this many rollouts."""


async def finished(handle: WorkflowHandle[Any, BatchResult], timeout_s: float) -> int:
    """Rollouts the batch has finished so far."""
    progress = await asyncio.wait_for(handle.query(BatchRolloutWorkflow.progress), timeout_s)
    return int(progress["completed"])


async def test_batch_survives_three_kill_9s_of_a_worker(client: Client, temporal_address: str, tmp_path: Path) -> None:
    log = tmp_path / "executions.jsonl"
    env_file = counting_env_file(tmp_path, log)
    queue = f"chaos-{uuid.uuid4().hex[:8]}"
    spec = fleet_spec(tmp_path, temporal_address, queue)
    tasks = counting_tasks(ROLLOUTS, STEPS)
    batch_id = f"chaos-kill-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    async with PolicyServer(CountingPolicy()) as policy:
        with fleet(spec, tmp_path / "fleet") as workers:
            await wait_polling(client, [node_queue(queue, node) for node in node_ids(2)])
            handle = await client.start_workflow(
                BatchRolloutWorkflow.run,
                BatchInput(
                    env=str(env_file),
                    tasks=tasks,
                    window=32,
                    max_children_per_run=100,  # continue-as-new mid-batch too
                    destination=(tmp_path / "results").as_uri(),
                    options=RolloutOptions(
                        model=ModelConfig(base_url=policy.url, request_timeout_s=10),
                        limits=RolloutLimits(max_turns=STEPS + 2, tool_timeout_s=10),
                        retry=RetrySettings(node_timeout_s=3, max_recoveries=5),
                    ),
                ),
                id=batch_id,
                task_queue=queue,
            )
            for n, threshold in enumerate(KILL_AT):
                deadline = time.monotonic() + 600
                while await finished(handle, 30) < threshold:
                    assert time.monotonic() < deadline, f"batch stalled before {threshold} rollouts"
                    await asyncio.sleep(0.2)
                rank = n % 2
                workers.kill(rank)  # a supervisor restarts it at once, under the same node id
                workers.start(rank)
            result: BatchResult = await asyncio.wait_for(handle.result(), timeout=900)
    elapsed = time.monotonic() - started

    trajectories = await read_trajectories(result.parts)
    ids = Counter(t.rollout_id for t in trajectories)
    assert result.total == ROLLOUTS and len(ids) == ROLLOUTS, (result, len(ids))
    duplicated = sum(c - 1 for c in ids.values())
    assert duplicated == 0  # no rollout (so no reward) written twice
    failed = [(t.task_id, t.termination, t.error) for t in trajectories if t.infra_failed or not t.reward]
    assert not failed, failed
    assert all(t.reward and t.reward.total == 1.0 for t in trajectories)  # every counter rebuilt exactly

    ran = executions(log)
    ledgers = await asyncio.gather(*(call_ledger(client, t.rollout_id) for t in trajectories))
    replayed, in_flight, interrupted = reexecutions(ledgers, ran)
    assert len(ran) == ROLLOUTS * STEPS == sum(len(ledger.calls) for ledger in ledgers)

    recovered = [t for t in trajectories if t.recoveries]
    answered = sum(p.read_text(errors="replace").count("already completed on this node")
                   for p in (tmp_path / "fleet").glob("rank-*.log"))  # fmt: skip
    recovery_s = recovery_times(ledgers, [when for _, when in workers.kills])
    figures.record(
        "chaos", "kill -9 a worker 3x, 200-rollout batch, 2 worker processes",
        started=ROLLOUTS, completed=sum(not t.infra_failed for t in trajectories), lost=ROLLOUTS - len(ids),
        duplicated=duplicated, tool_calls=len(ran), executions=sum(ran.values()), replay_reexecutions=replayed,
        in_flight_reexecutions=in_flight, calls_cut_by_a_kill=interrupted, rollouts_recovered=len(recovered),
        retries_answered_by_dedup=answered,
        recovery_p50_s=round(statistics.median(recovery_s), 1) if recovery_s else None,
        recovery_max_s=round(max(recovery_s), 1) if recovery_s else None, batch_s=round(elapsed, 1),
        runs=result.runs + 1,
    )  # fmt: skip


def recovery_times(ledgers: list[RolloutLedger], kills: list[datetime]) -> list[float]:
    """Seconds from each kill to every recovery (re-initialised rollout) that followed it."""
    seconds = []
    for ledger in ledgers:
        for when in ledger.recovered_at:
            kill = max((k for k in kills if k <= when), default=None)
            if kill is not None:
                seconds.append((when - kill).total_seconds())
    return seconds
