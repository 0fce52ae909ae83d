"""Fixtures for MCP runtime tests: envs on real server processes, shut down after each test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp_support import COUNTER, MakeEnv

from gymflow.envs.mcp.env import McpEnv


@pytest.fixture
async def make_env(tmp_path: Path) -> AsyncIterator[MakeEnv]:
    """Build McpEnvs under tmp_path (pool off unless asked); every one is shut down afterwards."""
    envs: list[McpEnv] = []

    def make(servers: dict[str, Any] | None = None, *, cls: type[McpEnv] = McpEnv, **kwargs: Any) -> McpEnv:
        kwargs.setdefault("pool_size", 0)
        kwargs.setdefault("workspace_root", tmp_path / "ws")
        env = cls(servers=servers if servers is not None else {"counter": COUNTER}, **kwargs)
        envs.append(env)
        return env

    yield make
    for env in envs:
        await env.shutdown()
