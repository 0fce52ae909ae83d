"""Run untrusted Python (the model's code) against one workspace directory, as isolated as this machine allows.

Three levels, strongest first; `Sandbox()` probes once per process and takes the strongest mode
that works (``Sandbox(level=...)`` forces a level, and fails loudly if it cannot run). Whether
model-written code may run at the mode found is decided above this module, in
`gymflow.envs.builtin.sheets.isolation` (only bwrap keeps it from the answers; ``GYMFLOW_SANDBOX``):

* ``bwrap`` (bubblewrap): new mount, pid, net, ipc and uts namespaces. The program sees only the
  workspace (read-write, at ``/workspace``), the Python installation and its venv (read-only), the
  system libraries, a private size-capped ``/tmp``, ``/proc`` and a minimal ``/dev``. No network
  interface but loopback. Everything else (the answer files, the repo, ``/etc``) is not there.
* ``unshare`` (util-linux): new net, pid, ipc and uts namespaces, no mount confinement: every
  file the program's uid may read is there (as the caller's uid, all of them).
* ``rlimits``: resource limits and the wall timeout only.

``GYMFLOW_BWRAP`` names the bubblewrap binary (default: ``bwrap`` on the PATH); a path that does
not exist makes a machine without bubblewrap, for tests.

Every level adds: rlimits (CPU seconds, address space, file size, processes, open files, no core
files) applied by ``prlimit`` before anything runs, a pids cgroup of its own where it runs as root
(`gymflow.envs.builtin.sheets.cgroup`), a wall-clock timeout that kills the process group, output captured
to files (a program printing forever hits the file-size limit, never the caller's memory),
``python -I`` (no PYTHON* variables, no user site, the workspace is not on
``sys.path``, so a planted ``openpyxl.py`` is not imported) and a scrubbed environment.

Design decisions:

* Own uid. Run as root (workers here are), each `Sandbox` gets its own unprivileged uid
  (`allocate_uid`) and drops to it with ``setpriv`` right before ``python`` starts (caps cleared,
  no_new_privs). Three things depend on it: RLIMIT_NPROC is not enforced for root, so without it
  a fork bomb is unbounded; files that are not world-readable (the answer cache is 0700) stay
  unreadable even at the weaker levels; and after each run every process of that uid is killed,
  so nothing the program left behind (a daemon that escaped the process group) survives it.
  Without root, the program runs as the caller's uid and the process limit is counted on top of
  the caller's own processes.
* A pids cgroup per run where the program runs as root (bwrap at the caller's uid, the weaker
  levels where a sandbox uid cannot reach the interpreter) and this process can make one (v1 or
  v2): it bounds the run's tasks whatever their uid, so such a mode still promises
  ``PROCESS_LIMIT``; without one it does not, and `gymflow.envs.builtin.sheets.isolation` runs no model code
  there. After each run every process left in the cgroup is killed and the cgroup removed.
* bwrap runs as root without a user namespace (a root-mapped user namespace would keep the
  processes' real uid 0 and with it the NPROC exemption), so parents of bind mounts are created
  explicitly with mode 0755: bwrap would make them 0700, unreadable once the uid is dropped.
* A mode is a level plus whether the uid is dropped. Below bwrap, a dropped uid must reach the
  interpreter on the real filesystem; where it cannot (a pyenv Python under a 0700 /root, as on
  this project's machines) the probe (which imports the stdlib and openpyxl) fails and the next
  mode is tried, ending with the caller's uid: no private files (and, as root without a pids
  cgroup, no process limit), said so in `guarantees`. A mode passed over is logged once, with why.
* The workspace is chowned to the sandbox uid before each run (not following symlinks, skipping
  hard-linked files), because files are staged into it by the worker after the server started.
* Which guarantees hold is data (`Sandbox.guarantees`), so tests assert exactly those of the
  active level and the env can report them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gymflow.envs.builtin.sheets import cgroup
from gymflow.envs.builtin.sheets.runs import WRAPPER_TASKS, Guarantee, Level, RunResult
from gymflow.envs.runtime import confine
from gymflow.envs.runtime.confine import SANDBOX_DIR, Limits, SandboxUnavailable
from gymflow.envs.runtime.workspace import usage

__all__ = ["SANDBOX_DIR", "Guarantee", "Level", "Limits", "RunResult", "Sandbox", "SandboxUnavailable", "detect"]

REQUIRE_ENV = "GYMFLOW_SANDBOX_REQUIRE"
"""Set by .ci/run when it installed bubblewrap: the tests then fail unless that level is active."""
MB = 1024 * 1024
UID_BASE = 1 << 30
"""Sandbox uids are allocated in [2**30, 2**31): far from real users and subuid ranges."""
_log = logging.getLogger(__name__)


_probe_lock = threading.Lock()
_probes: dict[tuple[Level, bool, str, str], str | None] = {}
"""(level, own uid, $GYMFLOW_BWRAP, $GYMFLOW_PIDS_CGROUP) -> None when it works here, else why not
(probed once per process)."""
_passed_over: set[tuple[Level, bool, str]] = set()
"""Modes `detect` passed over and logged, with the reason (each is logged once per process)."""
_uid_counter = itertools.count()


def is_root() -> bool:
    """Whether this process can drop each sandbox to its own uid."""
    return os.geteuid() == 0


def allocate_uid() -> int:
    """A fresh sandbox uid: unique per (process, call) for pids below 2**18."""
    return UID_BASE + ((os.getpid() << 12) + next(_uid_counter) % 4096) % UID_BASE


def guarantees(level: Level, *, own_uid: bool) -> frozenset[Guarantee]:
    """The guarantees of a mode (own_uid: the program runs as its own unprivileged uid)."""
    result = {Guarantee.LIMITS}
    if own_uid or not is_root() or cgroup.available():
        result.add(Guarantee.PROCESS_LIMIT)
    if own_uid:
        result.add(Guarantee.PRIVATE_FILES)
    if level in (Level.BWRAP, Level.UNSHARE):
        result |= {Guarantee.NO_NETWORK, Guarantee.PID_ISOLATED}
    if level is Level.BWRAP:
        result |= {Guarantee.FS_CONFINED, Guarantee.PRIVATE_FILES}
    return frozenset(result)


def probe(level: Level, *, own_uid: bool) -> str | None:
    """None when `level` works here (own_uid: dropping to a sandbox uid), else why not (cached)."""
    key = (level, own_uid, os.environ.get(confine.BWRAP_ENV, ""), os.environ.get(cgroup.CGROUP_ENV, ""))
    with _probe_lock:
        if key not in _probes:
            _probes[key] = _probe(level, own_uid)
        return _probes[key]


def modes() -> list[tuple[Level, bool]]:
    """Every (level, own_uid) mode in order of preference: a private uid first, then namespaces."""
    if not is_root():
        return [(level, False) for level in Level]
    return [
        (Level.BWRAP, True),
        (Level.UNSHARE, True),
        (Level.RLIMITS, True),
        (Level.BWRAP, False),
        (Level.UNSHARE, False),
        (Level.RLIMITS, False),
    ]


def detect(requested: str | Level | None = None, *, log_level: int = logging.WARNING) -> tuple[Level, bool]:
    """The mode to use: the best that works, of level `requested` if one is named.

    Each mode passed over on the way to the one returned is logged once per process, with why, at
    `log_level` (a fallback the operator should hear of; the reasons of a failure are in the error).

    Raises:
        SandboxUnavailable: No mode of the named level (or none at all) works here.
    """
    name = str(requested or "auto").lower()
    wanted: Level | None = None
    if name != "auto":
        try:
            wanted = Level(name)
        except ValueError:
            raise SandboxUnavailable(
                f"unknown sandbox level {name!r}; choose bwrap, unshare, rlimits or auto"
            ) from None
    failed: dict[str, list[tuple[Level, bool]]] = {}  # reason -> the modes that failed for it
    for level, own_uid in modes():
        if wanted is not None and level is not wanted:
            continue
        reason = probe(level, own_uid=own_uid)
        if reason is None:
            _log_passed_over(failed, (level, own_uid), log_level)
            return level, own_uid
        failed.setdefault(reason, []).append((level, own_uid))
    reasons = [f"{', '.join(_mode_name(*mode) for mode in modes)}: {why}" for why, modes in failed.items()]
    raise SandboxUnavailable("no sandbox mode works here: " + "; ".join(reasons))


def _mode_name(level: Level, own_uid: bool) -> str:
    return f"{level}{' (own uid)' if own_uid else ' (caller uid)' if is_root() else ''}"


def _log_passed_over(failed: dict[str, list[tuple[Level, bool]]], chosen: tuple[Level, bool], level: int) -> None:
    for reason, passed in failed.items():
        for mode in passed:
            with _probe_lock:
                first = (*mode, reason) not in _passed_over
                _passed_over.add((*mode, reason))
            if first:
                names = _mode_name(*mode), _mode_name(*chosen)
                _log.log(level, "sandbox mode %s passed over for %s: %s", *names, reason)


class Sandbox:
    """Runs Python programs against a workspace at one isolation level, one run at a time."""

    def __init__(
        self,
        *,
        level: str | Level | None = None,
        own_uid: bool | None = None,
        limits: Limits | None = None,
        uid: int | None = None,
        nice: int = 0,
    ):
        """Args:
        level: A level name, or None for the strongest available.
        own_uid: Whether to drop to a sandbox uid (root only). With `level` and this both given
            nothing is probed (a server trusts the mode its worker detected).
        limits: Default limits of each run.
        uid: The sandbox uid when dropping; default a fresh one.
        nice: Niceness added to each run's process (a worker's own runs go below the worker).
        """
        self.nice = nice
        if level is not None and own_uid is not None:
            self.level, drop = Level(level), own_uid and is_root()
        else:
            self.level, drop = detect(level)
        self.limits = limits or Limits()
        self.uid = (uid if uid is not None else allocate_uid()) if drop else None
        self.guarantees = guarantees(self.level, own_uid=drop)
        self._lock = threading.Lock()

    def describe(self) -> str:
        """The level and its guarantees, for logs and reports."""
        return f"{self.level} ({', '.join(sorted(self.guarantees))})"

    def run(self, code: str, *, workspace: Path, args: Sequence[str] = (), limits: Limits | None = None) -> RunResult:
        """Run `code` (a Python program, fed on stdin) with `workspace` as its working directory.

        Args:
            code: The program text.
            workspace: The only directory the program may write (and, under bwrap, see).
            args: ``sys.argv[1:]`` of the program.
            limits: Overrides the sandbox's default limits for this run.

        Returns:
            The exit status and the (bounded) output; never raises for anything the program does.
        """
        lim = limits or self.limits
        workspace = workspace.resolve()
        with self._lock, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            if self.uid is not None:
                confine.claim(workspace, self.uid)
            over: Callable[[], bool] | None = None
            if lim.workspace_mb is not None:
                # Growth past the quota stops the run; a workspace already over it may still
                # shrink (a program deleting files), so the bound is the larger of the two.
                bound = max(lim.workspace_mb * MB, usage(workspace))
                left_mb = max(1, (lim.workspace_mb * MB - usage(workspace)) // MB)
                lim = dataclasses.replace(lim, file_mb=min(lim.file_mb, left_mb))
                over = lambda: usage(workspace) > bound  # noqa: E731 - a closure over the bound
            command, env, cwd = self._command(workspace, list(args), lim)
            run_cgroup = self._cgroup(lim)
            started = time.perf_counter()
            try:
                if run_cgroup is not None:
                    command = [*run_cgroup.enter(), *command]
                proc = subprocess.Popen(
                    command, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=cwd, env=env, start_new_session=True
                )
                if self.nice > 0:
                    with contextlib.suppress(OSError):  # gone already
                        own = os.getpriority(os.PRIO_PROCESS, 0)
                        os.setpriority(os.PRIO_PROCESS, proc.pid, min(19, own + self.nice))
                threading.Thread(target=confine.feed, args=(proc, code.encode()), daemon=True).start()
                timed_out, over_quota, cpu_s = confine.wait(proc, lim.wall_s, over=over)
                if self.uid is not None:
                    confine.kill_uid(self.uid)
                peak, refused = (run_cgroup.peak(), run_cgroup.refused()) if run_cgroup else (None, 0)
            finally:
                if run_cgroup is not None:
                    run_cgroup.close()  # kills whatever the run left, wherever it went
            return RunResult(
                returncode=proc.returncode,
                stdout=confine.read_bounded(out, lim.output_chars),
                stderr=confine.read_bounded(err, lim.output_chars),
                duration_ms=(time.perf_counter() - started) * 1000,
                level=self.level,
                limits=lim,
                timed_out=timed_out,
                cpu_s=cpu_s,
                over_quota=over_quota,
                peak_tasks=peak,
                forks_refused=refused,
            )

    def _cgroup(self, lim: Limits) -> cgroup.RunCgroup | None:
        """The run's pids cgroup when the program runs as root and the mode promises a process limit.

        At any other uid RLIMIT_NPROC bounds the run and (as root) `confine.kill_uid` clears what
        it leaves, so those runs skip the cgroup and the price of moving into it (in v1 an RCU
        grace period, milliseconds to tens of them on a busy machine).

        Raises:
            SandboxUnavailable: The mode's process limit rests on the cgroup and none could be
                made: the program must not run.
        """
        if self.uid is not None or not is_root() or Guarantee.PROCESS_LIMIT not in self.guarantees:
            return None
        try:
            return cgroup.create(lim.processes + WRAPPER_TASKS[self.level])
        except OSError as exc:
            raise SandboxUnavailable(f"cannot make the run's pids cgroup, so nothing runs: {exc}") from exc

    # -- command lines -------------------------------------------------------------------------
    def _command(self, workspace: Path, args: list[str], lim: Limits) -> tuple[list[str], dict[str, str], Path]:
        inside = Path(SANDBOX_DIR) if self.level is Level.BWRAP else workspace
        tmp = "/tmp" if self.level is Level.BWRAP else str(workspace / ".tmp")
        if self.level is not Level.BWRAP:
            (workspace / ".tmp").mkdir(exist_ok=True)
            if self.uid is not None:
                os.chown(workspace / ".tmp", self.uid, self.uid)
        env = {
            "HOME": str(inside),
            "TMPDIR": tmp,
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            # One thread each: threads count against the process limit, and numpy's pools are
            # sized to the host's cores.
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TQDM_DISABLE": "1",
        }
        program = [sys.executable, "-I", "-", *args]
        if self.uid is not None:
            program = [*confine.setpriv_args(self.uid), *program]
        if self.level is Level.BWRAP:
            program = [*confine.bwrap_args(workspace, lim, root=self.uid is not None), *program]
        elif self.level is Level.UNSHARE:
            program = [*confine.unshare_args(root=self.uid is not None), *program]
        return [*confine.prlimit_args(lim, uid=self.uid), *program], env, workspace


_PROBE = "import json, sys, zipfile\nimport openpyxl\nprint(sys.base_prefix)"
"""Imports from the stdlib and the venv, and reports where the interpreter found its stdlib."""


def _probe(level: Level, own_uid: bool) -> str | None:
    try:
        with tempfile.TemporaryDirectory(prefix="gymflow-probe-") as tmp:
            os.chmod(tmp, 0o755)
            sandbox = Sandbox(level=level, own_uid=own_uid, limits=Limits(wall_s=30))
            result = sandbox.run(_PROBE, workspace=Path(tmp))
    except (SandboxUnavailable, OSError) as exc:
        return str(exc)
    if not result.ok:
        return (result.stderr.strip() or result.problem() or "no output").splitlines()[-1][:300]
    found = result.stdout.strip()
    if found != sys.base_prefix:
        # A uid that cannot reach the interpreter's own stdlib makes Python fall back to another
        # installation's (e.g. /usr): it may even work, by accident, with the wrong version.
        return f"the sandboxed interpreter cannot reach its stdlib at {sys.base_prefix} (it found {found!r})"
    return None
