"""Whether model-written code may run on this machine, and in which sandbox mode (`envs.sheets.sandbox`).

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
* With no guaranteeing level, ``run_python`` refuses (an error observation naming the fix), and
  the CLI says so once at start. The env's own programs (the workbook tools and the reward's
  extraction, trusted code run on model-made files) still run at the best weaker mode.
* Running model code anyway is an explicit, visible opt-out: ``GYMFLOW_SANDBOX=unsafe-unshare``
  (or ``unsafe-rlimits``). Every trajectory of such a worker carries `Isolation.record` (its
  ``sandbox`` field) and the eval report prints it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from envs.sheets.confine import BWRAP_FIX
from envs.sheets.sandbox import Guarantee, Level, SandboxUnavailable, detect, guarantees, is_root, probe

SANDBOX_ENV = "GYMFLOW_SANDBOX"
"""``auto`` (default), ``bwrap``, ``unsafe-unshare`` or ``unsafe-rlimits``."""
UNSAFE_PREFIX = "unsafe-"
GUARANTEEING = frozenset({Level.BWRAP})
"""Levels that keep model code from everything but its workspace and the runtime, at any uid."""
REFUSAL = (
    "run_python is turned off on this worker: it has no sandbox that keeps model-written code away from "
    f"the answers, the worker's environment and the network. The operator's fix: {BWRAP_FIX} on the "
    f"worker (or opt out with {SANDBOX_ENV}=unsafe-unshare). The other tools still work."
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
    """Why bubblewrap is not in use (empty when it is)."""

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
            return (
                f"sheets: run_python will refuse model code: no sandbox level here guarantees isolation "
                f"({self.why}). Fix: {BWRAP_FIX}; or run it anyway with {SANDBOX_ENV}=unsafe-unshare"
            )
        return f"WARNING: isolation opted out: {self.record()}" if self.unsafe else None


def choose(setting: str | None = None) -> Isolation:
    """The policy of `setting` (default $GYMFLOW_SANDBOX, else ``auto``) on this machine.

    Raises:
        SandboxUnavailable: An unknown setting, a bare weaker level name, or ``bwrap`` (or the
            ``unsafe-`` level) named but not working here.
    """
    name = str(setting or os.environ.get(SANDBOX_ENV) or "auto").strip().lower()
    if name not in CHOICES:
        hint = f"; name it {UNSAFE_PREFIX}{name} to run model code there anyway" if name in set(Level) else ""
        raise SandboxUnavailable(
            f"{SANDBOX_ENV}={name!r}: choose one of {', '.join(CHOICES)} (only bwrap guarantees isolation{hint})"
        )
    why = probe(Level.BWRAP, own_uid=is_root()) or ""
    if name.startswith(UNSAFE_PREFIX):
        level, own_uid = detect(name.removeprefix(UNSAFE_PREFIX))
        return Isolation(level, own_uid, unsafe=True, why=why or "not chosen")
    if name == "bwrap" or not why:
        return Isolation(*detect(Level.BWRAP))
    level, own_uid = detect()  # the best weaker mode, for the env's own (trusted) programs
    if level in GUARANTEEING:  # bwrap works only at the caller's uid
        return Isolation(level, own_uid)
    return Isolation(level, own_uid, refuse_code=True, why=why)
