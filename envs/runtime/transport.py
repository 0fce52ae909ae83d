"""A stdio transport for MCP servers that owns its process.

The SDK's `stdio_client` hides the process it starts. A rollout runtime needs it: the pid to
kill a hung server and reap orphans, the exit code to tell a crashed server from a tool error,
the server's stderr in a log file beside the workspace for post-mortems, and one place to wrap
the command in a sandbox later. So this transport spawns the process itself (in its own process
group) and bridges its pipes to the memory streams `mcp.Client` drives.

A server that dies usually says why on stderr ("can't open file", a traceback), and the log file
goes with the workspace when the rollout is released. So the error that reports a dead server
carries the log's last `STDERR_TAIL_BYTES` (`log_tail`): read from the file once the process is
gone, bounded, and nothing kept in memory while the server runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import anyio
import mcp_types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from gymflow.envs.runtime.forkserver import ForkedProcess, ForkServers

_INHERITED_ENV = (
    *("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV"),
    *("GYMFLOW_CONTAINER_ENGINE", "GYMFLOW_OCI_RUNTIME", "DOCKER_HOST", "CONTAINER_HOST"),
)
"""Inherited: a shell's basics, and the node's engine settings (a server on the worker that acts on the
rollout's container must drive the engine that runs it)."""
_EXIT_GRACE_S = 1.0
"""How long a server gets to exit after its stdin closes before its process group is killed."""
STDERR_TAIL_BYTES = 2048
"""How much of a dead server's stderr its error message carries (the end: where the reason is)."""


class ProcessTransport:
    """An `mcp.client` Transport over a subprocess's stdin/stdout.

    Usage: `async with Client(ProcessTransport(cmd, args, cwd=...)) as client: ...`. The process
    is started on enter and its whole process group killed on exit.
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stderr_path: Path | None = None,
        nice: int = 0,
        forks: ForkServers | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        """`forks`: the node's fork servers, to fork the server from when it is a Python program they
        can run (gymflow.envs.runtime.forkserver); None, or a program they cannot, starts it plainly;
        `preload`: modules its fork server imports besides the server source's own imports."""
        self.command = command
        self.forks = forks
        self.preload = tuple(preload)
        self.args = list(args)
        self.env = server_env(env)
        self.cwd = cwd
        self.stderr_path = stderr_path
        self.nice = nice
        """Niceness added to the server's (it runs below the worker that drives it)."""
        self.process: Process | ForkedProcess | None = None
        self.closed = asyncio.Event()
        """Set once the server's stdout closes: it exited, or can never answer again."""
        self._stderr: IO[bytes] | None = None
        self._exit: contextlib.AsyncExitStack | None = None

    @property
    def pid(self) -> int | None:
        """The server's pid once started."""
        return self.process.pid if self.process else None

    @property
    def returncode(self) -> int | None:
        """The exit code once the server has exited, else None."""
        return self.process.returncode if self.process else None

    async def __aenter__(self) -> tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[SessionMessage]]:
        if self.stderr_path is not None:
            self._stderr = self.stderr_path.open("ab")
        if self.forks is not None:
            self.process = await self.forks.spawn(
                self.command,
                self.args,
                env=self.env,
                cwd=self.cwd,
                stderr=self._stderr,
                nice=self.nice,
                preload=self.preload,
            )
        if self.process is None:
            self.process = await anyio.open_process(
                [self.command, *self.args],
                env=self.env,
                cwd=self.cwd,
                stderr=self._stderr if self._stderr is not None else subprocess.DEVNULL,
                start_new_session=True,
            )
        if self.nice > 0 and not isinstance(self.process, ForkedProcess):  # a forked one niced itself
            with contextlib.suppress(OSError):  # gone already, or a platform without priorities
                own = os.getpriority(os.PRIO_PROCESS, 0)
                os.setpriority(os.PRIO_PROCESS, self.process.pid, min(19, own + self.nice))
        exit_stack = contextlib.AsyncExitStack()
        streams = await exit_stack.enter_async_context(self._bridge(self.process))
        self._exit = exit_stack
        return streams

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._exit is not None:
            await self._exit.aclose()

    def kill(self) -> None:
        """Kill the server's whole process group now (it may have spawned children)."""
        if self.process is not None:
            kill_group(self.process)

    @contextlib.asynccontextmanager
    async def _bridge(
        self, process: Process | ForkedProcess
    ) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[SessionMessage]]]:
        to_client, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        to_server, from_client = anyio.create_memory_object_stream[SessionMessage](16)

        async def read_stdout() -> None:
            assert process.stdout is not None
            buffer = b""
            try:
                async with to_client:
                    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                        async for chunk in process.stdout:
                            buffer += chunk
                            *lines, buffer = buffer.split(b"\n")
                            for line in lines:
                                if line.strip():
                                    await to_client.send(_parse(line))
            finally:
                self.closed.set()

        async def write_stdin() -> None:
            assert process.stdin is not None
            async with from_client:
                with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                    async for message in from_client:
                        data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                        await process.stdin.send(data.encode() + b"\n")

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_stdout)
                tg.start_soon(write_stdin)
                try:
                    yield from_server, to_server
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._stop(process)
                    tg.cancel_scope.cancel()
        finally:
            if self._stderr is not None:
                self._stderr.close()

    async def _stop(self, process: Process | ForkedProcess) -> None:
        if process.stdin is not None:
            with contextlib.suppress(Exception):
                await process.stdin.aclose()
        with anyio.move_on_after(_EXIT_GRACE_S):
            # Poll rather than process.wait(): asyncio's wait also waits for pipe EOF, which a
            # grandchild holding the pipes delays forever.
            while process.returncode is None:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        self.kill()
        with anyio.move_on_after(_EXIT_GRACE_S):
            await process.wait()


def server_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    """The environment of a server process: a few inherited basics plus its configured vars.

    Nothing else leaks in, so a worker's secrets (the model API key) never reach a server.
    """
    return {k: v for k in _INHERITED_ENV if (v := os.environ.get(k)) is not None} | dict(extra or {})


def log_tail(path: Path | None, limit: int = STDERR_TAIL_BYTES) -> str:
    """The last `limit` bytes of a server's log as text, from the first whole line ('' if none).

    Cut lines are marked with a leading `…`; bytes that are not UTF-8 are replaced, not fatal.
    """
    if path is None:
        return ""
    try:
        with path.open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - limit))
            data = log.read(limit)
    except OSError:  # never created (the server did not start), or removed with its workspace
        return ""
    text = data.decode("utf-8", "replace")
    if size > limit:
        text = "…" + text.partition("\n")[2]
    return text.strip()


def with_log_tail(message: str, path: Path | None) -> str:
    """`message`, followed by the end of the server's log on indented lines when it wrote any."""
    tail = log_tail(path)
    if not tail:
        return message
    return f"{message}; its stderr ends:\n" + "\n".join(f"  {line}" for line in tail.splitlines())


def kill_group(process: Process | ForkedProcess) -> None:
    """SIGKILL a server's whole process group (it runs in its own session), if still running.

    A group that runs below the worker's priority (`nice`) first gets the worker's back where the
    worker may raise it: a killed process tears itself down on its own CPU time, which a busy
    machine gives a niced process last.
    """
    if process.returncode is None:
        with contextlib.suppress(OSError):  # not allowed (no CAP_SYS_NICE), or gone already
            os.setpriority(os.PRIO_PGRP, process.pid, os.getpriority(os.PRIO_PROCESS, 0))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        if isinstance(process, ForkedProcess):  # killed before its own session began: not a group yet
            process.kill()


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # a server printing garbage to stdout: surface it, don't die
        return exc
