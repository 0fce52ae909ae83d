"""The plumbing under `gymflow.envs.builtin.sheets.sandbox`: command lines of each level, and process and file helpers.

Kept apart from the policy (levels, guarantees, detection) so each reads on its own. Nothing here
decides anything: `Sandbox` picks the mode and calls these.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

SANDBOX_DIR = "/workspace"
"""Where the workspace appears inside a bwrap sandbox."""
BWRAP_ENV = "GYMFLOW_BWRAP"
"""The bubblewrap binary (default ``bwrap``, see `which`); ``/nonexistent`` makes a machine without it."""
BWRAP_FIX = "install bubblewrap (apt-get install bubblewrap)"


class SandboxUnavailable(RuntimeError):
    """The requested isolation level cannot run on this machine."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run."""

    cpu_s: int = 20
    """CPU seconds (SIGXCPU, then SIGKILL one second later)."""
    wall_s: float = 30.0
    """Wall-clock seconds before the whole process group is killed."""
    memory_mb: int = 1024
    """Address space (RLIMIT_AS); allocations beyond it fail with MemoryError."""
    file_mb: int = 64
    """Largest file the program may write (RLIMIT_FSIZE), stdout and stderr included."""
    processes: int = 32
    """Processes and threads of the sandbox uid (RLIMIT_NPROC): a fork bomb stops here."""
    open_files: int = 256
    """Open file descriptors."""
    tmp_mb: int = 64
    """Size of the private /tmp (bwrap only)."""
    workspace_mb: int | None = None
    """Disk quota of the workspace: a run that grows it past this is stopped (checked every
    `QUOTA_POLL_S`), and no file may be larger than what was left at the start."""
    output_chars: int = 8000
    """Characters of stdout and of stderr kept (head and tail)."""


def prlimit_args(lim: Limits, *, uid: int | None) -> list[str]:
    """``prlimit`` with every limit (soft CPU one second below hard, so SIGXCPU comes first)."""
    nproc = lim.processes if uid is not None else lim.processes + own_threads()
    mb = 1024 * 1024
    return [
        which("prlimit"),
        f"--cpu={lim.cpu_s}:{lim.cpu_s + 1}",
        f"--as={lim.memory_mb * mb}:{lim.memory_mb * mb}",
        f"--fsize={lim.file_mb * mb}:{lim.file_mb * mb}",
        f"--nproc={nproc}:{nproc}",
        f"--nofile={lim.open_files}:{lim.open_files}",
        "--core=0:0",
        "--",
    ]


def setpriv_args(uid: int) -> list[str]:
    """``setpriv`` dropping to `uid`: no groups, no capabilities, no_new_privs."""
    return [
        which("setpriv"),
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def unshare_args(*, root: bool) -> list[str]:
    """``unshare`` into new net, ipc, uts and pid namespaces (a user namespace too without root)."""
    user = [] if root else ["--user", "--map-root-user"]
    return [
        which("unshare"),
        *user,
        "--net",
        "--ipc",
        "--uts",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--",
    ]


def bwrap_args(workspace: Path, lim: Limits, *, root: bool) -> list[str]:
    """``bwrap`` showing only the workspace (rw at /workspace), the runtime (ro), /proc, /dev and a /tmp."""
    binds = runtime_paths(with_setpriv=root)
    args = [bwrap_binary(), "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    if not root:
        args.append("--unshare-user")
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    # The private /tmp first: a runtime bound later may itself live under /tmp (a venv in a
    # checkout under /tmp), and a tmpfs mounted after it would hide it.
    args += ["--perms", "1777", "--size", str(lim.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    made: set[str] = {"/tmp"}
    for path in binds:
        for parent in reversed(PurePosixPath(path).parents):
            name = str(parent)
            if name != "/" and name not in made and not any(inside(name, b) for b in binds):
                made.add(name)
                args += ["--perms", "0755", "--dir", name]
        args += ["--ro-bind", path, path]
    for link in ("/lib", "/lib64", "/lib32", "/libx32", "/bin"):
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link) and link != "/bin":
            args += ["--ro-bind", link, link]
    args += ["--proc", "/proc", "--dev", "/dev", "--bind", str(workspace), SANDBOX_DIR, "--chdir", SANDBOX_DIR]
    if root:  # just enough for setpriv to drop to the sandbox uid; it clears them all
        args += ["--cap-add", "CAP_SETUID,CAP_SETGID"]
    return [*args, "--"]


def runtime_paths(*, with_setpriv: bool) -> list[str]:
    """What a bwrap sandbox mounts read-only: the interpreter, its venv, the system libraries."""
    candidates = {sys.prefix, sys.base_prefix, os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    candidates |= {p for p in ("/usr/lib", "/usr/lib64", "/usr/lib32") if os.path.isdir(p) and not os.path.islink(p)}
    if with_setpriv:
        candidates.add(os.path.realpath(which("setpriv")))
    ordered = sorted(candidates, key=lambda p: (p.count("/"), p))
    kept: list[str] = []
    for path in ordered:
        if not any(inside(path, k) for k in kept):
            kept.append(path)
    return kept


def inside(path: str, root: str) -> bool:
    """Whether `path` is `root` or below it (plain string paths)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def bwrap_binary() -> str:
    """The bubblewrap binary: $GYMFLOW_BWRAP when set, else ``bwrap`` (see `which`)."""
    override = os.environ.get(BWRAP_ENV)
    if not override:
        try:
            return which("bwrap")
        except SandboxUnavailable:
            raise SandboxUnavailable(f"bubblewrap is not installed: {BWRAP_FIX}") from None
    if not (os.path.isfile(override) and os.access(override, os.X_OK)):
        raise SandboxUnavailable(f"no bubblewrap at ${BWRAP_ENV}={override}: {BWRAP_FIX}, or unset {BWRAP_ENV}")
    return override


SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


def which(tool: str) -> str:
    """The real path of `tool`: from the system directories first, then the PATH.

    A sandbox does not take its tools from whatever PATH the worker inherited before the system's,
    and a tool found through a symlink (toolchain shims, some CI images put a directory of them
    first) is named by the file it points to: ``setpriv`` runs inside bwrap, where only what
    `runtime_paths` binds exists, and that is the real file. A symlink to a multi-call binary
    (busybox) keeps its own name, which selects the tool.
    """
    found = shutil.which(tool, path=SYSTEM_PATH) or shutil.which(tool)
    if found is None:
        raise SandboxUnavailable(f"{tool} is not installed")
    real = os.path.realpath(found)
    return real if os.path.basename(real) == tool else os.path.abspath(found)


# -- processes and files -----------------------------------------------------------------------
def claim(workspace: Path, uid: int) -> None:
    """Give the workspace tree to `uid`, without following symlinks or touching hard-linked files.

    The workspace itself becomes 0700: other sandbox uids (other rollouts) cannot enter it.
    """
    for root, dirs, files in os.walk(workspace):
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if st.st_uid != uid and (os.path.islink(path) or os.path.isdir(path) or st.st_nlink == 1):
                os.lchown(path, uid, uid)
    if os.lstat(workspace).st_uid != uid:
        os.lchown(workspace, uid, uid)
    os.chmod(workspace, 0o700)


def kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (root only): ``kill -KILL -1`` run as that uid.

    Signalling -1 as the uid reaches exactly its processes, however they were started (a daemon
    that left the process group, a fork bomb's last survivors). It is spawned, not forked from
    this (threaded) process, and runs twice: the second sweep catches a child forked meanwhile.
    """
    command = [*setpriv_args(uid), which("kill"), "-KILL", "-1"]
    for _ in range(2):
        subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    """Write the program to stdin (from a thread: a program larger than the pipe buffer blocks)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):  # the sandbox ended before reading it all
        pass


QUOTA_POLL_S = 0.1
"""How often a running program's workspace is measured against its quota."""


def wait(
    proc: subprocess.Popen[bytes], timeout: float, *, over: Callable[[], bool] | None = None
) -> tuple[bool, bool, float]:
    """Wait up to `timeout` s, then kill the process group; (timed out, stopped by `over`, CPU seconds).

    `over` (the workspace quota check) is polled every `QUOTA_POLL_S`; when it says so the
    program is killed at once. wait4's rusage counts the child and every descendant it reaped:
    the CPU time of the whole sandbox, whatever a wrapper makes of the exit status (unshare loses
    a child's signal).
    """
    deadline = time.monotonic() + timeout
    timed_out = stopped = False
    pidfd = os.pidfd_open(proc.pid)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if select.select([pidfd], [], [], left if over is None else min(left, QUOTA_POLL_S))[0]:
                break
            if over is not None and over():
                stopped = True
                break
    finally:
        os.close(pidfd)
    killpg(proc)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return timed_out, stopped, usage.ru_utime + usage.ru_stime


def killpg(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group of `proc` (its own session), if any is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def own_threads() -> int:
    """Tasks (processes and threads) of this uid: RLIMIT_NPROC counts all of them."""
    uid, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return count


def read_bounded(stream: IO[bytes], limit: int) -> str:
    """A captured stream as text: whole when short, else its head and tail around a marker."""
    size = stream.seek(0, os.SEEK_END)
    stream.seek(0)
    if size <= limit:
        return stream.read().decode(errors="replace")
    head = stream.read(limit * 3 // 4).decode(errors="replace")
    stream.seek(size - limit // 4)
    tail = stream.read().decode(errors="replace")
    return f"{head}\n[... {size - limit} bytes of output cut ...]\n{tail}"
