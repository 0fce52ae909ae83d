"""Stop the embedded Temporal server mid-batch and start it again on the same database: the worker
processes reconnect by themselves and the batch completes, nothing lost or written twice."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import figures
import leaks
import pytest
from chaos_support import (
    CountingPolicy,
    call_ledger,
    counting_env_file,
    counting_tasks,
    executions,
    fleet,
    fleet_spec,
    reexecutions,
)
from mcp_support import node_ids, wait_polling
from temporalio.client import Client
from temporalio.service import RPCError

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import node_queue
from gymflow.activities.schema import BatchInput, BatchResult, RetrySettings, RolloutLimits, RolloutOptions
from gymflow.activities.storage import read_trajectories
from gymflow.envs.mcp.http import free_port
from gymflow.workers.client import connect
from gymflow.workers.servers import temporal as embedded
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workflows.group import BatchRolloutWorkflow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROLLOUTS = 60
STEPS = 3
STOP_AT = 20
T = TypeVar("T")


async def retrying(call: Callable[[], Awaitable[T]], *, timeout_s: float) -> T:
    """`call()` until it stops failing with an RPC error (the server is down), within a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except (RPCError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)


async def test_batch_completes_across_a_server_restart(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "server", free_port()
    address = f"127.0.0.1:{port}"
    embedded.start_background(data_dir=data_dir, port=port, ui_port=free_port())
    try:
        client: Client = await embedded.wait_until_reachable(lambda: connect(address), timeout_s=60)
        log = tmp_path / "executions.jsonl"
        queue = f"chaos-{uuid.uuid4().hex[:8]}"
        spec = fleet_spec(tmp_path, address, queue)
        async with PolicyServer(CountingPolicy()) as policy:
            with fleet(spec, tmp_path / "fleet") as workers:
                await wait_polling(client, [node_queue(queue, node) for node in node_ids(2)])
                handle = await client.start_workflow(
                    BatchRolloutWorkflow.run,
                    BatchInput(
                        env=str(counting_env_file(tmp_path, log)),
                        tasks=counting_tasks(ROLLOUTS, STEPS),
                        window=16,
                        destination=(tmp_path / "results").as_uri(),
                        options=RolloutOptions(
                            model=ModelConfig(base_url=policy.url, request_timeout_s=10),
                            limits=RolloutLimits(max_turns=STEPS + 2, tool_timeout_s=10),
                            retry=RetrySettings(node_timeout_s=3, max_recoveries=5),
                        ),
                    ),
                    id=f"chaos-restart-{uuid.uuid4().hex[:8]}",
                    task_queue=queue,
                )
                deadline = time.monotonic() + 300
                while (done := (await handle.query(BatchRolloutWorkflow.progress))["completed"]) < STOP_AT:
                    assert time.monotonic() < deadline, "the batch never got going"
                    await asyncio.sleep(0.2)
                stopped_at = time.monotonic()
                assert embedded.stop_background(data_dir=data_dir)
                with pytest.raises((RPCError, RuntimeError)):
                    await client.count_workflows()  # the server really is down
                embedded.start_background(data_dir=data_dir, port=port, ui_port=free_port())
                await retrying(client.count_workflows, timeout_s=60)
                back_at = time.monotonic()
                # The batch moves again: more rollouts finish after the restart.
                while (await retrying(lambda: handle.query(BatchRolloutWorkflow.progress), timeout_s=60))[
                    "completed"
                ] <= done:
                    assert time.monotonic() < back_at + 300, "the batch did not resume after the restart"
                    await asyncio.sleep(0.2)
                resumed_at = time.monotonic()
                result: BatchResult = await retrying(handle.result, timeout_s=600)
                assert all(workers.alive(rank) for rank in range(2))  # they reconnected, nobody restarted them
            trajectories = await read_trajectories(result.parts)
        ids = Counter(t.rollout_id for t in trajectories)
        assert result.total == ROLLOUTS == len(ids) and all(c == 1 for c in ids.values())
        failed = [(t.task_id, t.termination, t.error) for t in trajectories if t.infra_failed or not t.reward]
        assert not failed, failed
        ran = executions(log)
        # No silent wrong reward: a tool call whose completion report was lost while the server was
        # down is retried on the same live server, and must not run twice (workers/dedup.py). The
        # only calls that may run again are a recovery's replays: an activity scheduled on a node
        # queue just before the stop can outlive node_timeout_s (3 s here) while the server is
        # down, and the rollout then presumes its node lost and replays onto a fresh server.
        assert all(t.reward and t.reward.total == 1.0 for t in trajectories)
        ledgers = await asyncio.gather(*(call_ledger(client, t.rollout_id) for t in trajectories))
        replayed, in_flight, _ = reexecutions(ledgers, ran)
        assert len(ran) == ROLLOUTS * STEPS == sum(len(ledger.calls) for ledger in ledgers)
        assert in_flight == 0  # no worker died: nothing but a replay may run a call twice
        assert sum(ran.values()) - len(ran) == replayed
        recovered = sum(bool(t.recoveries) for t in trajectories)
        assert (replayed > 0) <= (recovered > 0)
        answered = sum(p.read_text(errors="replace").count("already completed on this node")
                       for p in (tmp_path / "fleet").glob("rank-*.log"))  # fmt: skip
        report = await leaks.scan_histories(client)  # this server's histories are the suite's too
        assert not report.leaks, report.leaks
        figures.record(
            "chaos", "stop + restart the Temporal server mid-batch (60 rollouts, 2 worker processes)",
            started=ROLLOUTS, completed=len(trajectories), lost=ROLLOUTS - len(ids), duplicated=0,
            tool_calls=len(ran), executions=sum(ran.values()),
            replay_reexecutions=replayed, in_flight_reexecutions=in_flight, rollouts_recovered=recovered,
            retries_answered_by_dedup=answered,
            server_down_s=round(back_at - stopped_at, 1), resumed_after_restart_s=round(resumed_at - back_at, 1),
        )  # fmt: skip
    finally:
        embedded.stop_background(data_dir=data_dir)
