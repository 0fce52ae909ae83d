"""Which runtime instances on a host are alive: a lock file each, held for the instance's life.

Every container carries the id of the runtime instance (one worker process) that made it
(`gymflow.owner`). Node ids are per process, so a worker killed with SIGKILL leaves containers whose
node no live worker serves; the reaper of any other worker on the host finds them because their
owner's lock is free. The kernel drops a `flock` when its process dies, however it dies, so a
free lock means a dead owner, and a held one a live owner (another worker process of this host).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

OWNERS_DIR = "owners"


def owner_lock(state_root: Path, owner: str) -> Path:
    return state_root / OWNERS_DIR / f"{owner}.lock"


def hold(state_root: Path, owner: str) -> int:
    """Take `owner`'s lock for as long as this process lives (or until `release`); returns its fd."""
    path = owner_lock(state_root, owner)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def release(state_root: Path, owner: str, fd: int) -> None:
    """Give the lock up and remove its file (the owner is closing)."""
    with contextlib.suppress(OSError):
        owner_lock(state_root, owner).unlink()
    with contextlib.suppress(OSError):
        os.close(fd)


def alive(state_root: Path, owner: str) -> bool:
    """Whether a live process holds `owner`'s lock; a dead owner's lock file is removed."""
    if not owner:
        return False
    path = owner_lock(state_root, owner)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        path.unlink()
    return False
