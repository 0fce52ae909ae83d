"""Whether model-written code may run on this machine, and in which sandbox mode (`.sandbox`).

The promise: code the model writes cannot read the task's answers, other rollouts' workspaces,
the worker's environment (``/proc/<pid>/environ``, its API keys) or anything else outside its
workspace and the read-only Python runtime, and it has no network. A level *guarantees* this
when it holds whatever uid the program runs as.

Design decisions:

* Only bubblewrap guarantees it. It builds a new root holding just the workspace and the runtime,
  in new mount, pid and net namespaces: nothing else exists for the program, whatever its uid.
* ``unshare`` does not, even with a dropped uid. New net and pid namespaces stop the network and
  hide the worker's ``/proc`` entry, and a private uid cannot read 0700 files (the answer cache,
  other rollouts' 0700 workspaces), but everything world-readable stays readable: the repository,
  ``/etc``, a SpreadsheetBench directory checked out 0755, other users' files. Closing that takes
  a new root built from bind mounts and ``pivot_root``, i.e. re-implementing bubblewrap with
  ``mount(8)``; we do not, and name ``unshare`` for what it is. As the caller's uid (where the
  interpreter lives under a 0700 home, as on this project's machines) it reads everything root can.
* Model code also needs a process limit (``PROCESS_LIMIT``), at every mode, opted-out ones
  included: a fork bomb must not take the node down. As root at the worker's uid (bubblewrap
  whose uid drop failed, the ``unsafe-`` levels where a sandbox uid cannot reach the interpreter)
  only the run's pids cgroup gives one (`gymflow.envs.builtin.sheets.cgroup`); without it the mode runs no model
  code.
* With no mode that keeps both promises, the env cannot work on this node: `unavailable` says
  why and names the fix, the CLI refuses to start it, a worker ends its rollouts infra-failed
  (``env_unavailable``), and ``run_python`` itself refuses (an error observation naming the fix)
  where the env is driven directly. The env's own programs (the workbook tools and the reward's
  extraction, trusted code run on model-made files) still run at the best weaker mode.
* Running model code without the isolation promise is an explicit, visible opt-out:
  ``GYMFLOW_SANDBOX=unsafe-unshare`` (or ``unsafe-rlimits``). Every trajectory of such a worker
  carries `Isolation.record` (its ``sandbox`` field) and the eval report prints it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from gymflow.envs.builtin.sheets import cgroup
from gymflow.envs.builtin.sheets.sandbox import Guarantee, Level, SandboxUnavailable, detect, guarantees
from gymflow.envs.runtime.confine import BWRAP_FIX

SANDBOX_ENV = "GYMFLOW_SANDBOX"
"""``auto`` (default), ``bwrap``, ``unsafe-unshare`` or ``unsafe-rlimits``."""
UNSAFE_PREFIX = "unsafe-"
GUARANTEEING = frozenset({Level.BWRAP})
"""Levels that keep model code from everything but its workspace and the runtime, at any uid."""
CGROUP_FIX = (
    f"give the worker a pids cgroup it can make children in (cgroup v1 pids, or v2 with pids delegated; "
    f"${cgroup.CGROUP_ENV} names one), or let bubblewrap drop to a sandbox uid"
)
"""The fix when the only working modes run model code as root without a process limit."""
REFUSAL = (
    "run_python is turned off on this worker: it has no sandbox that keeps model-written code away from "
    f"the answers, the worker's environment and the network and bounds its processes. The operator's fix: "
    f"{BWRAP_FIX} on the worker (or opt out with {SANDBOX_ENV}=unsafe-unshare). The other tools still work."
)
"""What the model reads when its code is refused."""
CHOICES = ("auto", "bwrap", *(UNSAFE_PREFIX + level for level in Level if level not in GUARANTEEING))


@dataclass(frozen=True)
class Isolation:
    """The sandbox mode of an env on this machine, and whether model code may run in it."""

    level: Level
    own_uid: bool
    refuse_code: bool = False
    """No guaranteeing level and no opt-out: model code is refused."""
    unsafe: bool = False
    """The operator opted into a level that does not guarantee isolation."""
    why: str = ""
    """Why model code cannot run (refused), or why bubblewrap is not in use (opted out); else empty."""
    fix: str = BWRAP_FIX
    """What the operator does about `why`."""

    def missing(self) -> list[str]:
        """The guarantees of the promise this mode lacks."""
        have = guarantees(self.level, own_uid=self.own_uid)
        wanted = (Guarantee.FS_CONFINED, Guarantee.PRIVATE_FILES, Guarantee.PID_ISOLATED, Guarantee.NO_NETWORK)
        return [str(g) for g in wanted if g not in have]

    def record(self) -> str | None:
        """What every trajectory of an opted-out env carries (None when isolation is guaranteed)."""
        if not self.unsafe:
            return None
        uid = "its own uid" if self.own_uid else "the worker's uid"
        return (
            f"{SANDBOX_ENV}={UNSAFE_PREFIX}{self.level}: model code runs at sandbox level {self.level} as {uid}, "
            f"without {', '.join(self.missing())}: it may read the answers and other files"
        )

    def notice(self) -> str | None:
        """One line for the operator at start (None when isolation is guaranteed)."""
        if self.refuse_code:
            return f"sheets: run_python will refuse model code: {self.why}. Fix: {self.fix}"
        return f"WARNING: isolation opted out: {self.record()}" if self.unsafe else None


def choose(setting: str | None = None) -> Isolation:
    """The policy of `setting` (default $GYMFLOW_SANDBOX, else ``auto``) on this machine.

    Raises:
        SandboxUnavailable: An unknown setting, a bare weaker level name, or ``bwrap`` (or the
            ``unsafe-`` level) named but not working here. A mode that works but has no process
            limit refuses model code instead (`Isolation.refuse_code`, with the fix).
    """
    name = str(setting or os.environ.get(SANDBOX_ENV) or "auto").strip().lower()
    if name not in CHOICES:
        hint = f"; name it {UNSAFE_PREFIX}{name} to run model code there anyway" if name in set(Level) else ""
        raise SandboxUnavailable(
            f"{SANDBOX_ENV}={name!r}: choose one of {', '.join(CHOICES)} (only bwrap guarantees isolation{hint})"
        )
    if name.startswith(UNSAFE_PREFIX):
        level, own_uid = detect(name.removeprefix(UNSAFE_PREFIX))
        if Guarantee.PROCESS_LIMIT not in guarantees(level, own_uid=own_uid):
            return Isolation(level, own_uid, refuse_code=True, why=_no_process_limit(level), fix=CGROUP_FIX)
        return Isolation(level, own_uid, unsafe=True, why="not chosen")
    try:
        level, own_uid = detect(Level.BWRAP)
    except SandboxUnavailable as exc:
        if name == "bwrap":
            raise
        level, own_uid = detect(log_level=logging.INFO)  # the best weaker mode, for the env's own programs
        why = f"no sandbox level here guarantees isolation ({exc})"
        fix = f"{BWRAP_FIX}; or run it anyway with {SANDBOX_ENV}=unsafe-unshare"
        return Isolation(level, own_uid, refuse_code=True, why=why, fix=fix)
    if Guarantee.PROCESS_LIMIT in guarantees(level, own_uid=own_uid):
        return Isolation(level, own_uid)
    return Isolation(level, own_uid, refuse_code=True, why=_no_process_limit(level), fix=CGROUP_FIX)


def _no_process_limit(level: Level) -> str:
    return (
        f"sandbox level {level} runs here only as the worker's uid, root, and nothing bounds root's "
        f"processes without a pids cgroup ({cgroup.parent()})"
    )
