"""The workspace judge's MCP server: read-only tools over a snapshot of the judged rollout's workspace.

``python -m gymflow.envs.builtin.workspace_judge.server``, started in the judge rollout's own
workspace, whose ``judged/`` directory holds the snapshot (gymflow.envs.builtin.workspace_judge.env).
Every path is resolved inside ``judged/`` (no absolute paths, ``..`` or symlinks out); databases
are opened read-only three times over (gymflow.envs.builtin.crm.readonly). Errors are ``ToolError``s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from gymflow.envs.builtin.crm.readonly import Database
from gymflow.envs.runtime.workspace import WorkspaceError, resolve_inside

SNAPSHOT = "judged"
"""The snapshot's directory in the judge's workspace."""
MAX_ENTRIES = 500
MAX_READ_CHARS = 20_000

RelPath = Annotated[str, Field(min_length=1, max_length=500, description="a path relative to the judged workspace")]

server = MCPServer(
    "workspace-judge",
    instructions="Read-only tools over a snapshot of the workspace of the rollout you judge.",
)


def _inside(path: str) -> Path:
    try:
        return resolve_inside(Path(SNAPSHOT), path)
    except WorkspaceError as exc:
        raise ToolError(str(exc)) from None


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@server.tool(structured_output=False)
def list_files(path: str = ".") -> str:
    """The files under `path` of the judged workspace (recursive), with their sizes in bytes."""
    root = _inside(path)
    if not root.is_dir():
        raise ToolError(f"no directory {path!r} in the judged workspace")
    base = Path(SNAPSHOT).resolve()
    files = []
    for entry in sorted(root.rglob("*")):
        if entry.is_file():
            files.append({"path": str(entry.resolve().relative_to(base)), "bytes": entry.stat().st_size})
        if len(files) >= MAX_ENTRIES:
            break
    return _json({"files": files, "count": len(files), **({"truncated": True} if len(files) >= MAX_ENTRIES else {})})


@server.tool(structured_output=False)
def read_file(path: RelPath, offset: Annotated[int, Field(ge=0)] = 0) -> str:
    """Text of a file of the judged workspace, from character `offset`, at most 20,000 characters."""
    target = _inside(path)
    if not target.is_file():
        raise ToolError(f"no file {path!r} in the judged workspace")
    text = target.read_bytes().decode("utf-8", errors="replace")
    part = text[offset : offset + MAX_READ_CHARS]
    more = offset + len(part) < len(text)
    if not more:
        return part
    return part + f"\n[... {len(text) - offset - len(part)} more characters: read from offset {offset + len(part)}]"


@server.tool(structured_output=False)
def query_db(
    path: RelPath,
    sql: Annotated[str, Field(min_length=1, max_length=5000)],
    params: list[str | int | float | None] | None = None,
) -> str:
    """Run one read-only SELECT (with ? parameters) on a SQLite database of the judged workspace."""
    target = _inside(path)
    columns, rows, more = Database(target).rows(sql, list(params or []))
    return _json({"columns": columns, "rows": [list(r) for r in rows], "count": len(rows), "truncated": more})


if __name__ == "__main__":
    server.run()
