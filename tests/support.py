"""Helpers shared by tests (importable because pytest puts tests/ on sys.path)."""

from __future__ import annotations

import uuid
from pathlib import Path

from workers.config import Settings


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    """Settings for a test worker: private queue, private workspace root."""
    values: dict[str, object] = {
        "task_queue": f"test-{uuid.uuid4().hex[:10]}",
        "node_id": f"node-{uuid.uuid4().hex[:6]}",
        "workspace_root": tmp_path / "workspaces",
        "data_dir": tmp_path / "data",
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]
