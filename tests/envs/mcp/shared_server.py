"""An MCP server for the shared-mode tests: one process serves many rollouts, told apart by the
`_meta` of each call (gymflow.envs.mcp.env.ROLLOUT_META, WORKSPACE_META)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("shared")


def _meta(ctx: Context[Any, Any]) -> dict[str, Any]:
    meta = ctx.request_context.meta
    return dict(meta) if meta else {}


@server.tool()
def whoami(ctx: Context[Any, Any]) -> str:
    """This server's pid, and the rollout and workspace the call came for."""
    meta = _meta(ctx)
    return json.dumps(
        {"pid": os.getpid(), "rollout": meta.get("gymflow/rollout_id"), "workspace": meta.get("gymflow/workspace")}
    )


@server.tool()
def note(text: str, ctx: Context[Any, Any]) -> str:
    """Write `text` to note.txt in the calling rollout's workspace; what was there before."""
    path = Path(_meta(ctx)["gymflow/workspace"]) / "note.txt"
    before = path.read_text() if path.exists() else ""
    path.write_text(text)
    return before


@server.tool()
def crash() -> str:
    """Exit the process (a shared server dying under every rollout)."""
    os._exit(3)


if __name__ == "__main__":
    server.run()
