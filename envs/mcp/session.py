"""One live MCP client session to one server process, usable from any task.

`mcp.Client` is an async context manager whose task group must be entered and left by the
same task, but a rollout's tool calls arrive in different Temporal activities (different
tasks). So each session runs in a small owner task that holds the client open until `close()`,
and callers talk to the client from wherever they are.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import anyio
import mcp_types
from mcp import Client
from mcp.shared.exceptions import MCPError

from envs.contract import InfraError, ToolError, ToolResult, ToolSpec
from envs.mcp.config import McpServerConfig
from envs.mcp.transport import ProcessTransport

_MODEL_VISIBLE_CODES = frozenset({mcp_types.INVALID_PARAMS, mcp_types.METHOD_NOT_FOUND})
"""JSON-RPC errors that older servers use for bad arguments / unknown tools: the model's fault."""


class McpSession:
    """A started MCP server plus a connected client."""

    def __init__(self, name: str, config: McpServerConfig, *, workspace: Path) -> None:
        self.name = name
        self.config = config
        self.workspace = workspace
        self.transport: ProcessTransport | None = None
        self.tools: list[mcp_types.Tool] = []
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    @property
    def pid(self) -> int | None:
        """Pid of the server process (stdio servers only)."""
        return self.transport.pid if self.transport else None

    @property
    def alive(self) -> bool:
        """Whether the server process is still running and the client connected."""
        if self._client is None or self._owner is None or self._owner.done():
            return False
        return self.transport is None or self.transport.returncode is None

    def describe_death(self) -> str:
        """Why the session is not alive, for error messages."""
        if self.transport is not None and self.transport.returncode is not None:
            return f"MCP server {self.name!r} (pid {self.transport.pid}) exited with code {self.transport.returncode}"
        if self._failure is not None:
            return f"MCP server {self.name!r} failed: {self._failure!r}"
        return f"MCP server {self.name!r} is not connected"

    async def start(self) -> None:
        """Start the server and complete the MCP handshake, or raise InfraError."""
        self._owner = asyncio.create_task(self._own(), name=f"mcp-session-{self.name}")
        ready = asyncio.create_task(self._ready.wait())
        try:
            done, _ = await asyncio.wait(
                {ready, self._owner}, timeout=self.config.startup_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ready.cancel()
        if not self._ready.is_set():
            await self.close()
            reason = self.describe_death() if done else f"no handshake within {self.config.startup_timeout_s}s"
            raise InfraError(f"could not start MCP server {self.name!r}: {reason}")
        assert self._client is not None
        listing = await self._client.list_tools()
        allowed = self.config.allowed_tools
        self.tools = [t for t in listing.tools if allowed is None or t.name in allowed]

    async def _own(self) -> None:
        try:
            if self.config.url is not None:
                target: Any = self.config.url
            else:
                self.transport = ProcessTransport(
                    self.config.executable(),
                    self.config.args,
                    env=self.config.env,
                    cwd=Path(self.config.cwd) if self.config.cwd else self.workspace,
                    stderr_path=self.workspace.parent / f"{self.workspace.name}.{self.name}.stderr.log",
                )
                target = self.transport
            async with Client(target) as client:
                self._client = client
                self._ready.set()
                await self._closing.wait()
        except Exception as exc:  # the owner task must record, not lose, why the session died
            self._failure = exc
        finally:
            self._client = None

    def tool_specs(self) -> list[ToolSpec]:
        """The allowed tools of this server as contract ToolSpecs."""
        return [
            ToolSpec(name=t.name, description=t.description or "", input_schema=dict(t.input_schema), server=self.name)
            for t in self.tools
        ]

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """Call a tool. Tool failures come back as is_error results; machinery failures raise InfraError."""
        if self.config.allowed_tools is not None and tool not in self.config.allowed_tools:
            raise ToolError(f"tool {tool!r} is not allowed on server {self.name!r}")
        if not self.alive or self._client is None:
            raise InfraError(self.describe_death())
        timeout = self.config.timeout_for(tool)
        try:
            with anyio.fail_after(timeout):
                result = await self._client.call_tool(tool, arguments)
        except TimeoutError:
            # A hung server may never answer again; kill it so the rollout is recovered on a
            # fresh one instead of every later call hanging too.
            self.kill()
            return ToolResult(
                text=f"tool {tool!r} timed out after {timeout:g}s and its server was stopped", is_error=True
            )
        except MCPError as exc:
            if exc.code in _MODEL_VISIBLE_CODES and self.alive:
                return ToolResult(text=f"error: {exc.message}", is_error=True)
            raise InfraError(f"{self.describe_death() if not self.alive else 'MCP protocol error'}: {exc}") from exc
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, ConnectionError) as exc:
            raise InfraError(f"{self.describe_death()}: {exc!r}") from exc
        return render_result(result)

    def kill(self) -> None:
        """Kill the server process now; the session becomes dead."""
        if self.transport is not None:
            self.transport.kill()

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


def render_result(result: mcp_types.CallToolResult) -> ToolResult:
    """Flatten MCP content blocks into the text the model sees, keeping structured content."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            parts.append(f"[{block.type}: {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(text if text is not None else f"[resource {resource.uri}]")
        else:
            parts.append(f"[{getattr(block, 'type', 'content')}]")
    return ToolResult(text="\n".join(parts), is_error=bool(result.is_error), structured=result.structured_content)
