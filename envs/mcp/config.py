"""MCP server configuration, in the `mcpServers` format Claude Desktop and benchmax use.

    {"mcpServers": {"calculator": {"command": "python", "args": ["-m", "calc"]}}}

plus gymflow's per-server runtime policy (allowed tools, timeouts, output limits).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from envs.contract import Wire


class McpServerConfig(Wire):
    """One MCP server: how to start (or reach) it and what the model may do with it."""

    command: str | None = None
    """Executable for a stdio server. `python` means this interpreter (sys.executable)."""
    args: list[str] = Field(default_factory=list)
    """Arguments of the stdio command."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server process."""
    cwd: str | None = None
    """Working directory; default is the rollout's workspace, so relative paths stay inside it."""
    url: str | None = None
    """URL of a streamable-HTTP server, instead of a command."""
    allowed_tools: list[str] | None = None
    """If set, only these tools are listed and callable (enforced at call time too)."""
    tool_timeout_s: float = Field(default=60.0, gt=0)
    """Default time limit of one tool call."""
    tool_timeouts: dict[str, float] = Field(default_factory=dict)
    """Per-tool overrides of `tool_timeout_s`."""
    startup_timeout_s: float = Field(default=30.0, gt=0)
    """How long the server may take to start and answer the handshake."""

    @model_validator(mode="after")
    def _command_or_url(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs exactly one of 'command' (stdio) or 'url' (streamable HTTP)")
        return self

    def executable(self) -> str:
        """The command to run, with `python` resolved to the running interpreter."""
        if self.command is None:
            raise ValueError("not a stdio server")
        return sys.executable if self.command in {"python", "python3"} else self.command

    def timeout_for(self, tool: str) -> float:
        """Time limit for one call of `tool`."""
        return self.tool_timeouts.get(tool, self.tool_timeout_s)


def parse_servers(config: Mapping[str, Any]) -> dict[str, McpServerConfig]:
    """Parse `{"mcpServers": {...}}` (or the inner mapping) into validated server configs."""
    servers = config.get("mcpServers", config)
    if not isinstance(servers, Mapping) or not servers:
        raise ValueError("MCP config must map server names to server configs (an 'mcpServers' mapping)")
    return {str(name): McpServerConfig.model_validate(value) for name, value in servers.items()}
