"""A ledger of the server processes and workspaces a worker holds, so a new worker can reap orphans.

MCP servers run in their own process groups (so a hung one can be killed with its children),
which also means they outlive a worker that dies without cleaning up: an HTTP server never
notices, and a stdio server whose grandchildren hold its pipes may not either. So each env
instance records, before it creates anything, what it is about to own:

    <env workspace root>/.ledger/<owner pid>.<owner start time>/<entry>.json
        {"workspace": "/…/rollout-dir", "pids": [[pid, start time], …]}

and deletes the entry when it frees it. `reap_orphans` (run at worker start) looks at every owner
directory whose process is gone (a pid reused by another process is told apart by its start time),
kills the recorded process groups, again only processes whose start time matches, deletes the
workspaces, and removes the entries. Owners that are alive, this process included, are never
touched. Start times come from /proc, so reaping is Linux-only; elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

LEDGER_DIR = ".ledger"
"""Name of the ledger directory inside an env's workspace root."""
_SEARCH_DEPTH = 3
"""Ledgers are found at most this many levels below the root (root/node/env/.ledger)."""


def start_time(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot), or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may contain spaces, so split after its closing paren.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _process_group(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


class Ledger:
    """What one env instance in this process owns, on disk."""

    def __init__(self, root: Path) -> None:
        pid = os.getpid()
        self.dir = root / f"{pid}.{start_time(pid) or 0}"

    def record(self, entry: str, *, workspace: Path, pids: Iterable[int | None] = ()) -> None:
        """Write (or rewrite) an entry: the workspace and the server pids it holds."""
        self.dir.mkdir(parents=True, exist_ok=True)
        body = {"workspace": str(workspace), "pids": [[p, start_time(p)] for p in pids if p is not None]}
        tmp = self.dir / f".{entry}.tmp"
        tmp.write_text(json.dumps(body))
        tmp.replace(self.dir / f"{entry}.json")  # atomic: a reaper never reads half an entry

    def forget(self, entry: str) -> None:
        """Drop an entry whose processes and workspace are gone."""
        (self.dir / f"{entry}.json").unlink(missing_ok=True)

    def close(self) -> None:
        """Remove this owner's directory once nothing is recorded in it (clean shutdown)."""
        with contextlib.suppress(OSError):
            self.dir.rmdir()


@dataclass
class ReapReport:
    """What `reap_orphans` cleaned up."""

    owners: list[str] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    workspaces: list[Path] = field(default_factory=list)


def reap_orphans(root: Path) -> ReapReport:
    """Kill the servers and delete the workspaces that dead workers left under `root`."""
    report = ReapReport()
    if not Path("/proc/self/stat").exists():
        return report
    for ledger in _find_ledgers(root):
        for owner in sorted(ledger.iterdir()):
            if owner.is_dir() and not _owner_alive(owner.name):
                _reap_owner(owner, report)
    if report.owners:
        log.warning(
            "reaped orphans of dead workers",
            extra={"processes": len(report.killed), "workspaces": len(report.workspaces), "owners": len(report.owners)},
        )
    return report


def live_processes(root: Path, owner_pid: int | None = None) -> int:
    """Processes recorded under `root` by `owner_pid` (default: this process) that still run: the
    MCP servers it holds, warm pool included (a worker's metrics). 0 where /proc is missing."""
    pid = os.getpid() if owner_pid is None else owner_pid
    owner = f"{pid}.{start_time(pid) or 0}"
    count = 0
    for ledger in _find_ledgers(root):
        for entry in (ledger / owner).glob("*.json"):
            try:
                pids = json.loads(entry.read_text()).get("pids", [])
            except (OSError, ValueError):
                continue  # freed meanwhile
            count += sum(1 for child, started in pids if started is not None and start_time(int(child)) == started)
    return count


def _find_ledgers(root: Path) -> list[Path]:
    found = []
    for depth in range(_SEARCH_DEPTH + 1):
        found += [p for p in root.glob("/".join(["*"] * depth + [LEDGER_DIR])) if p.is_dir()]
    return found


def _owner_alive(name: str) -> bool:
    pid_text, _, start_text = name.partition(".")
    if not (pid_text.isdigit() and start_text.isdigit()):
        return True  # not ours: leave it alone
    started = start_time(int(pid_text))
    return started is not None and (int(start_text) == 0 or started == int(start_text))


def _reap_owner(owner: Path, report: ReapReport) -> None:
    report.owners.append(owner.name)
    env_root = owner.parent.parent
    for entry in owner.glob("*.json"):
        try:
            body = json.loads(entry.read_text())
        except (OSError, ValueError):
            body = {}
        for pid, started in body.get("pids", []):
            report.killed += _kill_group(int(pid), started)
        workspace = Path(body.get("workspace", ""))
        if workspace.parent == env_root and workspace.name:  # never delete outside the env's root
            shutil.rmtree(workspace, ignore_errors=True)
            for stderr_log in env_root.glob(f"{workspace.name}.*.stderr.log"):
                stderr_log.unlink(missing_ok=True)
            report.workspaces.append(workspace)
        entry.unlink(missing_ok=True)
    shutil.rmtree(owner, ignore_errors=True)


def _kill_group(leader: int, started: int | None) -> list[int]:
    """Kill the process group `leader` started, if it is still that group (start times checked)."""
    if started is None:
        return []
    members = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        pid = int(proc.name)
        # A member of the group was started no earlier than its leader; a newer group reusing
        # the number would have a leader with another start time.
        when = start_time(pid)
        if _process_group(pid) == leader and when is not None and when >= started:
            if pid == leader and when != started:
                return []
            members.append(pid)
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return members


def pid_alive(pid: int) -> bool:
    """Whether `pid` still runs; a child of ours that has exited is reaped on the way.

    /proc/PID/stat shows the main thread only: a multi-threaded worker whose main thread is done
    reads "Z" while its other threads still wind down, and cannot be reaped yet. So a process
    counts as gone once it is reaped (our child) or every one of its threads is a zombie.
    """
    try:
        with contextlib.suppress(ChildProcessError):
            reaped, _ = os.waitpid(pid, os.WNOHANG)
            return reaped == 0  # our child: alive until reaped
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    return any(_state(task / "stat") not in {"Z", "X", None} for task in tasks)


def _state(stat: Path) -> str | None:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
