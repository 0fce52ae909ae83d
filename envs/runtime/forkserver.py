"""Python MCP servers forked from a per-server fork server instead of started cold.

A rollout's calculator server spends about a second of CPU and 45 MB importing `mcp` before it
answers its first message. Every rollout of an env imports the same modules, so the node keeps one
fork server (`gymflow.envs.runtime.zygote`) per server program: it imports them once and forks
each rollout's server from itself. The child is still its own process (own session, working
directory, environment, stdio and log), so everything that holds a plain server holds it too: its
pid goes to the ledger, a timeout kills its process group, its exit code reaches the error. What
it shares with its siblings is read-only, copy-on-write memory.

Only what can be forked is forked: a server started as `python -m MODULE ...` or `python
/abs/path.py ...`, on the worker (not in a sandbox), whose `PYTHON*` variables are the same for
every rollout. Anything else, or a fork server that refuses (its imports started a thread) or
fails to start, gets the plain start, and the reason is logged once. `GYMFLOW_FORK_SERVERS=0` turns
forking off on a node; `fork: false` on a server turns it off for that server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream

log = logging.getLogger(__name__)

ZYGOTE = Path(__file__).with_name("zygote.py")
ENV_SWITCH = "GYMFLOW_FORK_SERVERS"
"""`0` turns fork servers off on this node: every server gets the plain start."""
_HEADER = struct.Struct("!I")
_READY_TIMEOUT_S = 60.0
"""Longest a fork server may take to import the server's modules (a cold, busy node)."""
SPAWN_TIMEOUT_S = 10.0
"""Longest a fork server may take to accept, read and answer one spawn request."""
STATUS_UNKNOWN = -1
"""The exit code of a forked server whose fork server died before it could report one."""


@dataclass(frozen=True)
class ForkTarget:
    """A server program a fork server can run: a module (`-m`) or an absolute script path."""

    executable: str
    module: str | None = None
    path: str | None = None
    python_env: tuple[tuple[str, str], ...] = ()
    """The `PYTHON*` variables of its environment (they shape imports, so a fork server has one set)."""
    preload: tuple[str, ...] = ()
    """Modules to import besides the source's own top-level imports."""

    def spec(self) -> str:
        return json.dumps({"module": self.module, "path": self.path, "extra": list(self.preload)})


def fork_target(
    executable: str, args: Sequence[str], env: Mapping[str, str], cwd: Path | None, preload: Sequence[str] = ()
) -> ForkTarget | None:
    """The fork target of `executable args`, or None when this command must get the plain start."""
    if not Path(executable).name.startswith("python") or not args:
        return None
    python_env = tuple(sorted((k, v) for k, v in env.items() if k.startswith("PYTHON")))
    if cwd is not None and any(str(cwd) in value for _, value in python_env):
        return None  # per-rollout import paths: each rollout would need a fork server of its own
    if args[0] == "-m" and len(args) >= 2 and all(part.isidentifier() for part in args[1].split(".")):
        return ForkTarget(executable, module=args[1], python_env=python_env, preload=tuple(preload))
    if args[0].endswith(".py") and os.path.isabs(args[0]):
        return ForkTarget(executable, path=args[0], python_env=python_env, preload=tuple(preload))
    return None


def server_args(target: ForkTarget, args: Sequence[str]) -> list[str]:
    """The arguments the server itself sees (after `-m MODULE` or the script)."""
    return list(args[2:] if target.module else args[1:])


class ForkRefused(Exception):
    """A fork server could not start or would not fork; the plain start is used instead."""


class ForkServer:
    """One fork server process and the socket its spawn requests go to."""

    def __init__(self, target: ForkTarget, env: Mapping[str, str]) -> None:
        self.target = target
        self.env = dict(env)
        self.dir = Path(tempfile.mkdtemp(prefix="gymflow-fork-"))
        self.socket_path = self.dir / "spawn.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def start(self) -> None:
        """Start it and wait until it has imported the server's modules.

        Raises:
            ForkRefused: It refused to fork this server, exited, or did not get ready in time.
        """
        self.process = await asyncio.to_thread(
            subprocess.Popen,
            [self.target.executable, str(ZYGOTE), str(self.socket_path), self.target.spec()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.env,
            cwd=self.dir,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), _READY_TIMEOUT_S)
        except TimeoutError:
            self.close()
            raise ForkRefused(f"not ready within {_READY_TIMEOUT_S:g}s") from None
        text = line.decode(errors="replace").strip()
        if not text.startswith("ready"):
            self.close()
            raise ForkRefused(text.removeprefix("refused: ") or f"exited with code {self.process.wait()}")

    async def spawn(
        self, args: Sequence[str], *, env: Mapping[str, str], cwd: Path, stderr: IO[bytes] | None, nice: int
    ) -> ForkedProcess:
        """Fork one server with these arguments, environment, directory and stderr.

        Raises:
            OSError: The fork server is gone or refused the request.
        """
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_fd = stderr.fileno() if stderr is not None else os.open(os.devnull, os.O_WRONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ours = [stdin_w, stdout_r]
        try:
            # Never blocking the worker's loop: a fork server that stopped answering is an OSError here
            # (a plain start), not a hung worker.
            conn.setblocking(False)
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(SPAWN_TIMEOUT_S):
                await loop.sock_connect(conn, str(self.socket_path))
            body = json.dumps({"args": list(args), "env": dict(env), "cwd": str(cwd), "nice": nice}).encode()
            request = _HEADER.pack(len(body)) + body
            sent = socket.send_fds(conn, [request], [stdin_r, stdout_w, stderr_fd])
            if sent < len(request):  # the rest, without descriptors
                await asyncio.wait_for(loop.sock_sendall(conn, request[sent:]), SPAWN_TIMEOUT_S)
            pid = _pid_of(await _read_line(conn, timeout_s=SPAWN_TIMEOUT_S))
        except BaseException:
            conn.close()
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w):
                os.close(fd)
            if stderr is None:
                os.close(stderr_fd)
        return await ForkedProcess.attach(pid, conn, stdin_w=stdin_w, stdout_r=stdout_r)

    def close(self) -> None:
        """Stop the fork server (its children keep running until their stdin closes)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class ForkServers:
    """The node's fork servers, one per server program, started at first use."""

    switch: bool | None = None
    """On or off; None: as `GYMFLOW_FORK_SERVERS` says when asked (on unless `0`)."""
    servers: dict[ForkTarget, ForkServer] = field(default_factory=dict)
    refused: dict[ForkTarget, str] = field(default_factory=dict)
    _locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[ForkTarget, asyncio.Lock]] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    """Per event loop (an asyncio lock belongs to the loop it first waited in), then per program."""

    @property
    def enabled(self) -> bool:
        return self.switch if self.switch is not None else os.environ.get(ENV_SWITCH, "1") != "0"

    async def spawn(
        self,
        executable: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path | None,
        stderr: IO[bytes] | None,
        nice: int = 0,
        preload: Sequence[str] = (),
    ) -> ForkedProcess | None:
        """A forked server for this command, or None when it gets the plain start."""
        if not self.enabled or cwd is None:
            return None
        target = fork_target(executable, args, env, cwd, preload)
        if target is None or target in self.refused:
            return None
        server = await self._server(target, env)
        if server is None:
            return None
        try:
            process = await server.spawn(server_args(target, args), env=env, cwd=cwd, stderr=stderr, nice=nice)
            process.target = target
            return process
        except OSError as exc:  # it died since: the next spawn starts a new one; this one starts plain
            log.warning("fork server of %s failed a spawn (%s); starting this server plainly", _name(target), exc)
            server.close()
            self.servers.pop(target, None)
            return None

    async def _server(self, target: ForkTarget, env: Mapping[str, str]) -> ForkServer | None:
        lock = self._locks.setdefault(asyncio.get_running_loop(), {}).setdefault(target, asyncio.Lock())
        async with lock:
            server = self.servers.get(target)
            if server is not None and server.alive:
                return server
            basics = {k: v for k, v in env.items() if k in {"PATH", "HOME", "LANG", "LC_ALL", "VIRTUAL_ENV", "TMPDIR"}}
            server = ForkServer(target, {**basics, **dict(target.python_env)})
            try:
                await server.start()
            except ForkRefused as exc:
                self.refused[target] = str(exc)
                log.warning("%s gets a plain start per rollout: its fork server %s", _name(target), exc)
                return None
            self.servers[target] = server
            return server

    def stop(self, targets: Iterable[ForkTarget]) -> None:
        """Stop the fork servers of these programs (an env that used them shut down). Servers forked
        from them keep running; a later spawn starts a new fork server."""
        for target in targets:
            server = self.servers.pop(target, None)
            if server is not None:
                server.close()

    def close(self) -> None:
        """Stop every fork server and forget refusals (the next spawn starts afresh)."""
        for server in self.servers.values():
            server.close()
        self.servers.clear()
        self.refused.clear()


_NODE = ForkServers()


def node_fork_servers() -> ForkServers:
    """This process's fork servers (one set per worker process)."""
    return _NODE


class ForkedProcess:
    """A forked server, driven like `anyio.abc.Process`: pid, stdin, stdout, returncode, wait()."""

    def __init__(self, pid: int, conn: socket.socket, stdin: _PipeSend, stdout: _PipeReceive) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self.target: ForkTarget | None = None
        """The program whose fork server forked it."""
        self._conn = conn
        self._exited = asyncio.Event()
        self._watch = asyncio.get_running_loop().create_task(self._watch_exit(), name=f"forked-{pid}")

    @classmethod
    async def attach(cls, pid: int, conn: socket.socket, *, stdin_w: int, stdout_r: int) -> ForkedProcess:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 24)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(stdout_r, "rb", 0))
        pipe = os.fdopen(stdin_w, "wb", 0)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, pipe)
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        return cls(pid, conn, _PipeSend(writer), _PipeReceive(reader))

    async def _watch_exit(self) -> None:
        try:
            line = await _read_line(self._conn, timeout_s=None)
            if line.startswith("exit "):
                self.returncode = int(line.split()[1])
            else:  # the fork server died first: wait for the process itself, its code unknown
                await _gone(self.pid)
                self.returncode = STATUS_UNKNOWN
        finally:
            self._conn.close()
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGKILL)


class _PipeSend(ByteSendStream):
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def send(self, item: bytes) -> None:
        if self._writer.is_closing():
            raise anyio.ClosedResourceError
        self._writer.write(item)
        try:
            await self._writer.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        self._writer.close()  # the pipe's end closes now (a plain protocol has no close waiter)
        await asyncio.sleep(0)


class _PipeReceive(ByteReceiveStream):
    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    async def receive(self, max_bytes: int = 65536) -> bytes:
        data = await self._reader.read(max_bytes)
        if not data:
            raise anyio.EndOfStream
        return data

    async def aclose(self) -> None:
        self._reader.feed_eof()


def _pid_of(reply: str) -> int:
    if not reply.startswith("pid "):
        raise OSError(f"the fork server refused the spawn: {reply or 'no answer'}")
    return int(reply.split()[1])


async def _read_line(conn: socket.socket, *, timeout_s: float | None) -> str:
    """One line from a fork server's connection ('' at its end)."""
    loop = asyncio.get_running_loop()
    data = b""
    async with asyncio.timeout(timeout_s):
        while not data.endswith(b"\n"):
            chunk = await loop.sock_recv(conn, 256)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").strip()


async def _gone(pid: int) -> None:
    """Return once `pid` has exited (it is not our child, so it cannot be waited for)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        while _exists(pid):  # noqa: ASYNC110 - not our child: nothing tells us when it ends
            await asyncio.sleep(0.05)
        return
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    loop.add_reader(pidfd, ready.set)
    try:
        await ready.wait()
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _name(target: ForkTarget) -> str:
    return f"`-m {target.module}`" if target.module else target.path or "?"
