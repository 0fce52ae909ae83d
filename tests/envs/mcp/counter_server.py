"""A stateful MCP server for tests: a counter kept in memory, every execution logged to a file.

The log (`executions.log` in the server's cwd, i.e. the rollout workspace) lets tests count on
the server side how many times each tool really ran. With `COUNTER_LOG=/path` in its environment
every increment is also appended there as a JSON line (`{"tag", "by", "value", "pid"}`): a log
outside the workspace that outlives the rollout, its server and its worker (chaos tests).
`python counter_server.py --port N` serves streamable HTTP on 127.0.0.1:N instead of stdio (a
per-rollout HTTP server), requiring `GYMFLOW_MCP_TOKEN` as a bearer token when it is set.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import Image, MCPServer

from gymflow.envs.mcp.http import serve_http

server = MCPServer("counter")
_state = {"value": 0}
MAX_BLOB_CHARS = 64 * 1024 * 1024


def _log(line: str) -> None:
    with Path("executions.log").open("a") as f:
        f.write(line + "\n")


def _shared_log(record: dict[str, object]) -> None:
    path = os.environ.get("COUNTER_LOG")
    if path:
        # One write of one line with O_APPEND: concurrent servers never interleave their lines.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)


@server.tool()
def increment(by: int, tag: str = "") -> int:
    """Add `by` to the counter and return the new value (`tag` names the call in the shared log)."""
    _state["value"] += by
    _log(f"increment {by}")
    _shared_log({"tag": tag, "by": by, "value": _state["value"], "pid": os.getpid()})
    return _state["value"]


@server.tool()
def blob(size: int) -> str:
    """A text of `size` characters (a huge tool output)."""
    return "x" * max(0, min(size, MAX_BLOB_CHARS))


@server.tool()
def get() -> int:
    """The counter's value."""
    return _state["value"]


@server.tool()
def sleep(seconds: float) -> str:
    """Block for `seconds` (a hung or slow tool)."""
    time.sleep(seconds)
    return "awake"


@server.tool()
def write_note(name: str, text: str) -> str:
    """Write a file in the server's working directory (the rollout workspace)."""
    Path(name).write_text(text)
    return f"wrote {name}"


@server.tool()
def list_files() -> list[str]:
    """Files in the server's working directory."""
    return sorted(p.name for p in Path().iterdir() if not p.name.startswith("."))


@server.tool()
def image(size: int) -> Image:
    """A PNG-typed image of `size` bytes."""
    return Image(data=os.urandom(size), format="png")


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--port":
        serve_http(server, port=int(sys.argv[2]))
    else:
        server.run()
