"""The reference trainer learns: `gymflow train launch envs/examples/train_math.yaml --wait`, as
docs/guides/training.md runs it, against the session's dev server. The final checkpoint beats the starting
policy on >= 100 eval tasks with P(improvement) >= 0.95. GYMFLOW_TRAIN_PLOT=PATH also plots it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

import figures
import pytest
from mcp_support import ROOT

from bench.training_curve import figures as curve
from bench.training_curve import plot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # ~15 min on a loaded 2-core box


async def test_the_reference_trainer_beats_its_starting_policy(temporal_address: str, tmp_path: Path) -> None:
    run_id = f"math-reference-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "GYMFLOW_TEMPORAL_ADDRESS": temporal_address, "GYMFLOW_DATA_DIR": str(tmp_path / "data"),
           "GYMFLOW_TASK_QUEUE": f"train-{run_id}", "GYMFLOW_WORKSPACE_ROOT": str(tmp_path / "ws")}  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gymflow.workers.cli", "train", "launch", "envs/examples/train_math.yaml",
        "--wait", "--json",
        "--run-id", run_id, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()[-3000:]
    try:
        result = json.loads(stdout)
    except ValueError:
        pytest.fail(f"not JSON on stdout: {stdout[:2000]!r}\nstderr: {stderr.decode()[-3000:]}")
    assert result["status"] == "completed", result
    final = result["checkpoints"][-1]["eval"]
    assert final["n_tasks"] >= 100 and final["infra_failed"] == 0, final
    assert final["mean"] > final["baseline_mean"] and final["probability_of_improvement"] >= 0.95, final
    manifest = json.loads(Path(result["manifest_uri"].removeprefix("file://")).read_text())
    data = curve(manifest)
    keys = ("mean", "mean_low", "mean_high", "baseline_mean", "probability_of_improvement", "poi_low", "poi_high")
    figures.record("training", "reference trainer, math", steps=len(data["reward_per_step"]),
                   first_reward=data["reward_per_step"][0][1], last_reward=data["reward_per_step"][-1][1],
                   n_tasks=final["n_tasks"], **{f"eval_{k}": round(final[k], 3) for k in keys})  # fmt: skip
    if out := os.environ.get("GYMFLOW_TRAIN_PLOT"):
        plot(data, Path(out))
        Path(out).with_suffix(".json").write_text(json.dumps({**data, "manifest": manifest}, indent=1))
