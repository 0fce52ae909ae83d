"""Counting a sandbox's processes on the host, for the tests that send it fork bombs.

A bounded program (`SPAWN_200`) goes first, to show the limit holds, before `UNBOUNDED`; `Census`
samples the host meanwhile. Only modes that promise ``PROCESS_LIMIT`` ever get either.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from gymflow.envs.builtin.sheets import cgroup

SPAWN_200 = """
import os, time
started = 0
for _ in range(200):  # bounded: at most 200 children, each sleeping a while, then the count
    try:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        started += 1
    except OSError:
        break
print("started", started)
"""

UNBOUNDED = "import os\nwhile True:\n    os.fork()"
"""The classic fork bomb: a refused fork kills its process, the survivors fork on."""


def leftover_cgroups() -> list[str]:
    """Run cgroups this process made that still exist (none should outlive its run)."""
    base = cgroup.parent()
    if not isinstance(base, Path):
        return []
    return [p.name for p in base.glob(f"{cgroup.PREFIX}{os.getpid()}-*")]


def sandboxed_programs() -> int:
    """Processes on the host running a sandboxed program of this test session (`python -I -`).

    Forked children keep their parent's command line; wrappers (bwrap, unshare) and zombies do
    not count. Other sessions' sandboxes run another interpreter path.
    """
    wanted = f"{sys.executable}\0-I\0-\0".encode()
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    count += f.read() == wanted
            except OSError:
                continue
    return count


def programs_left(*, deadline_s: float = 5.0) -> int:
    """Sandboxed programs still running once none are left or the deadline passes (killed ones
    take a moment to exit)."""
    deadline = time.monotonic() + deadline_s
    while (left := sandboxed_programs()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def host_processes() -> int:
    return sum(entry.name.isdigit() for entry in os.scandir("/proc"))


class Census:
    """Samples the host while a run goes on: the most sandboxed programs and host processes seen."""

    def __init__(self) -> None:
        self.baseline = host_processes()
        self.programs = 0
        self.host = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.programs = max(self.programs, sandboxed_programs())
            self.host = max(self.host, host_processes())

    def __enter__(self) -> Census:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
