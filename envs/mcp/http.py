"""Per-rollout streamable-HTTP MCP servers: a process started on a free loopback port.

The config gives a command and a url with a `{port}` placeholder; this module picks a free port,
substitutes it, starts the process in its own process group (so it and its children can be
killed, and reaped as orphans after a worker crash) and waits until the port accepts connections.
Picking a port and the server binding it is a race another process can win: a server that exits
before it listens is retried on a fresh port a few times.

Loopback keeps the server off the network, not away from other processes on the node. A server
that checks a bearer token (`bearer_token: true`; gymflow's own servers do it with `serve_http`)
gets a fresh random token per process in its environment (`GYMFLOW_MCP_TOKEN`, never on its
command line, where `ps` would show it), and the client sends it with every request: another
rollout's model, or any local process, cannot call this rollout's tools. Tokens live in memory
only — never in the ledger, logs, workflow input or history.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import Process

from gymflow.envs.errors import InfraError
from gymflow.envs.mcp.config import PORT, TOKEN_ENV, McpServerConfig
from gymflow.envs.runtime.transport import kill_group, server_env, with_log_tail

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK = "127.0.0.1"
PORT_ATTEMPTS = 3
"""Fresh ports tried when a server exits before it listens (someone else took the port)."""
_POLL_S = 0.05
_EXIT_GRACE_S = 1.0
TOKEN_PREFIX = "gfmcp_"
"""Start of every per-rollout server token: a leak scanner can find them without knowing them."""
_CLIENT_TIMEOUT_S = 30.0
_CLIENT_READ_TIMEOUT_S = 300.0


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
        self.token: str | None = TOKEN_PREFIX + secrets.token_hex(24) if config.bearer_token else None
        """The server's bearer token (None unless the config asks for one)."""

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
            args, env = self.config.render(workspace=str(self.workspace), port=port, token=self.token)
            cwd = self.config.working_dir(self.workspace)
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
                    with_log_tail(
                        f"HTTP MCP server did not listen on port {port} within {self.config.startup_timeout_s}s",
                        self.log_path,
                    )
                )
        # The log goes with the workspace: the error carries its end (whatever the last attempt said).
        raise InfraError(
            with_log_tail(
                f"HTTP MCP server exited with code {self.returncode} before listening ({PORT_ATTEMPTS} ports tried)",
                self.log_path,
            )
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

    def transport(self) -> Any:
        """What `mcp.Client` connects with: the URL, or a transport sending the bearer token."""
        assert self.url is not None
        return self.url if self.token is None else _bearer_transport(self.url, self.token)


@contextlib.asynccontextmanager
async def _bearer_transport(url: str, token: str) -> AsyncIterator[Any]:
    """Streamable HTTP with `Authorization: Bearer <token>` on every request."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(_CLIENT_TIMEOUT_S, read=_CLIENT_READ_TIMEOUT_S)
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


class BearerGuard:
    """ASGI middleware answering 401 to any HTTP request without `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await send(
                    {"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]}
                )
                await send({"type": "http.response.body", "body": b"missing or wrong bearer token"})
                return
        await self.app(scope, receive, send)


def serve_http(server: MCPServer, *, port: int, token: str | None = None) -> None:
    """Serve an MCP server over streamable HTTP on 127.0.0.1:`port` (the per-rollout way).

    With a token (default: `GYMFLOW_MCP_TOKEN` from the environment, set when the config says
    `bearer_token: true`), requests without `Authorization: Bearer <token>` get a 401.
    """
    import os

    import uvicorn

    token = token if token is not None else os.environ.get(TOKEN_ENV)
    app: Any = server.streamable_http_app()
    if token:
        app = BearerGuard(app, token)
    uvicorn.run(app, host=LOOPBACK, port=port, log_level="warning")
