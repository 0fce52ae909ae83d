"""MCP server configuration, in the `mcpServers` format Claude Desktop and benchmax use.

    {"mcpServers": {"calculator": {"command": "python", "args": ["-m", "calc"]}}}

plus gymflow's per-server runtime policy (allowed tools, timeouts, output parsers, media caps).
A server is reached one of three ways:

* `command` alone: a stdio server process per rollout;
* `url` alone: a fixed streamable-HTTP server shared by every rollout (its isolation is its own);
* `command` and `url`: a streamable-HTTP server process per rollout, started with a free port
  substituted for `{port}` in its args, env and url; the url must be a loopback one, so the
  per-rollout server is never reachable from outside the node.

`{workspace}` in args and env becomes the rollout's workspace directory (for servers that want an
absolute path, say a database file); for a server inside a container, the workspace's path there.
`{sandbox}` becomes the name of the rollout's sandbox (its container), for a server on the worker
that acts on it (gymflow.envs.runtime.terminal). Where a server runs is its `runtime`, else its
env's (gymflow.envs.runtime.config).
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator

from gymflow.envs.contract import Wire
from gymflow.envs.runtime.config import RuntimeConfig

PORT = "{port}"
"""Placeholder for the free port of a per-rollout HTTP server."""
WORKSPACE = "{workspace}"
"""Placeholder for the rollout's workspace directory."""
SANDBOX = "{sandbox}"
"""Placeholder for the name of the rollout's sandbox (its container)."""
TOKEN = "{token}"
"""Placeholder for the bearer token of a per-rollout HTTP server (with `bearer_token: true`)."""
TOKEN_ENV = "GYMFLOW_MCP_TOKEN"
"""Environment variable that hands a per-rollout HTTP server its bearer token."""
BUILTIN_PARSERS = ("json", "text")
MAX_INLINE_MEDIA_BYTES = 256 * 1024
"""Default cap on the base64-decoded bytes of images/audio kept inline in one tool result."""


class McpServerConfig(Wire):
    """One MCP server: how to start (or reach) it and what the model may do with it."""

    command: str | None = None
    """Executable for the server process. `python` means this interpreter (sys.executable)."""
    args: list[str] = Field(default_factory=list)
    """Arguments of the command; `{port}` and `{workspace}` are substituted."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server process (placeholders substituted)."""
    cwd: str | None = None
    """Working directory (`{workspace}` substituted); default is the rollout's workspace, so
    relative paths stay inside it."""
    url: str | None = None
    """Streamable-HTTP endpoint: a fixed server, or with `command` a per-rollout one (`{port}`)."""
    allowed_tools: list[str] | None = None
    """If set, only these tools are listed and callable (enforced at call time too)."""
    tool_timeout_s: float = Field(default=60.0, gt=0)
    """Default time limit of one tool call."""
    tool_timeouts: dict[str, float] = Field(default_factory=dict)
    """Per-tool overrides of `tool_timeout_s`."""
    startup_timeout_s: float = Field(default=30.0, gt=0)
    """How long the server may take to start and answer the handshake."""
    parsers: dict[str, str] = Field(default_factory=dict)
    """Per-tool output parser: `json` (text parsed into `structured`), `text` (text only), or
    `module:function` / `file.py:function` (see gymflow.envs.mcp.content.Parser)."""
    bearer_token: bool = False
    """For a per-rollout HTTP server that checks one: a fresh random token per server process, given
    to it in the environment (`GYMFLOW_MCP_TOKEN`, or `{token}` in `env`/`args`) and sent by the
    client as `Authorization: Bearer`, so other local processes cannot call the rollout's tools."""
    runtime: RuntimeConfig | None = None
    """Where this server runs: None, in the env's runtime (the rollout's sandbox); `{kind: process}`
    on the worker; another config, in a sandbox of its own (gymflow.envs.runtime.config)."""
    fork: bool = True
    """Fork each rollout's server from the node's fork server for this program, which has imported
    its modules once, when it is a Python server (`python -m MODULE`, `python /abs/server.py`) on the
    worker (gymflow.envs.runtime.forkserver); `false` starts every one plainly."""
    preload: list[str] = Field(default_factory=list)
    """Modules its fork server imports once, besides those the server's source imports at top level:
    what the server imports later, at run time (an env package's own module, say)."""
    max_inline_media_bytes: int = Field(default=MAX_INLINE_MEDIA_BYTES, ge=0)
    """Images/audio/blobs of one result up to this many bytes stay inline (base64); larger ones
    are saved as workspace files (see gymflow.envs.contract.ToolAttachment)."""

    @field_validator("parsers")
    @classmethod
    def _parser_specs(cls, value: dict[str, str]) -> dict[str, str]:
        for tool, spec in value.items():
            if spec not in BUILTIN_PARSERS and not _is_callable_spec(spec):
                raise ValueError(f"parser of tool {tool!r} must be 'json', 'text' or 'module:function', got {spec!r}")
        return value

    @model_validator(mode="after")
    def _command_or_url(self) -> McpServerConfig:
        if self.command is None and self.url is None:
            raise ValueError("an MCP server needs 'command' (stdio), 'url' (streamable HTTP), or both")
        if self.url is not None:
            if not self.url.replace(PORT, "0").startswith(("http://", "https://")):
                raise ValueError(f"'url' must be an http(s) URL, got {self.url!r}")
            if self.command is not None:
                if PORT not in self.url:
                    raise ValueError(f"'url' of a server started from 'command' must contain {PORT!r}")
                if not _is_loopback(self.url.replace(PORT, "0")):
                    raise ValueError(f"'url' of a per-rollout server must be on 127.0.0.1, got {self.url!r}")
            elif PORT in self.url:
                raise ValueError(f"'url' has {PORT!r} but there is no 'command' to start a server on it")
        if self.runtime is not None and self.runtime.isolated and self.url is not None:
            raise ValueError("a server in a sandbox talks stdio: give it 'command', not 'url'")
        if self.bearer_token and not self.per_rollout_http:
            raise ValueError("'bearer_token' needs a per-rollout HTTP server ('command' and a '{port}' 'url')")
        return self

    @property
    def per_rollout_http(self) -> bool:
        """Whether each rollout starts its own streamable-HTTP server process."""
        return self.command is not None and self.url is not None

    def executable(self) -> str:
        """The command to run, with `python` resolved to the running interpreter."""
        if self.command is None:
            raise ValueError("not a server process")
        return sys.executable if self.command in {"python", "python3"} else self.command

    def render(
        self, *, workspace: str, port: int | None = None, token: str | None = None, sandbox: str | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """Args and env with the placeholders filled in (and the token in `GYMFLOW_MCP_TOKEN`)."""

        def fill(text: str) -> str:
            text = text.replace(WORKSPACE, workspace)
            if sandbox is not None:
                text = text.replace(SANDBOX, sandbox)
            if token is not None:
                text = text.replace(TOKEN, token)
            return text.replace(PORT, str(port)) if port is not None else text

        env = {k: fill(v) for k, v in self.env.items()}
        return [fill(a) for a in self.args], env | ({TOKEN_ENV: token} if token is not None else {})

    def working_dir(self, workspace: Path) -> Path:
        """Where the server process runs: `cwd` with `{workspace}` filled in, else the workspace."""
        return Path(self.cwd.replace(WORKSPACE, str(workspace))) if self.cwd else workspace

    def timeout_for(self, tool: str) -> float:
        """Time limit for one call of `tool`."""
        return self.tool_timeouts.get(tool, self.tool_timeout_s)


def parse_servers(config: Mapping[str, Any]) -> dict[str, McpServerConfig]:
    """Parse `{"mcpServers": {...}}` (or the inner mapping) into validated server configs.

    Raises:
        ValueError: naming the server and field at fault (`mcpServers.calc.url: ...`).
    """
    servers = config.get("mcpServers", config)
    if not isinstance(servers, Mapping) or not servers:
        raise ValueError("MCP config must map server names to server configs (an 'mcpServers' mapping)")
    parsed: dict[str, McpServerConfig] = {}
    for name, value in servers.items():
        try:
            parsed[str(name)] = McpServerConfig.model_validate(value)
        except ValidationError as exc:
            problems = "; ".join(
                f"mcpServers.{name}{''.join(f'.{p}' for p in err['loc'])}: {err['msg']}" for err in exc.errors()
            )
            raise ValueError(problems) from None
    return parsed


def _is_callable_spec(spec: str) -> bool:
    target, sep, attr = spec.rpartition(":")
    return bool(sep and target and attr.isidentifier())


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
