"""The host reaper: a worker killed with SIGKILL leaves containers whose owner lock is free; any other
worker's reaper removes them (and their disks), and leaves a live sibling's alone."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from pathlib import Path

from container_support import STATE_ROOT, engine_or_skip, leftovers

from gymflow.envs.runtime.base import Limits, RolloutSpec
from gymflow.envs.runtime.container import ContainerRuntime
from gymflow.envs.runtime.disk import RolloutDisk
from gymflow.envs.runtime.reaper import reap_host

DOOMED_WORKER = """
import asyncio, os, sys
from pathlib import Path
from gymflow.envs.runtime.base import Limits, RolloutSpec
from gymflow.envs.runtime.container import ContainerRuntime

async def main():
    node, state, image, workspace = sys.argv[1:5]
    runtime = ContainerRuntime(node_id=node, state_root=Path(state))
    spec = RolloutSpec(rollout_id="r-dead", node_id=node, workspace=workspace, image=image,
                       limits=Limits(memory_mb=128, storage_mb=64))
    sandbox = await runtime.start(spec)
    print(sandbox.name, flush=True)
    await asyncio.Event().wait()  # until killed

asyncio.run(main())
"""


async def test_a_killed_workers_containers_are_reaped_a_live_siblings_kept(base_image: str, tmp_path: Path) -> None:
    # A host of its own (state root): the reaper never touches what other test runs on this machine hold.
    root = STATE_ROOT / f"host-{uuid.uuid4().hex[:8]}"
    dead_node = f"test-{uuid.uuid4().hex[:8]}"
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DOOMED_WORKER, dead_node, str(root), base_image, str(tmp_path / "dead"),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        orphan = (await asyncio.wait_for(worker.stdout.readline(), 120)).decode().strip()
        assert orphan.startswith("gymflow-")
    finally:
        worker.send_signal(signal.SIGKILL)
        await asyncio.wait_for(worker.wait(), 30)
    sibling = ContainerRuntime(node_id=f"test-{uuid.uuid4().hex[:8]}", state_root=root)
    spec = RolloutSpec(rollout_id="r-live", node_id=sibling.node_id, workspace=str(tmp_path / "live"),
                       image=base_image, limits=Limits(memory_mb=128, storage_mb=64))  # fmt: skip
    live = await sibling.start(spec)
    try:
        removed = await reap_host(sibling.engine, state_root=root)  # a third worker's reaper
        assert orphan in removed and live.name not in removed
        assert await leftovers(sibling.engine, dead_node) == []
        assert not (root / dead_node / orphan).exists()  # its disk went with it
        assert await leftovers(sibling.engine, sibling.node_id) == [live.name]
        assert (await live.exec(["true"], timeout_s=30)).ok
    finally:
        await live.release()
        await sibling.close()
        await reap_host(sibling.engine, state_root=root)
        assert await leftovers(sibling.engine, dead_node) == await leftovers(sibling.engine, sibling.node_id) == []


async def test_a_dead_owners_half_made_disk_goes_at_once_a_live_ones_stays(tmp_path: Path) -> None:
    """A worker killed between making a container's disk and running the container leaves a young disk
    with no container. Its owner is dead, so the next reaper takes it at once, not after a container's
    start timeout; a disk a live runtime is making right now stays."""
    root = STATE_ROOT / f"host-{uuid.uuid4().hex[:8]}"
    node = f"test-{uuid.uuid4().hex[:8]}"
    live = ContainerRuntime(node_id=node, state_root=root, engine=engine_or_skip())
    try:
        disks = {name: root / node / f"gymflow-{name}" for name in ("dead", "live", "unnamed")}
        await RolloutDisk(disks["dead"]).create(lower=None, size_mb=16, owner="a-killed-worker")
        await RolloutDisk(disks["live"]).create(lower=None, size_mb=16, owner=live.owner)
        disks["unnamed"].mkdir()  # made before disks named their owner: kept until it is old
        await reap_host(live.engine, state_root=root)
        assert not disks["dead"].exists(), "unmounted and deleted"
        assert disks["live"].exists() and disks["unnamed"].exists()
    finally:
        await live.close()
        for path in (root / node).glob("gymflow-*"):
            await RolloutDisk(path).destroy()
    assert not any(p.is_mount() for p in (root / node).glob("gymflow-*/disk"))
