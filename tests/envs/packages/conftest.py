"""Every test here sees the test env packages (`.env-packages/`, built by tests/env_packages.py),
and runs bridges cold (no warm pool: fewer processes on a small machine)."""

from __future__ import annotations

from pathlib import Path

import pytest
from env_packages import PACKAGES_ROOT


@pytest.fixture(autouse=True)
def env_packages_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("GYMFLOW_ENV_PACKAGES_DIR", str(PACKAGES_ROOT))
    monkeypatch.setenv("GYMFLOW_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GYMFLOW_MCP_POOL_SIZE", "0")
    return PACKAGES_ROOT
