"""`gymflow eval` end to end: two batches (policy and baseline), progress bar, report files."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path


def test_eval_policy_against_baseline(temporal_address: str, tmp_path: Path) -> None:
    out_dir = tmp_path / "report"
    command = [
        sys.executable, "-m", "workers.cli", "eval", "math", "--policy", "calculator", "--baseline", "null",
        "--n", "4", "--samples", "2", "--reps", "300", "--out", str(out_dir), "--json",
        "--address", temporal_address, "--task-queue", f"eval-{uuid.uuid4().hex[:8]}",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert "16/16 rollouts" in run.stderr  # the progress bar
    assert summary["out_dir"] == str(out_dir)
    report = json.loads((out_dir / "report.json").read_text())
    assert report["policy"]["completed"] == 8 and report["policy"]["infra_failed"] == 0
    assert report["policy"]["mean"]["value"] == 1.0 and report["baseline"]["mean"]["value"] == 0.0
    assert report["comparison"]["difference"]["value"] == 1.0  # calculator solves all, null none
    assert report["pass_k"][0]["k"] == 1 and report["pass_k"][0]["pass_at_k"] == 1.0
    assert (out_dir / "report.md").read_text().startswith("#")
    assert {p.name for p in out_dir.glob("*.png")} >= {"rewards.png", "per_task.png", "comparison.png"}
