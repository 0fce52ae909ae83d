"""What a sandboxed run is: the isolation levels, the guarantees a mode gives, and a run's result.

Data only, apart from `gymflow.envs.builtin.sheets.sandbox` (which picks the mode and runs programs), so the env,
its MCP server and the tests read them without the machinery. `RunResult.problem` words a failed
run for the model: the cause it can act on, not the exit status alone.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass

from gymflow.envs.runtime.confine import Limits


class Level(enum.StrEnum):
    """Isolation levels, strongest first."""

    BWRAP = "bwrap"
    UNSHARE = "unshare"
    RLIMITS = "rlimits"


WRAPPER_TASKS = {Level.BWRAP: 2, Level.UNSHARE: 1, Level.RLIMITS: 0}
"""Tasks in a run's cgroup that are not the program's: bubblewrap's monitor and its pid-namespace
init, ``unshare --fork``'s parent. The cgroup allows `Limits.processes` on top of them."""


class Guarantee(enum.StrEnum):
    """What a sandboxed program cannot do."""

    LIMITS = "limits"
    """CPU time, memory, file size, open files and wall time are bounded."""
    PROCESS_LIMIT = "process_limit"
    """The number of processes and threads is bounded: by RLIMIT_NPROC for a uid other than root (the
    kernel does not enforce it for root), by the run's pids cgroup for any uid."""
    NO_NETWORK = "no_network"
    """Own network namespace: no interface but loopback."""
    PID_ISOLATED = "pid_isolated"
    """Own pid namespace: other processes are invisible and cannot be signalled."""
    PRIVATE_FILES = "private_files"
    """Files that are not world-readable (the answer cache) cannot be read."""
    FS_CONFINED = "fs_confined"
    """Nothing outside the workspace exists for it but the read-only Python runtime."""


@dataclass(frozen=True)
class RunResult:
    """What one sandboxed run did."""

    returncode: int
    stdout: str
    stderr: str
    duration_ms: float
    level: Level
    limits: Limits
    timed_out: bool = False
    cpu_s: float = 0.0
    """CPU seconds the run used, all its processes together."""
    over_quota: bool = False
    """Stopped because the workspace grew past its disk quota (`Limits.workspace_mb`)."""
    peak_tasks: int | None = None
    """The most tasks (processes and threads, wrappers included) the run's pids cgroup held at once;
    None without a cgroup, or where the kernel does not keep the peak."""
    forks_refused: int = 0
    """Forks (and thread starts) the run's pids cgroup refused."""

    @property
    def signal(self) -> int | None:
        """The signal that killed the program, if one did (wrappers report 128+N)."""
        if self.returncode < 0:
            return -self.returncode
        if self.returncode > 128 and self.level is not Level.RLIMITS:
            return self.returncode - 128
        return None

    @property
    def ok(self) -> bool:
        """Exited with status 0 within the limits."""
        return self.returncode == 0 and not self.timed_out and not self.over_quota

    def problem(self) -> str | None:
        """Why the run failed, in words the model can act on; None when it succeeded."""
        lim, sig, tail = self.limits, self.signal, self.stderr[-2000:]
        if self.timed_out:
            return f"stopped: the program ran longer than the {lim.wall_s:g}s wall-clock limit"
        if self.over_quota:
            return f"stopped: the workspace grew past its {lim.workspace_mb} MB disk quota; delete files to go on"
        # Died of an uncaught MemoryError: that is the cause, even when the CPU limit (filling
        # pages costs CPU) struck while the traceback was being printed.
        if tail.rstrip().endswith("MemoryError"):
            return f"out of memory: the {lim.memory_mb} MB memory limit was reached"
        if sig == signal.SIGXCPU or (self.returncode != 0 and self.cpu_s >= lim.cpu_s - 0.05):
            return f"stopped: CPU time limit of {lim.cpu_s}s exceeded"
        if sig == signal.SIGXFSZ or "File too large" in tail:
            return f"stopped: a file (or the output) grew past the {lim.file_mb} MB limit"
        if sig == signal.SIGKILL:
            return "killed: the program hit a resource limit (CPU time, memory or processes)"
        if sig is not None:
            return f"killed by signal {signal.Signals(sig).name}"
        if "MemoryError" in tail:
            return f"out of memory: the {lim.memory_mb} MB memory limit was reached"
        if "Resource temporarily unavailable" in tail or self.forks_refused:
            return f"the {lim.processes}-process limit was reached"
        if self.returncode != 0:
            return f"the program exited with status {self.returncode}"
        return None
