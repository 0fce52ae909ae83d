"""The reference trainer with `algorithm.extra.filter_zero_variance`: every step trains on groups with signal
and reports what it dropped as step scalars.

The trainer runs in this process against the session's dev server and a test worker: its own
softmax policy behind its own HTTP endpoint plays the in-process math env. Only the run workflow it
reports to is replaced (by a recorder of the reports: the run's own tests cover that boundary).
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import pytest
from mcp_support import eventually
from pydantic import ValidationError
from temporalio.client import Client

from gymflow.activities.training_schema import RunConfig, StepReport, TrainerSpec
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.contract import Trajectory
from gymflow.envs.datagen.format import to_jsonl
from gymflow.workers.sdk.trainer import TrainerSession
from gymflow.workers.trainers.reference import ReferenceSettings, train
from gymflow.workers.worker import RunningWorker


class RunRecorder:
    """Stands for the run workflow's handle: keeps the step reports, answers `finish` with no evaluations."""

    def __init__(self) -> None:
        self.steps: list[StepReport] = []

    async def execute_update(self, update: Any, arg: Any, *, id: str) -> Any:
        if isinstance(arg, StepReport):
            self.steps.append(arg)
            return {}
        return []


async def test_the_reference_trainer_trains_only_on_groups_with_signal(
    client: Client, worker: RunningWorker, tmp_path: Path
) -> None:
    train_split = tmp_path / "train.jsonl"
    train_split.write_bytes(to_jsonl(generate_tasks(16, seed=5, difficulty=1)))
    config = RunConfig.model_validate({
        "env": "math-inproc", "baseline": {"policy": "softmax"}, "limits": {"max_turns": 3},
        "model": {"seed": 3},  # sample i of every group samples with seed 3 + i: the same run every time
        "algorithm": {"steps": 2, "group_size": 2, "tasks_per_step": 2, "checkpoint_every": 100,
                      "extra": {"filter_zero_variance": True, "max_replacements": 4}},
    })  # fmt: skip
    spec = TrainerSpec(
        run_id=f"filter-{uuid.uuid4().hex[:6]}", env="math-inproc", config=config, train_uri=f"file://{train_split}",
        eval_uri="unused", bundle_uri="unused", requirements_uri="unused", bundle_digest="", dataset_digest="",
        storage=f"file://{tmp_path}", checkpoints=f"file://{tmp_path}/checkpoints", task_queue=worker.task_queue,
    )  # fmt: skip
    session = TrainerSession(client, spec)
    session.handle = recorder = RunRecorder()  # type: ignore[assignment]
    out = io.StringIO()
    assert await train(session, out=out) == 0

    assert [r.step for r in recorder.steps] == [0, 1, 2]
    assert "groups/yielded" not in recorder.steps[0].scalars  # step 0 only reports the starting policy
    for report in recorder.steps[1:]:
        s = report.scalars
        dropped = s["groups/dropped_solved"] + s["groups/dropped_failed"] + s["groups/dropped_equal"]
        assert s["groups/yielded"] + s["groups/short"] == 2
        assert s["groups/started"] == s["groups/yielded"] + dropped + s["groups/dropped_infra_failed"] <= 2 + 4
        assert s["groups/replacement_limit_reached"] == float(s["groups/short"] > 0)
        # Groups of two with signal have one solved and one failed sample: the step's reward is 1/2.
        assert s["rollouts"] == 2 * s["groups/yielded"] - s["infra_failed"]
        if s["groups/yielded"] and not s["infra_failed"]:
            assert s["reward"] == 0.5, s
    # With these seeds: step 1 found one group with signal among the six it may start (two wanted, four
    # replacements) and says it is short; step 2, its policy already better, found two among three.
    counts = [{k: s[f"groups/{k}"] for k in ("yielded", "dropped_failed", "short", "started")}
              for s in (r.scalars for r in recorder.steps[1:])]  # fmt: skip
    assert counts == [
        {"yielded": 1, "dropped_failed": 5, "short": 1, "started": 6},
        {"yielded": 2, "dropped_failed": 1, "short": 0, "started": 3},
    ]
    assert recorder.steps[2].scalars["p_right_tool"] > recorder.steps[1].scalars["p_right_tool"] > 0.2
    assert "replacement limit reached" in out.getvalue()
    assert (tmp_path / "checkpoints" / "step-000002.json").exists()
    assert "training done" in out.getvalue()


def test_a_misspelt_reference_setting_is_an_error_naming_it() -> None:
    with pytest.raises(ValidationError, match="filter_zero_varience"):
        ReferenceSettings.model_validate({"filter_zero_varience": True})
    with pytest.raises(ValidationError, match="max_replacements"):
        ReferenceSettings.model_validate({"filter_zero_variance": True, "max_replacements": -1})


async def test_the_reference_trainer_trains_asynchronously_within_its_staleness_bound(
    client: Client, worker: RunningWorker, tmp_path: Path
) -> None:
    """Groups of two steps in flight, each new policy announced to the rollouts still running: every
    step trains on groups at most `max_staleness` versions old, and rollouts moved to newer versions."""
    train_split = tmp_path / "train.jsonl"
    train_split.write_bytes(to_jsonl(generate_tasks(16, seed=7, difficulty=2)))
    config = RunConfig.model_validate({
        "env": "math-inproc", "baseline": {"policy": "softmax"}, "limits": {"max_turns": 4},
        "algorithm": {"steps": 4, "group_size": 2, "tasks_per_step": 2, "checkpoint_every": 100, "lr": 5.0,
                      "extra": {"asynchronous": True, "max_staleness": 1, "in_flight_steps": 2}},
    })  # fmt: skip
    spec = TrainerSpec(
        run_id=f"async-{uuid.uuid4().hex[:6]}", env="math-inproc", config=config, train_uri=f"file://{train_split}",
        eval_uri="unused", bundle_uri="unused", requirements_uri="unused", bundle_digest="", dataset_digest="",
        storage=f"file://{tmp_path}", checkpoints=f"file://{tmp_path}/checkpoints", task_queue=worker.task_queue,
    )  # fmt: skip
    session = TrainerSession(client, spec)
    session.handle = recorder = RunRecorder()  # type: ignore[assignment]
    assert await train(session, out=io.StringIO()) == 0
    assert [r.step for r in recorder.steps] == [0, 1, 2, 3, 4]
    for report in recorder.steps[1:]:
        s = report.scalars
        assert s["lag_max"] <= 1 and s["rollouts"] + s["infra_failed"] == 4, s  # two groups of two
        assert sum(v for k, v in s.items() if k.startswith("lag_") and k[4:].isdigit()) == 2
    # Every rollout recorded the policy version of each of its turns, never going back.
    query = f'TaskQueue="{worker.task_queue}" AND WorkflowType="RolloutWorkflow" AND ExecutionStatus="Completed"'

    async def completed() -> list[str]:
        return [e.id async for e in client.list_workflows(query)]

    ids = await eventually(completed, lambda found: len(found) >= 8)  # visibility is eventually consistent
    played = [await client.get_workflow_handle(i, result_type=Trajectory).result() for i in ids]
    assert all(t.versions == sorted(t.versions) and len(t.versions) == t.turns for t in played)
    assert max(v for t in played for v in t.versions if v is not None) >= 1
