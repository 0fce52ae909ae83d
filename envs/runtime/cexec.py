"""Running a command in a container: its process group for timeouts, output caps, OOM kills.

Killing `podman exec`'s client does not stop the command inside the container. So every command
starts under a tiny `sh` wrapper that writes its pid to stderr (one line with a marker byte) and
then `exec`s the command: runc starts an exec'd process as a session leader, so that pid is also
the process group to kill on timeout (`kill -9 -PID`: dash takes no `--`). `PidSniffer` takes that
line off stderr.

OOM kills are counted by the memory cgroup (cgroup v1 `memory.oom_control`, v2 `memory.events`);
a command during which the count grew had a process killed for memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gymflow.envs.errors import SandboxError
from gymflow.envs.runtime.base import DEFAULT_MAX_OUTPUT_BYTES, CappedOutput, ExecResult, collect
from gymflow.envs.runtime.engine import Engine, client_dir, kill_session

MARK = b"\x1egymflow-pid:"
PID_WRAPPER = 'printf \'\\036gymflow-pid:%s\\n\' "$$" >&2; exec "$@"'
"""`sh -c` script: announce the pid, then become the command (`sh -c PID_WRAPPER sh CMD...`)."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
_KILL_TIMEOUT_S = 10.0


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


def kill_group_from_host(cgroup: str, pgid: int) -> bool:
    """SIGKILL the container's processes whose in-container process group is `pgid`; False if the
    cgroup cannot be read (then the caller kills through the engine)."""
    relative = cgroup.lstrip("/")
    for procs in (CGROUP_ROOT / "pids" / relative / "cgroup.procs", CGROUP_ROOT / relative / "cgroup.procs"):
        try:
            host_pids = [int(line) for line in procs.read_text().split()]
        except OSError:
            continue
        for host_pid in host_pids:
            try:
                status = Path(f"/proc/{host_pid}/status").read_text()
            except OSError:
                continue  # exited meanwhile
            found = re.search(r"^NSpgid:\s+(.*)$", status, re.MULTILINE)
            if found and int(found.group(1).split()[-1]) == pgid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(host_pid, signal.SIGKILL)
        return True
    return False


def cgroup_of_pid(pid: int) -> str:
    """The memory cgroup of host process `pid` (cgroup v1), else its unified one (v2); "" if unreadable."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return ""
    by_controller = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            by_controller[controller] = path
    return by_controller.get("memory", by_controller.get("", ""))


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


class ContainerExec:
    """Runs commands in one existing container (a sandbox's, or one named on a command line)."""

    def __init__(self, engine: Engine, container: str, *, workdir: str | None = None, cgroup: str = "") -> None:
        self.engine = engine
        self.container = container
        self.workdir = workdir
        self.cgroup = cgroup

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run `argv` in the container; see `Sandbox.exec`."""
        wrapped = ["sh", "-c", PID_WRAPPER, "sh", *argv]
        full = self.engine.exec_argv(
            self.container, wrapped, interactive=stdin is not None, workdir=cwd or self.workdir, env=dict(env or {})
        )
        oom_before = oom_kills(self.cgroup) if self.cgroup else 0
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            *full,
            cwd=client_dir(),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        out, err = CappedOutput(max_output_bytes), PidSniffer(max_output_bytes)
        timed_out = False
        try:
            timed_out = await collect(process, stdin, out, err, timeout_s)
        finally:
            err.finish()
            if process.returncode is None:
                await self.kill_group(err.pid)
                kill_session(process)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), _KILL_TIMEOUT_S)
        code = None if timed_out else process.returncode
        # The wrapper never announced itself: the command never started (podman exits 125-127 then,
        # docker 1, e.g. "Error response from daemon: Container ... is not running").
        if not timed_out and err.pid is None and code != 0:
            detail = err.output.text().strip()[-1000:]
            raise SandboxError(f"cannot run in container {self.container} ({code}): {detail}")
        return ExecResult(
            exit_code=code,
            stdout=out.text(),
            stderr=err.output.text(),
            timed_out=timed_out,
            truncated=out.truncated or err.output.truncated,
            oom_killed=bool(self.cgroup) and oom_kills(self.cgroup) > oom_before,
            duration_s=time.monotonic() - started,
        )

    async def kill_group(self, pid: int | None) -> None:
        """Kill a command's process group inside the container (killing the exec client does not).

        From the host where the container's cgroup is known: a container at its pids limit cannot
        start the `kill` an exec would run (a fork bomb is exactly that case).
        """
        if pid is not None and self.cgroup and kill_group_from_host(self.cgroup, pid):
            return
        if pid is not None:
            with contextlib.suppress(SandboxError):
                kill = ["exec", self.container, "sh", "-c", f"kill -9 -{pid} 2>/dev/null || kill -9 {pid}"]
                await self.engine.run(kill, timeout_s=_KILL_TIMEOUT_S, check=False)

    async def cgroup_of(self) -> str:
        """Look up (and remember) the container's cgroup, for OOM accounting."""
        done = await self.engine.run(["inspect", "--format", "{{.State.CgroupPath}}", self.container])
        self.cgroup = done.stdout.strip()
        return self.cgroup
