"""McpEnv: any set of MCP servers as an RL environment, one isolated instance per rollout.

Each rollout gets a fresh workspace directory and its own server process(es) started with that
directory as their cwd; release kills them and deletes the workspace. Tools from all servers
are offered to the model under their own names (a name two servers share is prefixed with the
server name). A subclass supplies the servers (class attribute `mcp_servers`), a system prompt
and `compute_reward`; or build one from config alone with `McpEnv.from_config`.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from envs.contract import BaseEnv, Message, Reward, RolloutNotFound, ToolError, ToolResult, ToolSpec
from envs.mcp import workspace as ws
from envs.mcp.config import McpServerConfig, parse_servers
from envs.mcp.session import McpSession


@dataclass
class _Rollout:
    workspace: Path
    sessions: dict[str, McpSession] = field(default_factory=dict)
    routes: dict[str, tuple[McpSession, str]] = field(default_factory=dict)
    """model-facing tool name -> (session, server-side tool name)"""


class McpEnv(BaseEnv):
    """An environment whose tools are MCP servers, isolated per rollout."""

    mcp_servers: ClassVar[Mapping[str, Any]] = {}
    """Server configs (`mcpServers` format) for subclasses; `from_config` fills it for an instance."""

    def __init__(self, *, workspace_root: Path | None = None, servers: Mapping[str, Any] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.servers: dict[str, McpServerConfig] = parse_servers(servers if servers is not None else self.mcp_servers)
        self.workspace_root = workspace_root or Path(tempfile.gettempdir()) / "gymflow-workspaces"
        self._rollouts: dict[str, _Rollout] = {}
        self._tool_cache: list[ToolSpec] | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> McpEnv:
        """An env from an `mcpServers` mapping alone (no reward beyond the default)."""
        return cls(servers=config, **kwargs)

    # -- lifecycle ---------------------------------------------------------------------------
    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        """Create the workspace, stage `files` ({name: content}) into it, start the servers."""
        files: Mapping[str, str | bytes] = rollout_args.pop("files", {}) or {}
        if rollout_args:
            raise TypeError(f"{type(self).__name__}.init_rollout got unexpected arguments {sorted(rollout_args)}")
        if rollout_id in self._rollouts:  # a retried init: start over cleanly
            await self.release_rollout(rollout_id)
        workspace = ws.resolve_inside(self.workspace_root, _safe_dir_name(rollout_id))
        shutil.rmtree(workspace, ignore_errors=True)
        workspace.mkdir(parents=True)
        rollout = _Rollout(workspace=workspace)
        self._rollouts[rollout_id] = rollout
        try:
            for name, content in files.items():
                ws.write_in(workspace, content, name)
            sessions = [McpSession(name, cfg, workspace=workspace) for name, cfg in self.servers.items()]
            await asyncio.gather(*(s.start() for s in sessions))
            rollout.sessions = {s.name: s for s in sessions}
            rollout.routes = _route(sessions)
        except BaseException:
            await self.release_rollout(rollout_id)
            raise
        if self._tool_cache is None:
            self._tool_cache = self._specs(rollout)

    async def release_rollout(self, rollout_id: str) -> None:
        rollout = self._rollouts.pop(rollout_id, None)
        if rollout is None:
            return
        await asyncio.gather(*(s.close() for s in rollout.sessions.values()), return_exceptions=True)
        shutil.rmtree(rollout.workspace, ignore_errors=True)
        for log in rollout.workspace.parent.glob(f"{rollout.workspace.name}.*.stderr.log"):
            log.unlink(missing_ok=True)

    async def shutdown(self) -> None:
        await asyncio.gather(*(self.release_rollout(r) for r in list(self._rollouts)), return_exceptions=True)

    def live_rollouts(self) -> Sequence[str]:
        """Ids of the rollouts this instance holds."""
        return list(self._rollouts)

    def server_pids(self, rollout_id: str) -> dict[str, int | None]:
        """Server name -> pid for a rollout (for crash tests and orphan reaping)."""
        return {name: s.pid for name, s in self._get(rollout_id).sessions.items()}

    # -- tools -------------------------------------------------------------------------------
    async def list_tools(self) -> list[ToolSpec]:
        if self._tool_cache is None:
            probe = f"probe-{id(self)}"
            await self.init_rollout(probe)
            await self.release_rollout(probe)
        assert self._tool_cache is not None
        return list(self._tool_cache)

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
        rollout = self._get(rollout_id)
        route = rollout.routes.get(tool_name)
        if route is None:
            known = ", ".join(sorted(rollout.routes)) or "none"
            raise ToolError(f"unknown tool {tool_name!r}; available tools: {known}")
        session, server_tool = route
        return await session.call(server_tool, tool_args)

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward | Mapping[str, float]:
        """Default: exact match of the final answer text with the ground truth (override it)."""
        del rollout_id, kwargs
        answer = completion[-1].content.strip() if completion else ""
        return {"exact_match": float(ground_truth is not None and answer == str(ground_truth).strip())}

    # -- workspace ---------------------------------------------------------------------------
    def workspace(self, rollout_id: str) -> Path:
        """The rollout's workspace directory."""
        return self._get(rollout_id).workspace

    async def copy_to_workspace(self, rollout_id: str, src_path: Path, dst_filename: str | None = None) -> None:
        ws.copy_in(self.workspace(rollout_id), src_path, dst_filename)

    async def copy_content_to_workspace(self, rollout_id: str, src_content: str | bytes, dst_filename: str) -> None:
        ws.write_in(self.workspace(rollout_id), src_content, dst_filename)

    async def copy_from_workspace(self, rollout_id: str, src_filename: str, dst_path: Path) -> None:
        ws.copy_out(self.workspace(rollout_id), src_filename, dst_path)

    # -- internals ---------------------------------------------------------------------------
    def _get(self, rollout_id: str) -> _Rollout:
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            raise RolloutNotFound(f"rollout {rollout_id!r} is not held by this worker")
        return rollout

    def _specs(self, rollout: _Rollout) -> list[ToolSpec]:
        specs = []
        for public, (session, server_tool) in rollout.routes.items():
            spec = next(s for s in session.tool_specs() if s.name == server_tool)
            specs.append(spec.model_copy(update={"name": public}))
        return specs


def _route(sessions: Sequence[McpSession]) -> dict[str, tuple[McpSession, str]]:
    counts: dict[str, int] = {}
    for session in sessions:
        for tool in session.tools:
            counts[tool.name] = counts.get(tool.name, 0) + 1
    routes: dict[str, tuple[McpSession, str]] = {}
    for session in sessions:
        for tool in session.tools:
            public = tool.name if counts[tool.name] == 1 else f"{session.name}__{tool.name}"
            routes[public] = (session, tool.name)
    return routes


def _safe_dir_name(rollout_id: str) -> str:
    # Readable and collision-free: a cleaned prefix plus a digest of the exact id.
    cleaned = "".join(c if c.isalnum() or c in "-_" else "_" for c in rollout_id)[:120]
    return f"{cleaned}-{hashlib.sha256(rollout_id.encode()).hexdigest()[:10]}"
