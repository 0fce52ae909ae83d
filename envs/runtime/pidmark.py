"""Finding a command's process group inside a container, and the container's OOM kills.

Killing `podman exec`'s client does not stop the command inside the container. So every command
starts under a tiny `sh` wrapper that writes its pid to stderr (one line with a marker byte) and
then `exec`s the command: runc starts an exec'd process as a session leader, so that pid is also
the process group to kill on timeout (`kill -9 -- -PID`). `PidSniffer` takes that line off stderr.

OOM kills are counted by the memory cgroup (cgroup v1 `memory.oom_control`, v2 `memory.events`);
a command during which the count grew had a process killed for memory.
"""

from __future__ import annotations

import re
from pathlib import Path

from envs.runtime.base import CappedOutput

MARK = b"\x1egymflow-pid:"
PID_WRAPPER = "printf '\\036gymflow-pid:%s\\n' \"$$\" >&2; exec \"$@\""
"""`sh -c` script: announce the pid, then become the command (`sh -c PID_WRAPPER sh CMD...`)."""
CGROUP_ROOT = Path("/sys/fs/cgroup")


class PidSniffer:
    """A stderr sink: the first line, when it is the wrapper's, gives the pid; the rest is output."""

    def __init__(self, limit: int) -> None:
        self.output = CappedOutput(limit)
        self.pid: int | None = None
        self._head = b""
        self._done = False

    def feed(self, chunk: bytes) -> None:
        if self._done:
            self.output.feed(chunk)
            return
        self._head += chunk
        if b"\n" not in self._head and len(self._head) < 64:
            return
        self._done = True
        line, _, rest = self._head.partition(b"\n")
        if line.startswith(MARK) and line[len(MARK) :].isdigit():
            self.pid = int(line[len(MARK) :])
        else:  # not the wrapper's line (sh itself failed): keep everything
            rest = self._head
        self._head = b""
        if rest:
            self.output.feed(rest)

    def finish(self) -> None:
        """Flush a partial first line that never ended (the stream closed)."""
        if not self._done and self._head:
            self._done = True
            self.output.feed(self._head)


def oom_kills(cgroup: str) -> int:
    """OOM kills so far in the container's memory cgroup (0 when it cannot be read)."""
    relative = cgroup.lstrip("/")
    for path, pattern in (
        (CGROUP_ROOT / "memory" / relative / "memory.oom_control", r"^oom_kill (\d+)$"),
        (CGROUP_ROOT / relative / "memory.events", r"^oom_kill (\d+)$"),
    ):
        try:
            text = path.read_text()
        except OSError:
            continue
        found = re.search(pattern, text, re.MULTILINE)
        if found:
            return int(found.group(1))
    return 0
