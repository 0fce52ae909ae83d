"""Fixtures for MCP runtime tests: envs on real server processes, shut down after each test."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp_support import COUNTER, THIRD_PARTY_PACKAGES, THIRD_PARTY_VENV, MakeEnv

from envs.mcp.env import McpEnv


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


@pytest.fixture(scope="session")
def third_party_bin() -> Path:
    """The bin/ of a venv holding third-party MCP servers from PyPI; installed here if missing."""
    bin_dir = THIRD_PARTY_VENV / "bin"
    if not (bin_dir / "mcp-server-calculator").exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", str(THIRD_PARTY_VENV)], check=True, timeout=120)
            subprocess.run(
                [str(bin_dir / "pip"), "install", "-q", *THIRD_PARTY_PACKAGES],
                check=True,
                timeout=300,
                capture_output=True,
            )
        except (subprocess.SubprocessError, OSError) as exc:
            pytest.skip(f"cannot install {THIRD_PARTY_PACKAGES} from PyPI into {THIRD_PARTY_VENV}: {exc}")
    return bin_dir
