"""One live MCP client session to one server, usable from any task.

`mcp.Client` is an async context manager whose task group must be entered and left by the
same task, but a rollout's tool calls arrive in different Temporal activities (different
tasks). So each session runs in a small owner task that holds the client open until `close()`,
and callers talk to the client from wherever they are.

A session knows when its server is gone without being asked (`ended`): the stdio server's
stdout closed, the per-rollout HTTP server process exited, or the client itself failed. The
warm pool waits on it to replace dead servers; calls check it to fail fast with InfraError,
whose message ends with what the server last wrote to stderr (`describe_death`), so the reason
reaches the rollout's error, the logs and `gymflow inspect` before the log file is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import mcp_types
from mcp import Client
from mcp.shared.exceptions import MCPError

from gymflow.envs.contract import ToolResult, ToolSpec
from gymflow.envs.errors import InfraError, ToolError
from gymflow.envs.mcp.config import WORKSPACE, McpServerConfig
from gymflow.envs.mcp.content import Parser, apply_parser, render_result
from gymflow.envs.mcp.http import HttpServerProcess
from gymflow.envs.runtime.base import Sandbox
from gymflow.envs.runtime.forkserver import ForkedProcess, ForkTarget, node_fork_servers
from gymflow.envs.runtime.transport import ProcessTransport, with_log_tail

_KILL_CONFIRM_S = 5.0
"""Longest a tool timeout waits for the killed server to be gone before answering."""
_MODEL_VISIBLE_CODES = frozenset({mcp_types.INVALID_PARAMS, mcp_types.METHOD_NOT_FOUND})
"""JSON-RPC errors that older servers use for bad arguments / unknown tools: the model's fault."""
_SETTLE_S = 2.0
"""Longest a call whose connection broke waits to see the server gone, so its error can say how
it ended (exit code, stderr) rather than only that the connection closed."""


class McpSession:
    """A started MCP server plus a connected client."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        *,
        workspace: Path,
        parsers: dict[str, Parser] | None = None,
        nice: int = 0,
        sandbox: Sandbox | None = None,
        sandbox_name: str | None = None,
    ) -> None:
        """`sandbox`: run the server inside it (its command spawned through `Sandbox.stdio_command`);
        `sandbox_name`: the rollout's sandbox, for the `{sandbox}` placeholder of a server outside it."""
        self.sandbox = sandbox
        self.sandbox_name = sandbox_name
        self.name = name
        self.nice = nice
        self.config = config
        self.workspace = workspace
        self.parsers = parsers or {}
        self.log_path = workspace.parent / f"{workspace.name}.{name}.stderr.log"
        """The server's stderr (and an HTTP server's stdout), beside the workspace; deleted with it."""
        self.transport: ProcessTransport | None = None
        self.http_process: HttpServerProcess | None = None
        self.tools: list[mcp_types.Tool] = []
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()
        self._ended = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._failure: BaseException | None = None

    @property
    def pid(self) -> int | None:
        """Pid of the server process (None for a fixed-URL server)."""
        if self.transport is not None:
            return self.transport.pid
        return self.http_process.pid if self.http_process else None

    @property
    def fork_target(self) -> ForkTarget | None:
        """The program whose fork server forked this server (None: started plainly, or not ours)."""
        process = self.transport.process if self.transport is not None else None
        return process.target if isinstance(process, ForkedProcess) else None

    @property
    def client(self) -> Client:
        """The connected MCP client (for resources, prompts, raw calls).

        Raises:
            InfraError: The server is gone.
        """
        if self._client is None or not self.alive:
            raise InfraError(self.describe_death())
        return self._client

    @property
    def returncode(self) -> int | None:
        """Exit code of the server process once it has exited."""
        if self.transport is not None:
            return self.transport.returncode
        return self.http_process.returncode if self.http_process else None

    @property
    def alive(self) -> bool:
        """Whether the server is still running and the client connected."""
        if self._ended.is_set() or self._client is None or self._owner is None or self._owner.done():
            return False
        return self.returncode is None

    async def wait_ended(self) -> None:
        """Return once the server is gone (exited, closed its stdout, or the client failed)."""
        await self._ended.wait()

    def describe_death(self, detail: str | None = None) -> str:
        """Why the session is not alive, for error messages: the exit code or failure, then
        `detail` (the error a call got), then the end of the server's stderr when it wrote any."""
        if self.returncode is not None:
            head = f"MCP server {self.name!r} (pid {self.pid}) exited with code {self.returncode}"
        elif self._failure is not None:
            head = f"MCP server {self.name!r} failed: {self._failure!r}"
        elif self._ended.is_set():
            head = f"MCP server {self.name!r} (pid {self.pid}) closed its connection"
        else:
            return f"MCP server {self.name!r} is not connected" + (f": {detail}" if detail else "")
        return with_log_tail(head + (f": {detail}" if detail else ""), self.log_path)

    async def start(self) -> None:
        """Start the server and complete the MCP handshake, or raise InfraError."""
        target: Any
        if self.config.per_rollout_http:
            self.http_process = HttpServerProcess(self.config, workspace=self.workspace, log_path=self.log_path)
            await self.http_process.start()
            target = self.http_process.transport()  # the URL, with the bearer token when it has one
            self._watch(self.http_process.wait())
        elif self.config.command is not None:
            command, args, env, cwd = self._spawn()
            forks = node_fork_servers() if self.config.fork and self.sandbox is None else None
            self.transport = ProcessTransport(
                command,
                args,
                env=env,
                cwd=cwd,
                stderr_path=self.log_path,
                nice=self.nice,
                forks=forks,
                preload=self.config.preload,
            )
            target = self.transport
        else:
            target = self.config.url
        self._owner = asyncio.create_task(self._own(target), name=f"mcp-session-{self.name}")
        ready = asyncio.create_task(self._ready.wait())
        try:
            done, _ = await asyncio.wait(
                {ready, self._owner}, timeout=self.config.startup_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ready.cancel()
        if not self._ready.is_set():
            await self.close()
            timeout = f"no handshake within {self.config.startup_timeout_s}s"
            reason = self.describe_death() if done else with_log_tail(timeout, self.log_path)
            raise InfraError(f"could not start MCP server {self.name!r}: {reason}")
        assert self._client is not None
        if self.transport is not None:
            self._watch(self.transport.closed.wait())
        listing = await self._client.list_tools()
        allowed = self.config.allowed_tools
        self.tools = [t for t in listing.tools if allowed is None or t.name in allowed]

    def _spawn(self) -> tuple[str, list[str], dict[str, str], Path]:
        """The host command of a stdio server: its own, or the sandbox's wrapper around it."""
        assert self.config.command is not None
        if self.sandbox is None:
            args, env = self.config.render(workspace=str(self.workspace), sandbox=self.sandbox_name)
            return self.config.executable(), args, env, self.config.working_dir(self.workspace)
        mount = self.sandbox.workspace_mount
        args, env = self.config.render(workspace=mount, sandbox=self.sandbox_name)
        cwd = self.config.cwd.replace(WORKSPACE, mount) if self.config.cwd else None
        # A sandbox on the worker's own root (bwrap) runs the worker's interpreter for `python`.
        command = self.config.executable() if self.sandbox.shares_host_root else self.config.command
        spawn = self.sandbox.stdio_command([command, *args], cwd=cwd, env=env)
        return spawn.argv[0], spawn.argv[1:], spawn.env, Path(spawn.cwd) if spawn.cwd else self.workspace

    def _watch(self, event: Any) -> None:
        async def watch() -> None:
            await event
            self._ended.set()

        self._watchers.append(asyncio.create_task(watch(), name=f"mcp-watch-{self.name}"))

    async def _own(self, target: Any) -> None:
        try:
            async with Client(target) as client:
                self._client = client
                self._ready.set()
                await self._closing.wait()
        except Exception as exc:  # the owner task must record, not lose, why the session died
            self._failure = exc
        finally:
            self._client = None
            self._ended.set()

    def tool_specs(self) -> list[ToolSpec]:
        """The allowed tools of this server as contract ToolSpecs."""
        return [
            ToolSpec(name=t.name, description=t.description or "", input_schema=dict(t.input_schema), server=self.name)
            for t in self.tools
        ]

    async def call(self, tool: str, arguments: dict[str, Any], *, meta: dict[str, Any] | None = None) -> ToolResult:
        """Call a tool. Tool failures come back as is_error results; machinery failures raise InfraError."""
        if self.config.allowed_tools is not None and tool not in self.config.allowed_tools:
            raise ToolError(f"tool {tool!r} is not allowed on server {self.name!r}")
        if not self.alive or self._client is None:
            raise InfraError(self.describe_death())
        timeout = self.config.timeout_for(tool)
        try:
            with anyio.fail_after(timeout):
                result = await self._client.call_tool(
                    tool, arguments, meta=cast(mcp_types.RequestParamsMeta | None, meta)
                )
        except TimeoutError:
            # A hung server may never answer again; kill it so the rollout is recovered on a
            # fresh one instead of every later call hanging too. The observation says the server
            # was stopped, so wait (briefly) until it really is gone: its stdout closing (or its
            # process exiting) means the kernel has torn it down.
            self.kill()
            if self.transport is not None or self.http_process is not None:  # a process of ours
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._gone(), _KILL_CONFIRM_S)
            return ToolResult(
                text=f"tool {tool!r} timed out after {timeout:g}s and its server was stopped", is_error=True
            )
        except MCPError as exc:
            if exc.code in _MODEL_VISIBLE_CODES and self.alive:
                return ToolResult(text=f"error: {exc.message}", is_error=True)
            if exc.code == mcp_types.CONNECTION_CLOSED:
                await self._settle()
            raise InfraError(self.describe_death(str(exc)) if not self.alive else f"MCP protocol error: {exc}") from exc
        except (
            anyio.ClosedResourceError,
            anyio.BrokenResourceError,
            anyio.EndOfStream,
            ConnectionError,
            httpx.TransportError,
        ) as exc:
            await self._settle()
            raise InfraError(self.describe_death(repr(exc))) from exc
        rendered = render_result(result, workspace=self.workspace, max_inline_bytes=self.config.max_inline_media_bytes)
        parser = self.parsers.get(tool)
        return rendered if parser is None else await apply_parser(parser, rendered)

    async def _settle(self) -> None:
        """Wait (briefly) until a server process of ours whose connection broke is seen gone: the
        connection breaks as the process exits, a moment before its exit is reaped. (A fixed-URL
        server is not ours to watch: its error is said at once.)"""
        if self.transport is None and self.http_process is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._gone(), _SETTLE_S)

    async def _gone(self) -> None:
        """Return once a killed server has exited: its stdout closed, then its exit status reaped (a
        killed process closes its files before it has finished exiting, which on a busy machine can
        take a while)."""
        await self._ended.wait()
        process = self.transport.process if self.transport is not None else None
        if process is not None:
            await process.wait()

    def kill(self) -> None:
        """Kill the server process now; the session becomes dead."""
        if self.transport is not None:
            self.transport.kill()
        if self.http_process is not None:
            self.http_process.kill()

    async def close(self) -> None:
        """Stop the server and the client. Idempotent."""
        self._closing.set()
        if self._owner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._owner), timeout=5)
            if not self._owner.done():
                self.kill()
                self._owner.cancel()
                with contextlib.suppress(BaseException):
                    await self._owner
        if self.http_process is not None:
            await self.http_process.stop()
        for watcher in self._watchers:
            watcher.cancel()
        self._ended.set()
