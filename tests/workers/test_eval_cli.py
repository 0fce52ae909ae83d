"""`gymflow eval` end to end: two batches (policy and baseline), progress bar, report files."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest


@pytest.mark.heavy
def test_eval_policy_against_baseline(temporal_address: str, tmp_path: Path) -> None:
    out_dir = tmp_path / "report"
    command = [
        sys.executable, "-m", "gymflow.workers.cli", "eval", "math", "--policy", "calculator", "--baseline", "null",
        "--n", "4", "--samples", "2", "--reps", "300", "--out", str(out_dir), "--json",
        "--address", temporal_address, "--task-queue", f"eval-{uuid.uuid4().hex[:8]}",
    ]  # fmt: skip
    # Bytes, not text: text mode's universal newlines would turn a progress bar's "\r" into "\n".
    run = subprocess.run(command, capture_output=True, timeout=600, cwd=tmp_path, check=False)
    stderr = run.stderr.decode()
    assert run.returncode == 0, stderr[-3000:]
    summary = json.loads(run.stdout)
    assert "progress: 16/16 rollouts" in stderr.splitlines()  # progress, as plain lines off a terminal
    assert b"\r" not in run.stderr  # no bar redrawn into a log file
    assert summary["out_dir"] == str(out_dir)
    report = json.loads((out_dir / "report.json").read_text())
    assert report["policy"]["completed"] == 8 and report["policy"]["infra_failed"] == 0
    assert report["policy"]["mean"]["value"] == 1.0 and report["baseline"]["mean"]["value"] == 0.0
    assert report["comparison"]["difference"]["value"] == 1.0  # calculator solves all, null none
    assert report["pass_k"][0]["k"] == 1 and report["pass_k"][0]["pass_at_k"] == 1.0
    # What was compared, named: labels, models (no longer "default" on both sides), batches and links.
    assert (report["policy"]["label"], report["baseline"]["label"]) == ("calculator", "null")
    assert report["policy"]["models"] == ["calculator"] and report["baseline"]["models"] == ["null"]
    batches = {b["role"]: b for b in report["batches"]}
    assert batches["policy"]["batch_id"] == summary["batches"][0]["batch_id"]
    assert "GymflowBatch%3D%22eval-math-policy-" in batches["policy"]["ui"]
    for batch in batches.values():  # each batch wrote its own report when it ended
        assert batch["report"].startswith("file://") and batch["report"].endswith(f"{batch['batch_id']}/report.html")
        assert Path(batch["report"].removeprefix("file://")).read_text().startswith("<!DOCTYPE html>")
    page = (out_dir / "report.html").read_text()
    assert "<title>math: calculator vs null</title>" in page and batches["baseline"]["batch_id"] in page
    assert sorted(p.name for p in out_dir.iterdir()) == ["report.html", "report.json"]
