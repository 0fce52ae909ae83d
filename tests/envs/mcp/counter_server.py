"""A stateful MCP server for tests: a counter kept in memory, every execution logged to a file.

The log (`executions.log` in the server's cwd, i.e. the rollout workspace) lets tests count on
the server side how many times each tool really ran.
"""

from __future__ import annotations

import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer

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


if __name__ == "__main__":
    server.run()
