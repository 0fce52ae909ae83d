"""kill -9 every worker during a 32-rollout Harbor batch on two real worker processes (on the engine under
test: .ci/run runs it on podman and on Docker Engine).

Every rollout completes (its container rebuilt and its tool calls replayed on a fresh one) or is
flagged infra-failed; none is scored from a dead container (each scored one is the oracle's 1.0);
and 60 s after the batch no container or network carrying gymflow's labels is left on the host
(a multi-container task's rollouts leave both behind when their worker dies).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import figures
import pytest
from chaos_support import fleet, fleet_spec
from container_support import base_image
from mcp_support import node_ids, wait_polling
from temporalio.client import Client, WorkflowHandle

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import node_queue
from gymflow.activities.schema import BatchInput, BatchResult, RetrySettings, RolloutLimits, RolloutOptions
from gymflow.activities.storage import read_trajectories
from gymflow.envs.builtin.harbor.env import HarborEnv
from gymflow.envs.builtin.harbor.policy import OraclePolicy
from gymflow.envs.runtime.engine import Engine
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workflows.group import BatchRolloutWorkflow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
__all__ = ["base_image"]  # the fixture: a real engine and the base image, or a skip naming the install

TASKS = Path(__file__).parents[1] / "envs" / "harbor" / "tasks"
SOLVABLE = ("edit-config", "fix-script", "make-executable", "sort-numbers", "service-token")
"""service-token has a compose service: its rollouts also leave a network and a second container."""
ROLLOUTS = 32
KILL_AT = 8


def gymflow_containers(state_root: Path) -> list[str]:
    """Containers with gymflow's labels whose disks live under `state_root` (this test's fleet's)."""
    binary = Engine.detect().binary
    listed = subprocess.run(
        [binary, "ps", "-a", "--filter", "label=gymflow=1", "--format", "{{.Names}}"], capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    names = listed.stdout.split()
    if not names:
        return []
    fmt = '{{index .Config.Labels "gymflow.state"}}'  # the same on both engines (`ps` formats labels differently)
    inspect = [binary, "inspect", "--format", fmt, *names]
    inspected = subprocess.run(inspect, capture_output=True, text=True, check=False)  # one may go meanwhile
    return [state for state in inspected.stdout.split() if state.startswith(str(state_root))]


def gymflow_networks(state_root: Path) -> list[str]:
    """Rollout networks with gymflow's labels whose rollout's disk lived under `state_root`."""
    binary = Engine.detect().binary
    listed = subprocess.run(
        [binary, "network", "ls", "--filter", "label=gymflow=1", "--format", "{{.Name}}"], capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    names = listed.stdout.split()
    fmt = '{{index .Labels "gymflow.state"}}'
    found = []
    for name in names:  # one at a time: a network removed meanwhile fails only its own inspect
        inspected = subprocess.run(
            [binary, "network", "inspect", "--format", fmt, name], capture_output=True, text=True, check=False
        )
        if inspected.stdout.strip().startswith(str(state_root)):
            found.append(name)
    return found


def leftovers(state_root: Path) -> list[str]:
    """Containers, networks and container disks (mounted or not) of this test's runtime left on the host."""
    disks = [str(p) for p in state_root.glob("*/gymflow-*") if p.is_dir()]
    return gymflow_containers(state_root) + gymflow_networks(state_root) + disks


async def finished(handle: WorkflowHandle[Any, BatchResult]) -> int:
    progress = await asyncio.wait_for(handle.query(BatchRolloutWorkflow.progress), 30)
    return int(progress["completed"])


async def test_harbor_batch_survives_a_kill_9_and_leaves_no_container(
    client: Client, temporal_address: str, tmp_path: Path, base_image: str
) -> None:
    del base_image
    rows = {t.id: t for t in HarborEnv.load_dataset(str(TASKS))}  # the oracle finds its tasks here
    tasks = [
        rows[SOLVABLE[i % len(SOLVABLE)]].model_copy(update={"id": f"{SOLVABLE[i % len(SOLVABLE)]}-{i}"})
        for i in range(ROLLOUTS)
    ]
    state_root = tmp_path / "runtime"
    queue = f"chaos-{uuid.uuid4().hex[:8]}"
    spec = fleet_spec(tmp_path, temporal_address, queue)
    spec.env["GYMFLOW_RUNTIME_STATE_DIR"] = str(state_root)
    started = time.monotonic()
    async with PolicyServer(OraclePolicy()) as policy:
        with fleet(spec, tmp_path / "fleet") as workers:
            await wait_polling(client, [node_queue(queue, node) for node in node_ids(2)])
            handle = await client.start_workflow(
                BatchRolloutWorkflow.run,
                BatchInput(
                    env="harbor",
                    tasks=tasks,
                    window=16,
                    destination=(tmp_path / "results").as_uri(),
                    options=RolloutOptions(
                        model=ModelConfig(base_url=policy.url, request_timeout_s=30),
                        limits=RolloutLimits(max_turns=4),
                        retry=RetrySettings(node_timeout_s=5, max_recoveries=3),
                    ),
                ),
                id=f"chaos-harbor-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
            )
            deadline = time.monotonic() + 600
            while await finished(handle) < KILL_AT:
                assert time.monotonic() < deadline, "batch stalled"
                await asyncio.sleep(0.2)
            in_flight = len(gymflow_containers(state_root))
            networks_at_kill = len(gymflow_networks(state_root))
            for rank in (0, 1):  # every worker of the fleet: nothing is left alive to release a thing
                workers.kill(rank)
            for rank in (0, 1):  # their successors reap what the dead left, and the batch goes on
                workers.start(rank)
            result: BatchResult = await asyncio.wait_for(handle.result(), timeout=1200)
        batch_s = time.monotonic() - started
        # The fleet stopped (gracefully) with the block: every container and network must be gone within 60 s.
        gone_by = time.monotonic() + 60
        left = leftovers(state_root)
        while left and time.monotonic() < gone_by:
            await asyncio.sleep(1)  # polling the engine: it has no event to wait on
            left = leftovers(state_root)
    assert left == [], left

    trajectories = await read_trajectories(result.parts)
    ids = Counter(t.rollout_id for t in trajectories)
    assert len(ids) == ROLLOUTS and max(ids.values()) == 1
    scored = [t for t in trajectories if not t.infra_failed]
    flagged = [(t.task_id, t.termination.value, t.error) for t in trajectories if t.infra_failed]
    # Never a score from a dead container: what is scored is the oracle's full marks.
    assert all(t.reward is not None and t.reward.total == 1.0 for t in scored), [
        (t.task_id, t.reward) for t in scored if t.reward is None or t.reward.total != 1.0
    ]
    assert len(scored) >= ROLLOUTS // 2, flagged
    figures.record(
        "chaos", f"kill -9 every worker during a 32-rollout Harbor batch, 2 worker processes, {Engine.detect().kind}",
        started=ROLLOUTS, scored=len(scored), flagged=len(flagged), containers_at_kill=in_flight,
        networks_at_kill=networks_at_kill,
        recovered=sum(t.recoveries > 0 for t in trajectories), batch_s=round(batch_s, 1),
        flagged_reasons=dict(Counter(reason for _, reason, _ in flagged)),
    )  # fmt: skip
