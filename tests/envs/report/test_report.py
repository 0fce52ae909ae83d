"""envs.eval.report and its files: the numbers are envs.eval.stats' numbers, infra failures are counted (never 0),
and the HTML page names what was compared, links it, and plots both sides on sensible axes."""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gymflow.envs.contract import Reward, TerminationReason, Trajectory
from gymflow.envs.eval import stats
from gymflow.envs.eval.report import BatchRef
from gymflow.envs.eval.svg import axis_range, nice_ticks
from gymflow.workers.sdk.report import summarize, write_report


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

    page = (tmp_path / "report.html").read_text()
    assert "500 replicates, 95% confidence, seed 3" in page
    mean = data["policy"]["mean"]
    assert f"{mean['value']:.3f} [{mean['low']:.3f}, {mean['high']:.3f}]" in page
    assert "IQM" in page and "P(policy &gt; baseline)" in page
    # Same inputs and seed: byte-identical files.
    write_report(policy, tmp_path / "again", baseline=baseline, seed=3, reps=500)
    assert (tmp_path / "again" / "report.json").read_text() == (tmp_path / "report.json").read_text()
    assert (tmp_path / "again" / "report.html").read_text() == page


def test_infra_failures_are_excluded_and_counted(
    tmp_path: Path, batches: tuple[list[Trajectory], list[Trajectory]]
) -> None:
    policy, _ = batches
    report = write_report(policy, tmp_path, reps=200)
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
    page = (tmp_path / "report.html").read_text()
    assert "5 (env_error: 1, model_error: 3, node_lost: 1)" in page
    cells = '<td class="num">2</td><td class="num">0</td><td class="num">2</td><td class="num">0</td>'
    assert f"<td>dead</td>{cells}" in page


def _svgs(page: str) -> list[ET.Element]:
    return [ET.fromstring(m) for m in re.findall(r"<svg .*?</svg>", page, re.DOTALL)]


def test_page_is_self_contained_names_both_sides_and_links(
    tmp_path: Path, batches: tuple[list[Trajectory], list[Trajectory]]
) -> None:
    policy, baseline = batches
    ui = "http://localhost:8999/namespaces/default"
    refs = [
        BatchRef(
            role="policy", batch_id="eval-1", label="calculator", ui=f"{ui}/workflows/eval-1", report="file:///r.html"
        ),
        BatchRef(role="baseline", batch_id="eval-2", label="null", ui=f"{ui}/workflows/eval-2"),
    ]
    write_report(policy, tmp_path, baseline=baseline, reps=100, labels=("calculator", "null"), batches=refs, ui_base=ui)
    page = (tmp_path / "report.html").read_text()
    assert "<script" not in page and "<img" not in page and "<link" not in page  # nothing to fetch
    assert "<title>math: calculator vs null</title>" in page
    assert 'href="http://localhost:8999/namespaces/default/workflows/eval-1"' in page and "eval-2" in page
    assert 'href="file:///r.html"' in page  # the policy batch's own report
    assert "model policy-7b" in page
    query = "GymflowBatch%3D%22eval-1%22%20AND%20GymflowTask%3D%22t1%22"
    assert f'href="{ui}/workflows?query={query}"' in page
    figures = _svgs(page)
    assert len(figures) == 6  # distribution, aggregates, per task, difference, P(improvement), scatter
    ns = "{http://www.w3.org/2000/svg}"
    by_title = {f.findtext(f"{ns}title", ""): f for f in figures}
    for title, figure in by_title.items():  # both sides on every plot that compares them
        if title.startswith(("Reward distribution", "Aggregate", "Per-task mean reward (95%")):
            colors = {e.get("fill") for e in figure.iter() if e.tag in {f"{ns}rect", f"{ns}circle"}}
            assert {"#2563eb", "#ea580c"} <= colors, title
    scatter = next(f for t, f in by_title.items() if t.startswith("Per-task mean reward (5 tasks)"))
    labels = {t.text for t in scatter.iter(f"{ns}text")}
    assert {"null (baseline)", "calculator (policy)"} <= labels
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["policy"]["label"] == "calculator" and data["baseline"]["label"] == "null"
    assert data["batches"][0]["batch_id"] == "eval-1" and data["ui_base"] == ui


def test_axes_are_sensible() -> None:
    assert axis_range([1.0, 1.0, 1.0]) == (0.0, 1.0)  # never 0.96-1.04
    assert axis_range([0.0]) == (0.0, 1.0)
    assert axis_range([]) == (0.0, 1.0)
    lo, hi = axis_range([0.5, 3.0])
    assert lo <= 0.0 and hi >= 3.0
    assert axis_range([5.0], unit=None) == (4.5, 5.5)
    assert axis_range([-0.2, 0.4], unit=(-1.0, 1.0)) == (-1.0, 1.0)
    assert nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]


def test_all_ones_gets_a_unit_axis(tmp_path: Path) -> None:
    ones = [_traj(f"r{i}", f"t{i}", 1.0, TerminationReason.FINAL_ANSWER) for i in range(5)]
    write_report(ones, tmp_path, reps=50)
    page = (tmp_path / "report.html").read_text()
    for figure in _svgs(page):
        ticks = [t.text for t in figure.iter("{http://www.w3.org/2000/svg}text") if t.get("text-anchor") == "middle"]
        numbers = [float(t) for t in ticks if t and re.fullmatch(r"-?[0-9.]+", t)]
        assert min(numbers) == 0.0 and max(numbers) == 1.0, ticks


def test_edge_cases(tmp_path: Path) -> None:
    failed = [_traj(f"r{i}", "t", None, TerminationReason.MODEL_ERROR) for i in range(3)]
    report = write_report(failed, tmp_path, reps=100)
    assert (report.policy.completed, report.policy.infra_failed, report.policy.mean, report.pass_k) == (0, 3, None, [])
    assert "<svg" not in (tmp_path / "report.html").read_text()  # nothing scored, nothing to plot
    with pytest.raises(ValueError, match="no trajectories"):
        summarize([])
    unscored = _traj("r9", "t", 1.0, TerminationReason.FINAL_ANSWER).model_copy(update={"reward": None})
    with pytest.raises(ValueError, match="r9 ended final_answer without a reward"):
        summarize([unscored])
    other = [_traj(f"b{i}", "u", 1.0, TerminationReason.FINAL_ANSWER) for i in range(2)]
    mine = [_traj(f"p{i}", "t", 0.0, TerminationReason.FINAL_ANSWER) for i in range(2)]
    report = summarize(mine, baseline=other)
    assert report.comparison is None and any("no comparison" in note for note in report.method.notes)


def test_an_opted_out_sandbox_is_printed_in_the_report(tmp_path: Path) -> None:
    line = "GYMFLOW_SANDBOX=unsafe-unshare: model code runs at sandbox level unshare as the worker's uid"
    safe = [_traj(f"r{i}", f"t{i}", 1.0, TerminationReason.FINAL_ANSWER) for i in range(3)]
    unsafe = [t.model_copy(update={"sandbox": line}) for t in safe[:2]]
    report = write_report([*unsafe, safe[2]], tmp_path)
    assert report.sandbox == [f"{line} (2 rollout(s))"]
    assert "Unsafe sandbox:" in (tmp_path / "report.html").read_text()
    assert json.loads((tmp_path / "report.json").read_text())["sandbox"] == report.sandbox
    assert write_report(safe, tmp_path / "safe").sandbox == []
