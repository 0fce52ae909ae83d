"""Figures the reliability tests measure (rollouts lost, re-executions, recovery times, fuzz cases).

Tests call `record(section, scenario, **values)`; at the end of the session pytest prints every
figure (tests/conftest.py), and with `GYMFLOW_FIGURES=path.json` set they are also written there,
which is where the reliability table of docs/benchmarks.md comes from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RECORDS: list[dict[str, Any]] = []


def record(section: str, scenario: str, **values: Any) -> None:
    """Keep one scenario's figures (numbers, or short strings)."""
    RECORDS.append({"section": section, "scenario": scenario, **values})


def lines() -> list[str]:
    """The figures, one line per scenario."""
    out = []
    for entry in RECORDS:
        values = ", ".join(f"{k}={_fmt(v)}" for k, v in entry.items() if k not in {"section", "scenario"})
        out.append(f"[{entry['section']}] {entry['scenario']}: {values}")
    return out


def write() -> Path | None:
    """Write the figures to $GYMFLOW_FIGURES, if set (appending to what an earlier run wrote)."""
    target = os.environ.get("GYMFLOW_FIGURES")
    if not target or not RECORDS:
        return None
    path = Path(target)
    previous = json.loads(path.read_text()) if path.is_file() else []
    path.write_text(json.dumps(previous + RECORDS, indent=2))
    return path


def _fmt(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)
