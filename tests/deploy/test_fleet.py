"""A 3-node local fleet (`gymflow deploy workers --backend local --nodes 3`): a batch spreads over
every node, and stopping a node mid-batch loses no rollout."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from mcp_support import ROOT, node_ids, node_queues_of, wait_polling
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import node_queue
from gymflow.activities.schema import RetrySettings, RolloutInput
from gymflow.deploy import launcher
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.workers.sdk.client import start_rollout

pytestmark = pytest.mark.slow


async def gymflow(*args: str, env: dict[str, str]) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gymflow.workers.cli", *args, cwd=ROOT, env={**os.environ, **env},
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()


async def test_batch_spreads_over_three_nodes_and_survives_losing_one(
    client: Client, temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    queue = f"fleet-{tmp_path.name}"
    env = {
        "GYMFLOW_TEMPORAL_ADDRESS": temporal_address,
        "GYMFLOW_TASK_QUEUE": queue,
        "GYMFLOW_DATA_DIR": str(tmp_path / "data"),
    }
    await gymflow("deploy", "workers", "--backend", "local", "--nodes", "3", env=env)
    try:
        queues = [node_queue(queue, node) for node in node_ids(3)]
        await wait_polling(client, queues)
        tasks = generate_tasks(18, seed=11, difficulty=(2, 3))
        handles = [
            await start_rollout(
                client,
                RolloutInput(
                    env="math",
                    task=task,
                    model=ModelConfig(base_url=calculator_policy_url),
                    retry=RetrySettings(node_timeout_s=3),
                ),
                task_queue=queue,
            )
            for task in tasks
        ]
        pending = {asyncio.ensure_future(h.result()): h for h in handles}
        results = []
        stopped = False
        for next_done in asyncio.as_completed(list(pending)):
            results.append(await next_done)
            if len(results) == 4 and not stopped:  # a third of the way in: lose node 2
                stopped = True
                await asyncio.to_thread(launcher.down_local, data_dir=tmp_path / "data", ranks=[2])
    finally:
        await gymflow("deploy", "down", "--backend", "local", env=env)
    assert len(results) == len(tasks)
    assert all(not r.infra_failed and r.reward is not None and r.reward.total == 1.0 for r in results), [
        (r.task_id, r.termination, r.error) for r in results if r.infra_failed or not r.reward or r.reward.total != 1
    ]
    used = set()
    for handle in handles:
        used.update(await node_queues_of(client, handle.id))
    assert used == set(queues), used  # every node ran tool calls
