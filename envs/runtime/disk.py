"""A container's disk: a size-capped filesystem holding everything the container can write.

Podman's per-container size option (`--storage-opt size=`) needs overlay on XFS with project
quotas; these nodes keep container storage on ext4, and their kernel has no quota support at all
(XFS mounts say "quota support not available", ext4's quota mode is none). So the cap is a
filesystem of its own: a sparse file of `storage_mb` formatted ext4 and loop-mounted, holding

* `upper/` and `work/`: the upper layer of an overlay whose lower layer is the image (mounted with
  `podman image mount`); the container runs on that overlay (`--rootfs`), so every write anywhere
  in it (`/app`, `/tmp`, `/usr`, ...) lands on the capped filesystem and fails with ENOSPC at the
  cap;
* `ws/`: the rollout's workspace, bind-mounted into the container, capped by the same filesystem.

Docker has no `--rootfs`: under docker the same filesystem holds only `ws/` (the workspace, capped
hard), and the container's writable layer is watched instead (gymflow.envs.runtime.diskwatch).

It costs a `mkfs.ext4` and two mounts per container (a sparse file: no space is used up front) and a
loop device while the container lives; the loop device detaches itself on unmount (`-o loop`
sets autoclear). Everything sits in one directory per container, so the reaper can unmount and
delete what a killed worker left (`destroy` works on any directory this module made).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

from gymflow.envs.errors import SandboxError

_TOOL_TIMEOUT_S = 60.0


OWNER_FILE = "owner"
"""The file in a disk's directory naming the runtime that made it."""


def disk_owner(path: Path) -> str | None:
    """The owner written in the disk directory `path`, if any."""
    try:
        return (path / OWNER_FILE).read_text().strip() or None
    except OSError:
        return None


class RolloutDisk:
    """The directory `path`: `disk.img`, `disk/` (its mount: `upper/`, `work/`, `ws/`), `root/` (the overlay)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.image = path / "disk.img"
        self.mountpoint = path / "disk"
        self.root = path / "root"
        self.workspace = self.mountpoint / "ws"

    async def create(self, *, lower: str | None, size_mb: int, owner: str | None = None) -> None:
        """Make the capped filesystem and the overlay root over `lower` (an image's mounted root; None:
        the capped filesystem and its workspace only). `owner` (the runtime that makes it) is written
        beside it first (`OWNER_FILE`), so a reaper can tell a dead owner's half-made disk from one
        being made right now.

        Raises:
            SandboxError: A host tool failed (mkfs, mount); what was made is undone.
        """
        try:
            self.path.mkdir(parents=True, exist_ok=False)
            if owner:
                (self.path / OWNER_FILE).write_text(owner)
            self.mountpoint.mkdir()
            self.root.mkdir()
            with self.image.open("wb") as handle:
                handle.truncate(size_mb * 1024 * 1024)
            # No journal and no reserved blocks: a scratch disk the container may fill to the last block.
            await host(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", str(self.image)])
            await host(["mount", "-o", "loop", str(self.image), str(self.mountpoint)])
            for sub in ("upper", "work", "ws"):
                (self.mountpoint / sub).mkdir()
            if lower is None:
                return
            options = f"lowerdir={lower},upperdir={self.mountpoint / 'upper'},workdir={self.mountpoint / 'work'}"
            await host(["mount", "-t", "overlay", "overlay", "-o", options, str(self.root)])
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.destroy())
            raise

    def used_bytes(self) -> int:
        """Bytes in use on the capped filesystem (its own metadata included)."""
        stats = os.statvfs(self.mountpoint)
        return (stats.f_blocks - stats.f_bfree) * stats.f_frsize

    async def destroy(self) -> None:
        """Unmount and delete everything (idempotent; a busy mount is detached lazily)."""
        for target in (self.root, self.mountpoint):
            if target.is_mount():
                done = await host(["umount", str(target)], check=False)
                if done != 0:
                    await host(["umount", "-l", str(target)], check=False)
        await asyncio.to_thread(shutil.rmtree, self.path, True)


async def host(argv: list[str], *, check: bool = True) -> int:
    """Run a host tool; with `check`, a non-zero exit raises SandboxError with its output."""
    if shutil.which(argv[0]) is None:
        raise SandboxError(f"{argv[0]} is not installed on this node (the container disk needs it)")
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), _TOOL_TIMEOUT_S)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    if check and process.returncode != 0:
        raise SandboxError(
            f"`{' '.join(argv[:3])}` failed ({process.returncode}): {output.decode(errors='replace')[-1000:]}"
        )
    return process.returncode or 0
