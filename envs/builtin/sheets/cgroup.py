"""Per-run pids cgroups: a process limit that holds whatever uid a sandboxed program runs as.

RLIMIT_NPROC counts the processes of a uid and is not enforced for root, so a program that runs as
root (bubblewrap at the worker's uid, or the ``unsafe-`` levels where the interpreter is out of a
sandbox uid's reach) had no bound on its processes: a fork bomb took the node down. A pids cgroup
bounds every task in it (processes and threads) whatever their uid, and names every process the
run left behind, so they can all be killed.

Design decisions:

* Only runs as root get one (`gymflow.envs.builtin.sheets.sandbox`): at any other uid RLIMIT_NPROC holds, and
  moving a process into a cgroup has a price (in v1 an RCU grace period per move).
* One cgroup per run, made under the cgroup this process is in (so a delegated subtree works: a
  container's, a systemd unit's with ``Delegate=yes``), named ``gymflow-run-<pid>-<n>``; after the
  run every task in it is killed and it is removed. Cgroups a dead process left behind are swept
  when the next process finds the parent.
* The program enters its cgroup before it runs anything: the command line starts with
  ``sh -c 'echo $$ > cgroup.procs && exec "$@"'``, so its first process is in the cgroup and so is
  everything it forks. Not ``preexec_fn``: that is unsafe in a threaded process (the MCP server
  runs programs from worker threads). If the write fails, nothing runs.
* cgroup v1 (the ``pids`` hierarchy, as on this project's machines) and v2 (the unified hierarchy
  where ``pids`` is among this cgroup's controllers and enabled, or can be enabled, for its
  children). v2's no-internal-processes rule keeps that from working in a non-root cgroup that
  holds processes itself (a plain systemd service): the reason says so, and the sandbox levels
  that need the cgroup for their process limit are not used for model code.
* ``$GYMFLOW_PIDS_CGROUP`` names the parent directory to use instead (a delegated subtree), or
  ``none`` to act as a machine without (tests).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ENV = "GYMFLOW_PIDS_CGROUP"
"""The directory per-run pids cgroups are made in (default: this process's own pids cgroup), or ``none``."""
PREFIX = "gymflow-run-"
KILL_DEADLINE_S = 5.0
"""How long killing a run's processes and removing its cgroup may take before it is left to the sweep."""

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_found: dict[str, Path | str] = {}
"""$GYMFLOW_PIDS_CGROUP -> the parent directory, or why there is none (found once per process)."""
_counter = itertools.count()


@dataclass(frozen=True)
class RunCgroup:
    """The pids cgroup of one run."""

    path: Path

    def enter(self) -> list[str]:
        """The command prefix that moves the program's first process into this cgroup, then execs it."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs")]

    def peak(self) -> int | None:
        """The most tasks the run had at once (None where the kernel does not keep ``pids.peak``)."""
        try:
            return int((self.path / "pids.peak").read_text())
        except (OSError, ValueError):
            return None

    def refused(self) -> int:
        """How many forks the limit refused (``pids.events``)."""
        try:
            match = re.search(r"^max (\d+)", (self.path / "pids.events").read_text(), re.MULTILINE)
        except OSError:
            return 0
        return int(match.group(1)) if match else 0

    def close(self) -> bool:
        """Kill every process in the cgroup and remove it; False if that did not finish in time."""
        return _kill_and_remove(self.path, deadline=time.monotonic() + KILL_DEADLINE_S)


def parent() -> Path | str:
    """Where this process makes per-run cgroups, or why it cannot (found once per process)."""
    key = os.environ.get(CGROUP_ENV, "")
    with _lock:
        found = _found.get(key)
        if found is None:
            found = _find(key)
            if isinstance(found, Path):
                _sweep(found)
            _found[key] = found
        return found


def available() -> bool:
    """Whether runs here get a pids cgroup."""
    return isinstance(parent(), Path)


def create(max_tasks: int) -> RunCgroup:
    """A fresh cgroup under `parent()` allowing `max_tasks` tasks.

    Raises:
        OSError: There is no usable parent, or the cgroup could not be made.
    """
    base = parent()
    if not isinstance(base, Path):
        raise OSError(errno.ENOENT, f"no pids cgroup: {base}")
    path = base / f"{PREFIX}{os.getpid()}-{next(_counter)}"
    path.mkdir()
    try:
        (path / "pids.max").write_text(str(max_tasks))
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()
        raise
    return RunCgroup(path)


# -- finding the parent ---------------------------------------------------------------------------
def _find(override: str) -> Path | str:
    if override.strip().lower() == "none":
        return f"${CGROUP_ENV}=none"
    if override:
        base = Path(override)
        if not (base / "cgroup.procs").is_file():
            return f"${CGROUP_ENV}={override} is not a cgroup directory"
    else:
        try:
            found = own_pids_cgroup(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
        except OSError as exc:
            return f"cannot read this process's cgroups: {exc}"
        if isinstance(found, str):
            return found
        base = found
    return _check(base)


def own_pids_cgroup(cgroups: str, mountinfo: str) -> Path | str:
    """The directory of a process's cgroup in the v1 ``pids`` hierarchy, else in the v2 one if it
    has the pids controller (enabled for its children here), or why there is none.

    Args:
        cgroups: The process's ``/proc/<pid>/cgroup``.
        mountinfo: Its ``/proc/<pid>/mountinfo``.
    """
    v1 = v2 = None
    for line in cgroups.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            v2 = path
        elif "pids" in controllers.split(","):
            v1 = path
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line:
            continue
        fstype, _, options = line.split(" - ", 1)[1].split()[:3]
        root, point = fields[3], fields[4].replace("\\040", " ")
        if v1 is not None and fstype == "cgroup" and "pids" in options.split(","):
            return Path(point) / _relative(v1, root)
        if v1 is None and v2 is not None and fstype == "cgroup2":
            base = Path(point) / _relative(v2, root)
            try:
                if "pids" not in (base / "cgroup.controllers").read_text().split():
                    return f"the cgroup v2 hierarchy has no pids controller at {base}"
            except OSError as exc:
                return f"cannot read {base / 'cgroup.controllers'}: {exc}"
            return _enable_v2(base)
    return "no pids cgroup controller is mounted (neither cgroup v1 pids nor v2 with pids)"


def _relative(path: str, mount_root: str) -> str:
    """`path` (as /proc/self/cgroup names it) below a mount of the hierarchy at `mount_root`."""
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root) :]
    return path.lstrip("/")


def _enable_v2(base: Path) -> Path | str:
    """`base` once ``pids`` is enabled for its children (v2), or why it cannot be."""
    control = base / "cgroup.subtree_control"
    try:
        if "pids" not in control.read_text().split():
            control.write_text("+pids")
    except OSError as exc:
        return (
            f"cannot enable the pids controller for children of {base} ({exc.strerror}; cgroup v2 allows it "
            "only in a cgroup holding no processes): run the worker in a delegated cgroup and name it in "
            f"${CGROUP_ENV}"
        )
    return base


def _check(base: Path) -> Path | str:
    """`base` if a child cgroup with a pids limit can be made there, else why not."""
    probe = base / f"{PREFIX}{os.getpid()}-probe"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"cannot make a cgroup under {base}: {exc.strerror}"
    try:
        (probe / "pids.max").write_text("8")
    except OSError as exc:
        return f"the cgroup {base} gives its children no pids limit: {exc.strerror}"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return base


# -- cleaning up ----------------------------------------------------------------------------------
def _kill_and_remove(path: Path, *, deadline: float) -> bool:
    """SIGKILL what is in the cgroup at `path` until it is empty, then remove it (by `deadline`)."""
    kill = path / "cgroup.kill"  # v2, Linux 5.14+: the kernel kills them all at once
    while True:
        try:
            if kill.exists():
                kill.write_text("1")
            else:
                for pid in (path / "cgroup.procs").read_text().split():
                    _kill_member(int(pid), path)
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                _log.warning("could not remove the sandbox cgroup %s: %s", path, exc)
                return False
        time.sleep(0.01)  # killed processes leave the cgroup once they have exited


def _kill_member(pid: int, path: Path) -> None:
    """SIGKILL `pid` if it is still in the cgroup at `path` (a pidfd: a reused pid is never hit)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone already
    try:
        if _cgroup_of(pid).endswith("/" + path.name):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def _cgroup_of(pid: int) -> str:
    """The pids (v1) or unified (v2) cgroup path of `pid`."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        controllers, _, cgroup_path = line.partition(":")[2].partition(":")
        if "pids" in controllers.split(","):
            return cgroup_path
    return next((line.split("::", 1)[1] for line in lines if line.startswith("0::")), "")


def _sweep(base: Path) -> None:
    """Kill and remove the run cgroups of processes that no longer exist (a worker that died mid-run)."""
    try:
        entries = list(base.iterdir())
    except OSError:
        return
    for entry in entries:
        match = re.fullmatch(rf"{PREFIX}(\d+)-\w+", entry.name)
        if match is None or int(match.group(1)) == os.getpid() or Path(f"/proc/{match.group(1)}").exists():
            continue
        _kill_and_remove(entry, deadline=time.monotonic() + KILL_DEADLINE_S)
