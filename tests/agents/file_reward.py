"""The reward of the harness tests' file tasks (loaded by env files, in worker processes too: stdlib only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def file_written(completion: str, ground_truth: Any, workspace: Path, **kwargs: Any) -> float:
    """1.0 when every file of the task holds exactly its content."""
    del completion, kwargs
    return float(all((workspace / p).is_file() and (workspace / p).read_text() == c for p, c in ground_truth.items()))
