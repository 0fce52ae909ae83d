"""kill -9 the worker running a harness rollout's agent program, between two of its model calls.

The program dies with its worker (its parent-death signal); the rollout notices the lost node within
its heartbeat timeout, starts the program again on a fresh workspace, answers its calls from the
recorded turns while it asks the same, and completes with the full reward. The scripted upstream's
request log shows every request answered once: no model call was made twice.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from chaos_support import fleet, fleet_spec
from harness_support import (
    AGENTS,
    FileTaskPolicy,
    agent_python,
    file_task,
    harness_env_file,
    processes_with,
    replays,
    wait_for,
)
from mcp_support import node_ids, wait_polling
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import node_queue
from gymflow.activities.schema import RetrySettings, RolloutInput
from gymflow.envs.contract import TerminationReason
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.servers.policy import PolicyServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FILES = 4
KILL_AFTER = 2
"""Kill once the program has written this many files (it then pauses before its next model call)."""


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_program_survives_kill_9_of_its_worker(client: Client, temporal_address: str, tmp_path: Path) -> None:
    marker = f"--pause={2.0 + uuid.uuid4().int % 1000 / 1e6}"  # a unique argument to find the program by
    env = harness_env_file(tmp_path, [str(agent_python()), str(AGENTS / "openai_agent.py"), marker], timeout_s=300)
    queue = f"chaos-harness-{uuid.uuid4().hex[:8]}"
    spec = fleet_spec(tmp_path, temporal_address, queue)
    task = file_task(0, prefix="chaos", files=FILES)
    async with PolicyServer(FileTaskPolicy(), record_requests=True) as upstream:
        with fleet(spec, tmp_path / "fleet") as workers:
            await wait_polling(client, [node_queue(queue, node) for node in node_ids(2)])
            handle = await start_rollout(
                client,
                RolloutInput(
                    env=str(env),
                    task=task,
                    model=ModelConfig(base_url=upstream.url, request_timeout_s=30),
                    retry=RetrySettings(node_timeout_s=5, max_recoveries=3),
                ),
                task_queue=queue,
            )
            written = list(task.ground_truth)[KILL_AFTER - 1]
            workspaces = tmp_path / "ws"
            await wait_for(
                lambda: any(workspaces.rglob(written)), timeout_s=120, what=f"the program to write {written}"
            )
            programs = processes_with(marker)
            assert len(programs) == 1, programs
            worker = parent(programs[0])
            rank = next(r for r, p in workers.processes.items() if p.pid == worker)
            answered_before = len(upstream.requests)
            workers.kill(rank)
            # The kernel kills the program with its worker (parent-death signal), before any recovery.
            await wait_for(lambda: programs[0] not in processes_with(marker), timeout_s=10, what="the program to die")
            result = await handle.result()
    assert result.termination is TerminationReason.AGENT_EXIT, result
    assert result.reward is not None and result.reward.total == 1.0, result
    assert result.recoveries == 1
    assert result.program is not None and result.program.starts == 2
    assert result.program.replayed_calls == answered_before == KILL_AFTER
    assert result.turns == FILES + 1
    assert len(upstream.requests) == FILES + 1  # each request answered once: none twice
    assert len(set(upstream.requests)) == len(upstream.requests)
    await replays(client, handle.id)  # recovery, restart and the replayed calls replay deterministically
