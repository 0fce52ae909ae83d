"""The runtime interface: where a rollout's tool servers and commands run.

A `Runtime` is built once per worker (or per env) and hands each rollout a `Sandbox`: the rollout's
own place to run things, started with the rollout's id, the node's id, a workspace directory on the
host and resource `Limits`. A sandbox can

* `exec` a command to completion (bounded time and output, the exit code, stdout and stderr);
* give the argv of a long-lived stdio process running inside it (`stdio_command`), so an MCP
  client spawns it like any local stdio server and talks JSON-RPC over its pipes;
* copy files in and out;
* `release` itself, after which nothing of it is left on the node.

Two runtimes exist: `process` (gymflow.envs.runtime.process: a local process in the workspace, today's
behaviour, no isolation beyond the workspace) and `container` (gymflow.envs.runtime.container: one
container per rollout). A hosted sandbox (Daytona, Modal, E2B, Kubernetes) fits the same two
classes: `start` creates a sandbox through its API, `exec` runs a command, `stdio_command` returns a
local command that bridges stdio to the remote process.

Design decisions:

* Output is bounded where it is read (`CappedOutput`): the first and the last half of the limit are
  kept, so a command that prints forever costs the worker a fixed amount of memory and the model
  still sees how the output ended. `ExecResult.truncated` says bytes were dropped.
* A timeout is a result (`timed_out=True`, `exit_code=None`), not an exception: the terminal tool
  tells the model, the verifier runner turns it into an infra failure. Only a sandbox that cannot
  run anything raises (`SandboxError`, an `InfraError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from pydantic import Field, model_validator

from gymflow.envs.contract import Wire
from gymflow.envs.runtime.compose import ComposeProject

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
"""Output kept of one command per stream unless the caller says otherwise."""


class Limits(Wire):
    """Resources of one rollout's sandbox. The process runtime enforces only the timeouts."""

    cpus: float = Field(default=1.0, gt=0)
    """CPU cores (a CFS quota: 0.5 is half a core)."""
    memory_mb: int = Field(default=2048, ge=16)
    """Memory including the page cache the sandbox dirties; no swap. Past it the kernel kills the
    largest process inside (`ExecResult.oom_killed`)."""
    storage_mb: int = Field(default=10240, ge=16)
    """Disk the sandbox may write (its whole writable filesystem and its workspace). How it is held
    depends on the node's engine (gymflow.envs.runtime.diskwatch.DiskGuarantee)."""
    storage_hard: bool = False
    """Writes must fail at `storage_mb` (ENOSPC). A node that can only watch the writable layer and kill
    a container past the cap (docker on ext4) refuses such a rollout before starting it."""
    pids: int = Field(default=512, ge=8)
    """Processes and threads alive at once inside the sandbox: a fork bomb stops here."""
    nofile: int = Field(default=4096, ge=64)
    """Open files per process (capped at the worker's own hard limit)."""
    network: bool = False
    """Whether the sandbox has the engine's network, unrestricted; off, it has only its own loopback
    (or, with `network_allow`, only the destinations listed there)."""
    network_allow: list[str] = Field(default_factory=list)
    """Egress allowlist of a container: `host:port` (TCP) or `host` (any TCP port), host an IPv4
    address or a name the worker resolves when the container starts (written to its /etc/hosts: there
    is no DNS inside). Set, the container gets the engine's network, and every other destination is
    refused by rules in its own network namespace, which it cannot change (no CAP_NET_ADMIN)."""

    @model_validator(mode="after")
    def _one_network_mode(self) -> Limits:
        if self.network and self.network_allow:
            raise ValueError("set either network (unrestricted) or network_allow (only those destinations), not both")
        for entry in self.network_allow:
            host, _, port = entry.rpartition(":") if ":" in entry else (entry, "", "")
            if not host or (port and not (port.isdigit() and 0 < int(port) < 65536)):
                raise ValueError(f"network_allow entry {entry!r} is not host or host:port")
        return self


class ExecResult(Wire):
    """What one command did."""

    exit_code: int | None
    """The command's exit status (128+N for signal N); None when it timed out and was killed."""
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    truncated: bool = False
    """Output was cut to the limit (the start and the end are kept)."""
    oom_killed: bool = False
    """The kernel killed a process of the sandbox for memory during this command."""
    disk_exceeded: bool = False
    """The sandbox's writes passed its disk cap on a node that watches the disk: the container was
    killed, and this command (and every later one) did not run to its end."""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Exited 0 in time."""
        return self.exit_code == 0 and not self.timed_out


class StdioCommand(Wire):
    """How to spawn a long-lived process of the sandbox with its stdio reachable from the worker."""

    argv: list[str]
    """The host command; for a container it wraps the process in `podman exec -i`."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of the host process."""
    cwd: str | None = None
    """Working directory of the host process."""


class RolloutSpec(Wire):
    """What a rollout asks of a runtime."""

    rollout_id: str = Field(min_length=1)
    node_id: str = Field(min_length=1)
    workspace: str
    """The rollout's workspace on the host: an absolute path that does not exist yet or is an empty
    directory (the process runtime also takes an existing one)."""
    limits: Limits = Field(default_factory=Limits)
    image: str | None = None
    """Container image to run (container runtime only)."""
    workdir: str | None = None
    """Working directory of commands inside the sandbox; default: the image's, else `/`."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of every command in the sandbox."""
    workspace_mount: str = "/workspace"
    """Where the workspace appears inside a container (Harbor tasks use /logs)."""
    services: ComposeProject | None = None
    """A compose file's other services, started beside the rollout's container on a network of the
    rollout's own (container runtime only; gymflow.envs.runtime.services)."""


class Sandbox(ABC):
    """One rollout's place to run commands and servers."""

    rollout_id: str
    node_id: str
    name: str = ""
    """Its name on its engine (a container's name), for tools on the worker that act on it."""
    shares_host_root: bool = False
    """Whether the sandbox sees the host's own system files (bwrap: read-only), so host paths of
    programs (the worker's interpreter) run inside it."""
    workspace: Path
    """The workspace on the host."""
    workspace_mount: str
    """Where the workspace appears inside the sandbox."""

    @abstractmethod
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
        """Run `argv` to completion; a timeout kills it with everything it started in its session.

        Raises:
            SandboxError: The sandbox is gone or the engine failed (not the command failing).
        """

    @abstractmethod
    def stdio_command(
        self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> StdioCommand:
        """The host command a stdio client spawns to run `argv` inside the sandbox."""

    @abstractmethod
    async def copy_in(self, src: Path, dst: str) -> None:
        """Copy a host file or directory to path `dst` inside the sandbox (parents created)."""

    @abstractmethod
    async def copy_out(self, src: str, dst: Path) -> None:
        """Copy path `src` of the sandbox to the host path `dst`."""

    @abstractmethod
    async def release(self) -> None:
        """Stop everything in the sandbox and remove it (idempotent)."""


class Runtime(ABC):
    """Starts sandboxes; one per worker, shared by its rollouts."""

    name: str

    @abstractmethod
    async def start(self, spec: RolloutSpec) -> Sandbox:
        """A started sandbox for the rollout (taken from a warm pool where there is one)."""

    async def close(self) -> None:  # noqa: B027 - a runtime without shared state has nothing to close
        """Release what the runtime holds (warm pools); sandboxes handed out are the callers'."""


class CappedOutput:
    """Keeps the first and last `limit // 2` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit - self.limit // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            keep = self.limit // 2
            if len(self.tail) > keep:
                del self.tail[: len(self.tail) - keep]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        if not self.truncated:
            return (bytes(self.head) + bytes(self.tail)).decode(errors="replace")
        dropped = self.total - len(self.head) - len(self.tail)
        return (
            self.head.decode(errors="replace")
            + f"\n[... {dropped} bytes of output omitted ...]\n"
            + self.tail.decode(errors="replace")
        )


class Sink(Protocol):
    """Where `drain` puts bytes."""

    def feed(self, chunk: bytes) -> None: ...


async def drain(stream: asyncio.StreamReader | None, sink: Sink) -> None:
    """Read `stream` to its end into `sink` (never holding more than the cap)."""
    if stream is None:
        return
    while chunk := await stream.read(65536):
        sink.feed(chunk)


async def feed_stdin(process: asyncio.subprocess.Process, data: bytes | None) -> None:
    """Write `data` to the process's stdin and close it; a process that exits early is not an error."""
    if process.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            process.stdin.write(data)
            await process.stdin.drain()
        process.stdin.close()
        await process.stdin.wait_closed()


async def collect(
    process: asyncio.subprocess.Process, stdin: bytes | None, out: Sink, err: Sink, timeout_s: float
) -> bool:
    """Feed `stdin`, drain both streams and wait for the exit; True when `timeout_s` ran out first."""
    try:
        await asyncio.wait_for(
            asyncio.gather(feed_stdin(process, stdin), drain(process.stdout, out), drain(process.stderr, err)),
            timeout_s,
        )
        await process.wait()
    except TimeoutError:
        return True
    return False


async def run_on_host(
    argv: Sequence[str],
    *,
    cwd: str | Path | None,
    env: Mapping[str, str],
    stdin: bytes | None,
    timeout_s: float,
    max_output_bytes: int,
) -> ExecResult:
    """`argv` as a session of its own on the worker's host; on a timeout (or cancellation) its whole
    process group is killed. The process and bwrap runtimes' `exec`."""
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    out, err = CappedOutput(max_output_bytes), CappedOutput(max_output_bytes)
    timed_out = False
    try:
        timed_out = await collect(process, stdin, out, err, timeout_s)
    finally:
        if process.returncode is None:  # under bwrap, --die-with-parent takes the sandbox's processes along
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    code = process.returncode
    return ExecResult(
        exit_code=None if timed_out else (128 - code if code is not None and code < 0 else code),
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        truncated=out.truncated or err.truncated,
        duration_s=time.monotonic() - started,
    )
