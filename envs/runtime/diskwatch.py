"""Disk caps a node can state: what each engine gives, and the watchdog where it gives no hard cap.

Three guarantees, from strongest to weakest (`DiskGuarantee`):

* `hard-root` (podman): the container runs on an overlay whose upper layer, like its workspace, sits
  on a loop-mounted ext4 of `storage_mb` (gymflow.envs.runtime.disk): every write anywhere fails
  with ENOSPC at the cap.
* `hard-layer` (docker where the daemon takes `--storage-opt size=`, i.e. overlay2 on XFS with project
  quotas): the writable layer is capped by the daemon, the workspace by its own ext4; each is capped
  at `storage_mb`.
* `watched` (docker elsewhere, e.g. overlay2 on ext4, as on these nodes, where that option is
  refused): the workspace is still a loop-mounted ext4 (writes fail at the cap there); the writable
  layer cannot be capped, so it is measured while the container lives, and once the layer plus the
  workspace pass `storage_mb` the container is killed and every later command of the rollout
  reports it (`ExecResult.disk_exceeded`, a tool error the model sees). The writes between two
  measurements are not bounded: a fast writer overshoots by what it writes in one interval.

A task that must have writes fail at the cap (`Limits.storage_hard`) is refused on a `watched` node
before its container starts (`DiskCapUnavailable`, infra: never a score). The node says which
guarantee it gives in `gymflow envs show harbor` and in the worker's start log.

The watchdog walks the writable layer's directory on the host (docker's `GraphDriver.Data.UpperDir`)
and sums allocated blocks, each inode once. The walk's cost grows with the files in the layer, so
the interval adapts: at least `MIN_INTERVAL_S`, at least `COST_FACTOR` times the last walk, at
most `MAX_INTERVAL_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from gymflow.envs.errors import SandboxError
from gymflow.envs.runtime.engine import LABEL_MARKER, Engine, client_dir

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.5
MAX_INTERVAL_S = 5.0
COST_FACTOR = 10.0
"""The watchdog spends at most about a tenth of a core per container on walking."""


class DiskGuarantee(enum.StrEnum):
    """What a node promises about a container's disk cap."""

    HARD_ROOT = "hard-root"
    HARD_LAYER = "hard-layer"
    WATCHED = "watched"

    @property
    def hard(self) -> bool:
        """Whether writes fail at the cap (rather than being caught after the fact)."""
        return self is not DiskGuarantee.WATCHED

    def describe(self) -> str:
        """One line for `envs show` and the worker's start log."""
        return {
            DiskGuarantee.HARD_ROOT: "hard: every write of the container (root and workspace) fails at storage_mb "
            "(a loop-mounted ext4 under its overlay root)",
            DiskGuarantee.HARD_LAYER: "hard: the writable layer is capped by the engine (--storage-opt size), the "
            "workspace by a loop-mounted ext4",
            DiskGuarantee.WATCHED: "watched: the workspace fails at storage_mb (a loop-mounted ext4); the writable "
            "layer cannot be capped on this engine's storage, so it is measured every "
            f"{MIN_INTERVAL_S:g}-{MAX_INTERVAL_S:g} s and a container over the cap is killed (a tool error); "
            "tasks with storage_hard are refused",
        }[self]


class DiskCapUnavailable(SandboxError):
    """The task needs a hard disk cap (`storage_hard`) and this node can only watch the disk."""


async def probe_storage_opt(engine: Engine, image: str) -> DiskGuarantee:
    """Whether docker caps a writable layer here (`--storage-opt size`): create a container, never start it."""
    name = f"gymflow-probe-{uuid.uuid4().hex[:8]}"
    done = await engine.run(
        ["create", "--name", name, "--label", f"{LABEL_MARKER}=1", "--storage-opt", "size=64m", image, "true"],
        check=False,
    )
    await engine.remove([name])
    if done.returncode == 0:
        return DiskGuarantee.HARD_LAYER
    if "storage-opt" in done.stderr or "storage opt" in done.stderr.lower():
        return DiskGuarantee.WATCHED
    raise SandboxError(f"cannot probe docker's disk caps with {image}: {done.stderr.strip()[-500:]}")


def node_guarantee(engine: Engine) -> DiskGuarantee:
    """What the node's engine promises, without starting anything (docker: from `docker info`; on XFS
    the first container's probe may still find the quotas off, and then the node watches)."""
    if engine.kind == "podman":
        return DiskGuarantee.HARD_ROOT
    try:
        done = subprocess.run(
            [engine.binary, "info", "--format", "{{.Driver}} {{json .DriverStatus}}"],
            capture_output=True, text=True, timeout=30, cwd=client_dir(), env=engine.client_env(), check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return DiskGuarantee.WATCHED
    driver, _, status = done.stdout.strip().partition(" ")
    return DiskGuarantee.HARD_LAYER if driver == "overlay2" and '"xfs"' in status else DiskGuarantee.WATCHED


def allocated_bytes(root: Path) -> int:
    """Bytes allocated under `root` (blocks, each inode once; a file vanishing meanwhile is skipped)."""
    seen: set[int] = set()
    total = 0
    stack = [str(root)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if info.st_ino in seen:
                    continue
                seen.add(info.st_ino)
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total


class DiskWatch:
    """Measures a container's writable layer (plus a baseline-corrected workspace) until it passes the cap."""

    def __init__(
        self,
        *,
        layer: Path,
        workspace_used: Callable[[], int],
        cap_bytes: int,
        on_exceeded: Callable[[int], Awaitable[None]],
    ) -> None:
        self.layer = layer
        self.workspace_used = workspace_used
        self.cap_bytes = cap_bytes
        self.on_exceeded = on_exceeded
        self.baseline = workspace_used()
        """The empty workspace filesystem's own metadata, not the container's writes."""
        self.used = 0
        self.walks = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def measure(self) -> int:
        """The container's writes now: its writable layer and its workspace."""
        layer = await asyncio.to_thread(allocated_bytes, self.layer)
        self.walks += 1
        self.used = layer + max(0, self.workspace_used() - self.baseline)
        return self.used

    async def _run(self) -> None:
        interval = MIN_INTERVAL_S
        while True:
            started = time.monotonic()
            try:
                used = await self.measure()
            except OSError as exc:  # the container is going away
                log.debug("disk watch of %s stopped: %s", self.layer, exc)
                return
            if used > self.cap_bytes:
                await self.on_exceeded(used)
                return
            cost = time.monotonic() - started
            interval = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, COST_FACTOR * cost))
            await asyncio.sleep(interval)
