"""A minimal MCP server over stdio, in the standard library alone.

The bridge runs inside an env package's own venv, next to whatever `mcp` version that package pins
(benchmax needs mcp 1.x, verifiers 0.4.0 pins 2.0.0) or none at all, so it cannot use an MCP SDK: it
speaks the protocol's small stdio subset itself. JSON-RPC 2.0 messages, one per line: `initialize`
(any handshake-era version; a `server/discover` probe gets "method not found", which MCP 2.x clients
take as the cue to use the handshake), `ping`, `tools/list`, `tools/call` and
`notifications/cancelled`. Each request runs in its own task, so a long tool call never holds up a
ping or a second call; replies go out as they are ready.

stdout is the protocol channel, and env code prints (benchmax logs tool errors with `print`), so
`take_stdout` moves the real stdout to a private descriptor first and points descriptor 1 (and every
child process's stdout) at stderr, which gymflow keeps in the server's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
"""MCP revisions reachable by the `initialize` handshake; the newest is offered to newer clients."""
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

ToolHandler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
"""(tool name, arguments) -> an MCP `CallToolResult` dict."""


class Channel:
    """The protocol's half of stdout: newline-delimited JSON written to a private descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, default=str, ensure_ascii=False) + "\n").encode()
        with self._lock:
            view = memoryview(data)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]


def take_stdout() -> Channel:
    """Move the real stdout to a private descriptor for the protocol; fd 1 becomes stderr."""
    sys.stdout.flush()
    fd = os.dup(1)  # not inherited by child processes
    os.dup2(2, 1)
    return Channel(fd)


def text_result(text: str, *, is_error: bool = False, structured: Any = None) -> dict[str, Any]:
    """A `CallToolResult` with one text block (and structured content, when given)."""
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if structured is not None:
        result["structuredContent"] = structured
    return result


class Server:
    """Serves `tools()` and `call()` to one MCP client on stdin / the channel until stdin closes."""

    def __init__(
        self,
        channel: Channel,
        *,
        name: str,
        version: str,
        tools: Callable[[], Awaitable[list[dict[str, Any]]]],
        call: ToolHandler,
    ) -> None:
        self.channel = channel
        self.name = name
        self.version = version
        self.tools = tools
        self.call = call
        self._running: dict[Any, asyncio.Task[None]] = {}

    async def serve(self) -> None:
        """Answer requests until stdin reaches EOF (the client went away); running calls are cancelled."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            try:
                message = json.loads(line)
            except ValueError:
                self.channel.send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}})
                continue
            if not isinstance(message, dict):
                continue
            if "id" in message and "method" in message:
                key = message["id"]
                task = asyncio.ensure_future(self._answer(message))
                self._running[key] = task
                task.add_done_callback(self._forget(key))
            elif message.get("method") == "notifications/cancelled":
                running = self._running.get((message.get("params") or {}).get("requestId"))
                if running is not None:
                    running.cancel()
        for task in list(self._running.values()):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    def _forget(self, key: Any) -> Callable[[asyncio.Task[None]], None]:
        """A done-callback dropping request `key` from the running ones."""

        def forget(task: asyncio.Task[None]) -> None:
            del task
            self._running.pop(key, None)

        return forget

    async def _answer(self, request: dict[str, Any]) -> None:
        key, method, params = request["id"], request["method"], request.get("params") or {}
        try:
            result = await self._dispatch(method, params)
        except asyncio.CancelledError:
            return  # the client cancelled it and expects no answer
        except _RpcError as exc:
            self.channel.send({"jsonrpc": "2.0", "id": key, "error": {"code": exc.code, "message": str(exc)}})
            return
        except Exception as exc:  # a bug of the bridge: the client gets it as an error, the server lives on
            self.channel.send(
                {
                    "jsonrpc": "2.0",
                    "id": key,
                    "error": {"code": INTERNAL_ERROR, "message": f"{type(exc).__name__}: {exc}"},
                }
            )
            return
        self.channel.send({"jsonrpc": "2.0", "id": key, "result": result})

    async def _dispatch(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1]
            return {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": self.name, "version": self.version},
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": await self.tools()}
        if method == "tools/call":
            name = params.get("name")
            arguments = params.get("arguments") or {}
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise _RpcError(INVALID_PARAMS, "tools/call needs a tool name and an arguments object")
            return await self.call(name, arguments)
        raise _RpcError(METHOD_NOT_FOUND, f"method not found: {method}")


class _RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
