"""Per-rollout streamable-HTTP MCP servers: a process started on a free loopback port.

The config gives a command and a url with a `{port}` placeholder; this module picks a free port,
substitutes it, starts the process in its own process group (so it and its children can be
killed, and reaped as orphans after a worker crash) and waits until the port accepts connections.
Picking a port and the server binding it is a race another process can win: a server that exits
before it listens is retried on a fresh port a few times.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path

import anyio
from anyio.abc import Process

from envs.contract import InfraError
from envs.mcp.config import PORT, McpServerConfig
from envs.mcp.transport import kill_group, server_env

LOOPBACK = "127.0.0.1"
PORT_ATTEMPTS = 3
"""Fresh ports tried when a server exits before it listens (someone else took the port)."""
_POLL_S = 0.05
_EXIT_GRACE_S = 1.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


class HttpServerProcess:
    """One streamable-HTTP server process for one rollout."""

    def __init__(self, config: McpServerConfig, *, workspace: Path, log_path: Path) -> None:
        self.config = config
        self.workspace = workspace
        self.log_path = log_path
        self.process: Process | None = None
        self.url: str | None = None

    @property
    def pid(self) -> int | None:
        """The server's pid once started."""
        return self.process.pid if self.process else None

    @property
    def returncode(self) -> int | None:
        """The exit code once the server has exited, else None."""
        return self.process.returncode if self.process else None

    async def start(self) -> str:
        """Start the server and wait until it listens; returns its URL.

        Raises:
            InfraError: It exited on every port tried, or did not listen within the startup timeout.
        """
        assert self.config.url is not None
        deadline = time.monotonic() + self.config.startup_timeout_s
        for _ in range(PORT_ATTEMPTS):
            port = free_port()
            args, env = self.config.render(workspace=str(self.workspace), port=port)
            cwd = Path(self.config.cwd) if self.config.cwd else self.workspace
            with self.log_path.open("ab") as log:  # the child keeps its own copy of the descriptor
                self.process = await anyio.open_process(
                    [self.config.executable(), *args],
                    env=server_env(env),
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            if await self._listening(port, deadline):
                self.url = self.config.url.replace(PORT, str(port))
                return self.url
            if self.process.returncode is None:  # still running but never listened in time
                await self.stop()
                raise InfraError(
                    f"HTTP MCP server did not listen on port {port} within {self.config.startup_timeout_s}s"
                )
        raise InfraError(
            f"HTTP MCP server exited with code {self.returncode} before listening ({PORT_ATTEMPTS} ports tried); "
            f"see {self.log_path}"
        )

    async def _listening(self, port: int, deadline: float) -> bool:
        assert self.process is not None
        while time.monotonic() < deadline and self.process.returncode is None:
            with contextlib.suppress(OSError):
                stream = await anyio.connect_tcp(LOOPBACK, port)
                await stream.aclose()
                return True
            await anyio.sleep(_POLL_S)
        return False

    async def wait(self) -> None:
        """Return once the server process has exited."""
        if self.process is not None:
            await self.process.wait()

    def kill(self) -> None:
        """Kill the server's process group now."""
        if self.process is not None:
            kill_group(self.process)

    async def stop(self) -> None:
        """Ask the server to exit (SIGTERM), then kill its group after a grace period."""
        if self.process is None or self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.terminate()
        with anyio.move_on_after(_EXIT_GRACE_S):
            await self.process.wait()
        self.kill()
        with anyio.move_on_after(_EXIT_GRACE_S):
            await self.process.wait()
