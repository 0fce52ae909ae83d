"""The whole Harbor test suite through `gymflow.run_eval` (the SDK side of `gymflow eval harbor`):
the oracle scores 1.0 on every solvable task and 0.0 where its time runs out, null scores 0.0, and
the broken verifiers (crash, timeout, a reward that is no number) are flagged, never scored."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from gymflow.envs.builtin.harbor.task import load_dataset
from gymflow.workers.config import Settings
from gymflow.workers.sdk.evals import EvalOptions, run_eval

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TASKS = Path(__file__).parent / "tasks"
FLAGGED = {"verifier_crashed", "verifier_timeout", "bad_reward"}


async def test_eval_harbor_suite(temporal_address: str, tmp_path: Path, base_image: str) -> None:
    del base_image
    settings = Settings(
        temporal_address=temporal_address, task_queue=f"harbor-{uuid.uuid4().hex[:8]}", data_dir=tmp_path / "data"
    )
    options = EvalOptions(env="harbor", policy="oracle", baseline="null", dataset=str(TASKS), reps=200)
    summary = await run_eval(options, settings)
    expect = {task.name: task.config.metadata["expect"] for task in load_dataset(TASKS)}
    assert len(expect) >= 10
    rows = {row["task_id"]: row for row in summary["per_task"]}
    for name, kind in expect.items():
        row = rows[name]
        if kind in FLAGGED:
            assert row["infra_failed"] == 1 and row["completed"] == 0, row
        else:
            assert row["mean"] == (1.0 if kind == "solvable" else 0.0), row
    flagged = sum(kind in FLAGGED for kind in expect.values())
    assert summary["policy"]["infra_failed_by_reason"] == {"reward_error": flagged}
    assert summary["baseline"]["mean"]["value"] == 0.0
    assert summary["baseline"]["infra_failed"] == flagged
