"""workers.report: the files' numbers are envs.stats' numbers; infra failures are counted, never 0."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from envs import stats
from envs.contract import Reward, TerminationReason, Trajectory
from workers.report import summarize, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _traj(rollout_id: str, task_id: str, reward: float | None, reason: TerminationReason) -> Trajectory:
    return Trajectory(
        rollout_id=rollout_id,
        task_id=task_id,
        env="math",
        model="policy-7b",
        messages=[],
        reward=None if reward is None else Reward(total=reward),
        termination=reason,
        infra_failed=reason.infra_failed,
        error="boom" if reason.infra_failed else None,
    )


def _batch(seed: int, p: float) -> list[Trajectory]:
    """5 tasks x 4 rollouts with rewards in {0, 0.5, 1}, plus infra failures on three tasks."""
    rng = np.random.default_rng(seed)
    out = [
        _traj(
            f"{seed}-{t}-{r}",
            f"t{t}",
            float(rng.choice([0.0, 0.5, 1.0], p=[1 - p, 0.2, p - 0.2])),
            TerminationReason.FINAL_ANSWER,
        )
        for t in range(5)
        for r in range(4)
    ]
    out[0] = _traj(f"{seed}-t0-0", "t0", None, TerminationReason.MODEL_ERROR)  # t0: 3 scored, 2 failed
    out.append(_traj(f"{seed}-t0-x", "t0", None, TerminationReason.ENV_ERROR))
    out[9] = _traj(f"{seed}-t2-1", "t2", None, TerminationReason.NODE_LOST)  # t2: 3 scored
    out += [_traj(f"{seed}-dead-{r}", "dead", None, TerminationReason.MODEL_ERROR) for r in range(2)]  # no score
    return out


def _scored(trajectories: list[Trajectory]) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for t in trajectories:
        if not t.infra_failed:
            assert t.reward is not None
            groups.setdefault(t.task_id, []).append(t.reward.total)
    return groups


def _asdict(x: Any) -> Any:
    return json.loads(json.dumps(dataclasses.asdict(x)))


@pytest.fixture(scope="module")
def batches() -> tuple[list[Trajectory], list[Trajectory]]:
    return _batch(1, 0.7), _batch(2, 0.5)


def test_report_numbers_are_envs_stats(tmp_path: Path, batches: tuple[list[Trajectory], list[Trajectory]]) -> None:
    policy, baseline = batches
    report = write_report(policy, tmp_path, baseline=baseline, seed=3, reps=500)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data == json.loads(report.model_dump_json())
    boot = stats.Bootstrap(reps=500, seed=3)
    groups = _scored(policy)
    scores = list(groups.values())

    assert data["policy"]["mean"] == _asdict(stats.aggregate_ci(scores, statistic="mean", ragged=True, boot=boot))
    assert data["policy"]["iqm"] == _asdict(stats.aggregate_ci(scores, statistic="iqm", ragged=True, boot=boot))
    ids = [t for t, v in groups.items() for _ in v]
    expected_tasks = {r.task_id: r for r in stats.per_task(ids, [x for v in scores for x in v], boot=boot)}
    for row in data["per_task"]:
        if row["task_id"] == "dead":
            continue
        ref = expected_tasks[row["task_id"]]
        assert (row["completed"], row["mean"], row["low"], row["high"]) == (ref.n, ref.mean, ref.low, ref.high)
        assert row["correct"] == sum(x >= 1.0 for x in groups[row["task_id"]])
    n = [len(v) for v in scores]
    c = [sum(x >= 1.0 for x in v) for v in scores]
    assert data["pass_k"] == [_asdict(p) for p in stats.pass_k_table(n, c)]
    assert [p["k"] for p in data["pass_k"]] == [1, 2, 3]  # the fewest scored rollouts of a task is 3

    base = _scored(baseline)
    common = [t for t in groups if t in base]
    comparison = stats.compare([groups[t] for t in common], [base[t] for t in common], ragged=True, boot=boot)
    assert data["comparison"]["difference"] == _asdict(comparison.difference)
    assert data["comparison"]["probability_of_improvement"] == _asdict(comparison.probability_of_improvement)
    assert data["comparison"]["tasks"] == 5
    assert data["baseline"]["mean"]["value"] == pytest.approx(np.mean([np.mean(base[t]) for t in base]))
    assert data["method"] | {"notes": None} == {
        "reps": 500,
        "confidence": 0.95,
        "seed": 3,
        "success_threshold": 1.0,
        "notes": None,
    }

    markdown = (tmp_path / "report.md").read_text()
    assert "500 replicates, 95% confidence, seed 3" in markdown
    assert f"| mean reward | {data['policy']['mean']['value']:.3f} |" in markdown
    assert "| IQM |" in markdown and "| 3 |" in markdown and "P(policy > baseline)" in markdown
    # Same inputs and seed: byte-identical numbers.
    write_report(policy, tmp_path / "again", baseline=baseline, seed=3, reps=500, plots=False)
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert again | {"files": None} == data | {"files": None}


def test_infra_failures_are_excluded_and_counted(
    tmp_path: Path, batches: tuple[list[Trajectory], list[Trajectory]]
) -> None:
    policy, _ = batches
    report = write_report(policy, tmp_path, reps=200, plots=False)
    side = report.policy
    assert (side.rollouts, side.completed, side.infra_failed, side.tasks) == (23, 18, 5, 5)
    assert side.infra_failed_by_reason == {"env_error": 1, "model_error": 3, "node_lost": 1}
    rows = {r.task_id: r for r in report.per_task}
    assert (rows["t0"].rollouts, rows["t0"].completed, rows["t0"].infra_failed) == (5, 3, 2)
    assert (rows["dead"].completed, rows["dead"].infra_failed, rows["dead"].mean, rows["dead"].low) == (
        0,
        2,
        None,
        None,
    )
    t0 = [t.reward.total for t in policy if t.task_id == "t0" and t.reward is not None]
    assert rows["t0"].mean == pytest.approx(sum(t0) / 3)  # not sum / 5: failures are not zeros
    all_scored = [t.reward.total for t in policy if t.reward is not None]
    assert side.mean is not None
    assert side.mean.value > sum(all_scored) / len(policy)
    markdown = (tmp_path / "report.md").read_text()
    assert "5 infra-failed (excluded, not scored 0; env_error: 1, model_error: 3, node_lost: 1)" in markdown
    assert "| dead | 2 | 0 | 2 | 0 | - | - |" in markdown


def test_plots_are_valid_pngs(tmp_path: Path, batches: tuple[list[Trajectory], list[Trajectory]]) -> None:
    policy, baseline = batches
    report = write_report(policy, tmp_path, baseline=baseline, reps=200)
    pngs = ["rewards.png", "per_task.png", "aggregates.png", "comparison.png"]
    assert report.files == ["report.json", "report.md", *pngs]
    for name in pngs:
        path = tmp_path / name
        assert path.read_bytes()[:8] == PNG_MAGIC
        with Image.open(path) as image:
            image.verify()
            assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 100
    assert "![comparison.png](comparison.png)" in (tmp_path / "report.md").read_text()
    alone = write_report(policy, tmp_path / "alone", reps=200)
    assert alone.files == ["report.json", "report.md", *pngs[:3]] and alone.comparison is None


def test_works_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batches: Any) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    report = write_report(batches[0], tmp_path, reps=100, plots=False)
    assert report.files == ["report.json", "report.md"]
    with pytest.raises(ImportError, match=r"gymflow\[report\]"):
        write_report(batches[0], tmp_path, reps=100)


def test_edge_cases(tmp_path: Path) -> None:
    failed = [_traj(f"r{i}", "t", None, TerminationReason.MODEL_ERROR) for i in range(3)]
    report = write_report(failed, tmp_path, reps=100)
    assert (report.policy.completed, report.policy.infra_failed, report.policy.mean, report.pass_k) == (0, 3, None, [])
    assert report.files == ["report.json", "report.md"]
    with pytest.raises(ValueError, match="no trajectories"):
        summarize([])
    unscored = _traj("r9", "t", 1.0, TerminationReason.FINAL_ANSWER).model_copy(update={"reward": None})
    with pytest.raises(ValueError, match="r9 ended final_answer without a reward"):
        summarize([unscored])
    other = [_traj(f"b{i}", "u", 1.0, TerminationReason.FINAL_ANSWER) for i in range(2)]
    mine = [_traj(f"p{i}", "t", 0.0, TerminationReason.FINAL_ANSWER) for i in range(2)]
    report = summarize(mine, baseline=other)
    assert report.comparison is None and any("no comparison" in note for note in report.method.notes)
