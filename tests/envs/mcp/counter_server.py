"""A stateful MCP server for tests: a counter kept in memory, every execution logged to a file.

The log (`executions.log` in the server's cwd, i.e. the rollout workspace) lets tests count on
the server side how many times each tool really ran. `python counter_server.py --port N` serves
streamable HTTP on 127.0.0.1:N instead of stdio (a per-rollout HTTP server).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import Image, MCPServer

server = MCPServer("counter")
_state = {"value": 0}


def _log(line: str) -> None:
    with Path("executions.log").open("a") as f:
        f.write(line + "\n")


@server.tool()
def increment(by: int) -> int:
    """Add `by` to the counter and return the new value."""
    _state["value"] += by
    _log(f"increment {by}")
    return _state["value"]


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
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
