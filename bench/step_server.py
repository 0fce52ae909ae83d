"""The benchmark's `step` tool as an MCP server (`python bench/step_server.py`, by path: servers start
in a workspace): what the shared-mode density run (bench.shared_density) serves every rollout of a
worker from one process."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("step")


@server.tool(structured_output=False)
def step(i: int) -> str:
    """Take step i."""
    return f"step {i} done"


if __name__ == "__main__":
    server.run()
