"""Finding and removing the containers a node's dead rollouts left behind.

A container is an orphan when the worker process that started it is gone (its runtime instance,
label `gymflow.owner`, is not the caller's: a restarted worker holds no handle to it, so its rollout
re-initialises on a fresh container), or when its rollout is no longer live (the workflow was
terminated or timed out before `release`). Warm-pool containers of the live runtime are kept.
Removal also unmounts and deletes the container's state directory (its capped disk), and state
directories a crash left without any container are cleaned too. A rollout's services (a compose
file's other containers) carry the rollout's labels, its state directory's included, so they go with
it; the rollout's network goes once its containers are gone.

The node reaper calls `reap` with the set of rollouts it knows to be live on the node. A worker's
reaper calls `reap_host`: node ids are per process, so the containers of a worker killed with
SIGKILL belong to a node nobody serves any more; their owner's lock (gymflow.envs.runtime.owners) is
free, and that is what marks them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from gymflow.envs.errors import SandboxError
from gymflow.envs.runtime import network as net
from gymflow.envs.runtime import owners
from gymflow.envs.runtime.container import ROLLOUT_FILE, START_TIMEOUT_S, ContainerRuntime
from gymflow.envs.runtime.disk import RolloutDisk, disk_owner
from gymflow.envs.runtime.engine import LABEL_MARKER, LABEL_NODE, LABEL_OWNER, LABEL_ROLLOUT, LABEL_STATE, Engine


@dataclass(frozen=True)
class NodeContainer:
    """A gymflow container of a node, as the reaper sees it."""

    name: str
    rollout_id: str
    """Empty for a warm-pool container nobody took."""
    owner: str
    state: str
    running: bool


async def node_containers(engine: Engine, node_id: str) -> list[NodeContainer]:
    """Every container carrying gymflow's labels for `node_id`."""
    found = []
    for info in await engine.containers({LABEL_MARKER: "1", LABEL_NODE: node_id}):
        state = info.labels.get(LABEL_STATE, "")
        rollout = info.labels.get(LABEL_ROLLOUT, "")
        if not rollout and state:
            try:
                rollout = (Path(state) / ROLLOUT_FILE).read_text().strip()
            except OSError:
                rollout = ""
        found.append(NodeContainer(info.name, rollout, info.labels.get(LABEL_OWNER, ""), state, info.running))
    return found


async def orphans(
    engine: Engine, *, node_id: str, live_rollouts: Collection[str], owner: str | None = None
) -> list[NodeContainer]:
    """The node's containers that serve no live rollout.

    Args:
        engine: The node's engine.
        node_id: Whose containers.
        live_rollouts: Rollout ids still running on the node.
        owner: The live runtime's instance id (`ContainerRuntime.owner`); its untaken pool is kept.
            None: no runtime is live on the node, every container not serving a live rollout goes.
    """
    live = set(live_rollouts)
    return [c for c in await node_containers(engine, node_id) if _orphaned(c, live, owner)]


def _orphaned(container: NodeContainer, live: set[str], owner: str | None) -> bool:
    if owner is not None and container.owner != owner:
        return True  # made by a runtime instance that is gone: nothing can drive it again
    if container.rollout_id == "":
        return owner is None  # an untaken pool container: kept while its runtime lives
    return container.rollout_id not in live


async def reap(
    engine: Engine,
    *,
    node_id: str,
    state_root: Path,
    live_rollouts: Collection[str],
    owner: str | None = None,
) -> list[str]:
    """Remove the node's orphaned containers and their disks; returns the names removed."""
    doomed = await orphans(engine, node_id=node_id, live_rollouts=live_rollouts, owner=owner)
    await engine.remove([c.name for c in doomed])
    await asyncio.gather(*(RolloutDisk(Path(c.state)).destroy() for c in doomed if c.state))
    live = set(live_rollouts)
    stale = [
        n.name for n in await net.networks(engine, {LABEL_MARKER: "1", LABEL_NODE: node_id})
        if (owner is not None and n.labels.get(LABEL_OWNER) != owner) or n.labels.get(LABEL_ROLLOUT, "") not in live
    ]  # fmt: skip
    await _remove_networks(engine, stale)
    # State directories with no container at all: a worker killed between making a disk and `run`.
    kept = {Path(c.state).name for c in await node_containers(engine, node_id)}
    node_dir = state_root / node_id
    candidates = node_dir.glob("gymflow-*") if node_dir.is_dir() else []
    stray = [p for p in candidates if p.name not in kept and _unclaimed(p, state_root)]
    await asyncio.gather(*(RolloutDisk(p).destroy() for p in stray))
    return [c.name for c in doomed]


async def reap_host(engine: Engine, *, state_root: Path, runtime: ContainerRuntime | None = None) -> list[str]:
    """Remove every gymflow container of this host whose owner is dead, and those `runtime` (this
    worker's) made but no longer holds; then the disks no container uses. Returns the names removed.

    Containers of live owners other than `runtime` (sibling worker processes) are left alone.
    """
    found = await engine.containers({LABEL_MARKER: "1"})
    mine = set(runtime.live()) if runtime is not None else set()
    own = runtime.owner if runtime is not None else None
    doomed = []
    for info in found:
        owner = info.labels.get(LABEL_OWNER, "")
        if owner == own:
            if info.name not in mine:
                doomed.append(info)
        elif Path(info.labels.get(LABEL_STATE, "/")).is_relative_to(state_root) and not owners.alive(state_root, owner):
            doomed.append(info)
    await engine.remove([c.name for c in doomed])
    await asyncio.gather(
        *(RolloutDisk(Path(c.labels[LABEL_STATE])).destroy() for c in doomed if c.labels.get(LABEL_STATE))
    )
    kept = {Path(c.labels.get(LABEL_STATE, "")).name for c in found} - {c.name for c in doomed}
    stray = await asyncio.to_thread(_stray_disks, state_root, kept | mine)
    await asyncio.gather(*(RolloutDisk(p).destroy() for p in stray))
    stale = []  # rollout networks of dead owners, and this worker's whose rollout container is gone
    for network in await net.networks(engine, {LABEL_MARKER: "1"}):
        owner, state = network.labels.get(LABEL_OWNER, ""), Path(network.labels.get(LABEL_STATE, "/"))
        if owner == own:
            if state.name not in mine:
                stale.append(network.name)
        elif state.is_relative_to(state_root) and not owners.alive(state_root, owner):
            stale.append(network.name)
    await _remove_networks(engine, stale)
    return [c.name for c in doomed]


async def _remove_networks(engine: Engine, names: list[str]) -> None:
    """Remove networks one by one: one still in use (its rollout is being created) stays for the next round."""
    for name in names:
        with contextlib.suppress(SandboxError):
            await net.remove_networks(engine, [name])


def _stray_disks(state_root: Path, kept: set[str]) -> list[Path]:
    """Container state directories of the host that no container uses and no one is making (`_unclaimed`)."""
    return [p for p in state_root.glob("*/gymflow-*") if p.name not in kept and _unclaimed(p, state_root)]


def _unclaimed(path: Path, state_root: Path) -> bool:
    """Whether a disk directory no container uses may go: it is older than a container's start (a
    younger one may be a container being made right now), or its owner (written in it) is dead, so
    no one is making anything with it."""
    if not path.is_dir():
        return False
    if path.stat().st_mtime < time.time() - START_TIMEOUT_S:
        return True
    owner = disk_owner(path)
    return owner is not None and not owners.alive(state_root, owner)
