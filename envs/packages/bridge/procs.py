"""The bridge's processes: it owns every process an env package starts, and kills them all.

A per-rollout bridge runs in its own process group, which gymflow kills on release. But env code
starts servers in process groups of their own: benchmax's `LocalMCPEnv` starts its MCP servers
through an MCP 1.x stdio client that puts each in a new session, and it never stops some of them.
Killing the bridge's group would leave those behind. So the bridge makes itself a child subreaper
(orphans of its children are re-parented to it, not to init, and stay its descendants) and, when a
rollout is released, when its stdin closes (the worker went away, even by SIGKILL) and when it
exits, kills every descendant and their process groups (`kill_descendants`). Linux only (/proc);
elsewhere these do nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Adopt the orphans of this process's children (Linux; a no-op elsewhere)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, process group) of `pid`, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[2])


def descendants(root: int | None = None) -> list[tuple[int, int]]:
    """(pid, process group) of every live descendant of `root` (default: this process)."""
    root = os.getpid() if root is None else root
    parents: dict[int, list[tuple[int, int]]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _stat(entry)) is not None:
                parents.setdefault(stat[0], []).append((int(entry), stat[1]))
    found: list[tuple[int, int]] = []
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def kill_descendants() -> int:
    """SIGKILL every descendant and the process groups they lead or joined (never this process's own
    group); reap the zombies. Returns how many processes were signalled."""
    own_group = os.getpgrp()
    found = descendants()
    for pid, group in found:
        if group != own_group:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    reap()
    return len(found)


def reap() -> None:
    """Collect exited children (as a subreaper, orphans' exit statuses come here)."""
    with contextlib.suppress(ChildProcessError, OSError):
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
