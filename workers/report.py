"""Evaluation reports: `report.json`, `report.md` and PNG plots from a batch of trajectories.

`summarize` turns contract `Trajectory` objects (and optionally a baseline's) into a `Report`
with the numbers; `write_report` also writes them to a directory. Every statistic comes from
`envs.stats`, so the files say exactly what a trainer computing the same numbers would get.

Decisions:

* Infra-failed rollouts (`Trajectory.infra_failed`) are never scored: they are left out of every
  statistic and counted, per termination reason, next to the numbers. A task whose rollouts all
  failed appears in the per-task table with no mean. Tasks then have unequal numbers of scored
  rollouts, so every estimator runs in `ragged` mode (each task at its own size).
* The mean reward is the mean of per-task means (each task weighs the same, however many of its
  rollouts failed); the IQM pools all scored rollouts. Both get rliable's stratified bootstrap
  CI, conditional on the task set.
* pass@k counts a rollout as correct when its reward total >= `success_threshold` (default 1.0,
  full marks) and is reported for k = 1..min(scored rollouts per task).
* matplotlib (the `report` extra) is imported only to draw, and only through the Agg canvas, so
  the numbers work without it and drawing never touches a display or pyplot's global state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from envs import stats
from envs.contract import Trajectory


class TaskRow(BaseModel):
    """One task: its rollouts, how many were scored, and the mean reward with a CI."""

    task_id: str
    rollouts: int
    completed: int
    infra_failed: int
    correct: int
    """Scored rollouts with reward >= success_threshold."""
    mean: float | None
    """None when no rollout of the task was scored."""
    low: float | None
    """None below two scored rollouts."""
    high: float | None


class Side(BaseModel):
    """The counts and aggregate estimates of one policy's batch."""

    rollouts: int
    completed: int
    infra_failed: int
    """Excluded from every statistic, never scored 0."""
    infra_failed_by_reason: dict[str, int]
    tasks: int
    """Tasks with at least one scored rollout."""
    mean: stats.Estimate | None
    """Mean of per-task mean rewards; None when nothing was scored."""
    iqm: stats.Estimate | None
    """Interquartile mean of all scored rewards."""


class PairRow(BaseModel):
    task_id: str
    policy_mean: float
    baseline_mean: float


class ComparisonSummary(BaseModel):
    """Policy minus baseline on the tasks both scored."""

    tasks: int
    difference: stats.Estimate
    probability_of_improvement: stats.Estimate
    per_task: list[PairRow]
    excluded_tasks: list[str]
    """Tasks scored by only one of the two (left out of the comparison)."""


class Method(BaseModel):
    reps: int
    confidence: float
    seed: int
    success_threshold: float
    notes: list[str]


class Report(BaseModel):
    """Everything `report.json` holds."""

    envs: list[str]
    models: list[str]
    policy: Side
    pass_k: list[stats.PassK]
    per_task: list[TaskRow]
    baseline: Side | None = None
    comparison: ComparisonSummary | None = None
    method: Method
    files: list[str] = []


# -- numbers ---------------------------------------------------------------------------------
def _side(
    trajectories: Sequence[Trajectory], boot: stats.Bootstrap
) -> tuple[Side, dict[str, list[float]], Counter[str]]:
    """One policy's counts and aggregates, its scored rewards per task and infra failures per task."""
    if not trajectories:
        raise ValueError("no trajectories to report on")
    scored: dict[str, list[float]] = {}  # every task, in order of first appearance
    failed: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for t in trajectories:
        scored.setdefault(t.task_id, [])
        if t.infra_failed:
            failed[t.task_id] += 1
            reasons[t.termination.value] += 1
        elif t.reward is None:
            raise ValueError(f"rollout {t.rollout_id} ended {t.termination.value} without a reward")
        else:
            scored[t.task_id].append(t.reward.total)
    groups = [v for v in scored.values() if v]
    mean = iqm = None
    if groups:
        mean = stats.aggregate_ci(groups, statistic="mean", ragged=True, boot=boot)
        iqm = stats.aggregate_ci(groups, statistic="iqm", ragged=True, boot=boot)
    side = Side(
        rollouts=len(trajectories),
        completed=sum(map(len, groups)),
        infra_failed=sum(failed.values()),
        infra_failed_by_reason=dict(sorted(reasons.items())),
        tasks=len(groups),
        mean=mean,
        iqm=iqm,
    )
    return side, scored, failed


NOTES = [
    "Infra-failed rollouts are excluded from every statistic and counted separately; never scored 0.",
    "Mean = mean of per-task mean rewards; IQM = 25%-trimmed mean of all scored rewards (rliable).",
    "Aggregate CIs: stratified percentile bootstrap (rliable): scored rollouts resampled within each task, "
    "tasks fixed, so they leave out the variance from choosing other tasks.",
    "Per-task CIs: percentile bootstrap of the task's mean; none below two scored rollouts.",
    "pass@k (Chen et al. 2021, unbiased) and pass^k (tau-bench), k up to the fewest scored rollouts of a scored task.",
]


def summarize(
    trajectories: Sequence[Trajectory],
    *,
    baseline: Sequence[Trajectory] | None = None,
    boot: stats.Bootstrap = stats.DEFAULT_BOOTSTRAP,
    success_threshold: float = 1.0,
) -> Report:
    """The report's numbers, without writing anything.

    Args:
        trajectories: The evaluated policy's rollouts, infra-failed ones included (counted, excluded).
        baseline: Another policy's rollouts on the same tasks, to compare against.
        boot: Bootstrap replicates, confidence and seed of every interval.
        success_threshold: A reward total at or above it counts as correct for pass@k.
    """
    policy, scored, failed = _side(trajectories, boot)
    ids, values = [t for t, v in scored.items() for _ in v], [r for v in scored.values() for r in v]
    cis = {row.task_id: row for row in stats.per_task(ids, values, boot=boot)} if values else {}
    per_task = [
        TaskRow(
            task_id=task,
            rollouts=len(v) + failed[task],
            completed=len(v),
            infra_failed=failed[task],
            correct=sum(r >= success_threshold for r in v),
            mean=cis[task].mean if v else None,
            low=cis[task].low if v else None,
            high=cis[task].high if v else None,
        )
        for task, v in scored.items()
    ]
    notes = [*NOTES, f"Correct (pass@k) = reward >= {success_threshold}."]
    n, c = [r.completed for r in per_task if r.completed], [r.correct for r in per_task if r.completed]
    if n and min(n) != max(n):
        notes.append(f"Tasks have {min(n)}-{max(n)} scored rollouts; every estimator uses each task's own count.")
    report = Report(
        envs=sorted({t.env for t in trajectories}),
        models=sorted({t.model for t in trajectories if t.model}),
        policy=policy,
        pass_k=stats.pass_k_table(n, c) if n else [],
        per_task=per_task,
        method=Method(
            reps=boot.reps, confidence=boot.confidence, seed=boot.seed, success_threshold=success_threshold, notes=notes
        ),
    )
    if baseline is not None:
        report.baseline, base, _ = _side(baseline, boot)
        report.comparison = _compare(scored, base, boot, report.method.notes)
    return report


def _compare(
    policy: dict[str, list[float]], baseline: dict[str, list[float]], boot: stats.Bootstrap, notes: list[str]
) -> ComparisonSummary | None:
    common = [t for t, v in policy.items() if v and baseline.get(t)]
    excluded = sorted({t for t, v in (policy | baseline).items() if v} - set(common))
    if not common:
        notes.append("The baseline scored none of the policy's scored tasks: no comparison.")
        return None
    x, y = [policy[t] for t in common], [baseline[t] for t in common]
    result = stats.compare(x, y, ragged=True, boot=boot)
    notes.append(
        "Policy vs baseline, on tasks both scored: difference = mean over tasks of (policy task mean - baseline task "
        "mean); P(X > Y) = chance a policy rollout beats a baseline rollout of the same task, ties half (rliable); "
        "both CIs from one stratified bootstrap that resamples each policy's rollouts within each task."
    )
    return ComparisonSummary(
        tasks=len(common),
        difference=result.difference,
        probability_of_improvement=result.probability_of_improvement,
        per_task=[
            PairRow(task_id=t, policy_mean=float(np.mean(a)), baseline_mean=float(np.mean(b)))
            for t, a, b in zip(common, x, y, strict=True)
        ],
        excluded_tasks=excluded,
    )


# -- files -----------------------------------------------------------------------------------
def write_report(
    trajectories: Sequence[Trajectory],
    out_dir: str | Path,
    *,
    baseline: Sequence[Trajectory] | None = None,
    seed: int = 0,
    reps: int = 2000,
    confidence: float = 0.95,
    success_threshold: float = 1.0,
    plots: bool = True,
) -> Report:
    """Write `report.json`, `report.md` and (with `plots`) PNG plots into `out_dir`.

    Args:
        trajectories: The evaluated policy's rollouts, infra-failed ones included.
        out_dir: Directory to write into (created if missing).
        baseline: Another policy's rollouts on the same tasks, to compare against.
        seed: Seed of every bootstrap.
        reps: Bootstrap replicates per interval.
        confidence: Nominal two-sided coverage of every interval.
        success_threshold: A reward total at or above it counts as correct for pass@k.
        plots: Draw the PNGs (needs matplotlib: `pip install 'gymflow[report]'`).

    Returns:
        The summary written to `report.json`.
    """
    boot = stats.Bootstrap(reps=reps, confidence=confidence, seed=seed)
    report = summarize(trajectories, baseline=baseline, boot=boot, success_threshold=success_threshold)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report.files = ["report.json", "report.md", *(_plot(report, trajectories, baseline, out) if plots else [])]
    (out / "report.md").write_text(render_markdown(report))
    (out / "report.json").write_text(report.model_dump_json(indent=2) + "\n")
    return report


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    def cell(v: object) -> str:
        return f"{v:.3f}" if isinstance(v, float) else "-" if v is None else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return [*lines, *("| " + " | ".join(map(cell, row)) + " |" for row in rows), ""]


def _ci(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"[{low:.3f}, {high:.3f}]"


def render_markdown(report: Report) -> str:
    """`report.md`: the numbers of `report` as tables, with the method stated."""
    m, ci = report.method, f"{report.method.confidence:.0%} CI"
    lines = ["# Evaluation report", "", f"Environments: {', '.join(report.envs)}; models: {', '.join(report.models)}."]
    lines += ["", "## Summary", ""]
    for name, side in (("Policy", report.policy), ("Baseline", report.baseline)):
        if side is None:
            continue
        reasons = ", ".join(f"{k}: {v}" for k, v in side.infra_failed_by_reason.items()) or "none"
        lines += [
            f"**{name}**: {side.rollouts} rollouts, {side.completed} completed and scored, {side.infra_failed} "
            f"infra-failed (excluded, not scored 0; {reasons}); {side.tasks} tasks scored.",
            "",
        ]
        estimates = [
            (label, e.value, _ci(e.low, e.high)) for label, e in (("mean reward", side.mean), ("IQM", side.iqm)) if e
        ]
        lines += _table(["estimate", "value", ci], estimates) if estimates else []
    if report.pass_k:
        lines += ["## pass@k", "", f"Correct = reward >= {m.success_threshold}.", ""]
        lines += _table(
            ["k", "pass@k", "pass^k", "tasks"], [(p.k, p.pass_at_k, p.pass_hat_k, p.n_tasks) for p in report.pass_k]
        )
    lines += ["## Per task", ""]
    lines += _table(
        ["task", "rollouts", "completed", "infra-failed", "correct", "mean", ci],
        [
            (r.task_id, r.rollouts, r.completed, r.infra_failed, r.correct, r.mean, _ci(r.low, r.high))
            for r in report.per_task
        ],
    )
    if c := report.comparison:
        lines += ["## Policy vs baseline", "", f"On the {c.tasks} tasks both scored.", ""]
        pairs = (
            ("policy - baseline (mean reward)", c.difference),
            ("P(policy > baseline)", c.probability_of_improvement),
        )
        lines += _table(["estimate", "value", ci], [(label, e.value, _ci(e.low, e.high)) for label, e in pairs])
        lines += [f"Left out (scored by one side only): {', '.join(c.excluded_tasks)}.", ""] if c.excluded_tasks else []
    lines += ["## Method", "", f"- Bootstrap: {m.reps} replicates, {m.confidence:.0%} confidence, seed {m.seed}."]
    lines += [f"- {note}" for note in m.notes]
    plots = [f for f in report.files if f.endswith(".png")]
    lines += ["", "## Plots", "", *(f"![{f}]({f})" for f in plots)] if plots else []
    return "\n".join(lines) + "\n"


# -- plots -----------------------------------------------------------------------------------
def _plot(
    report: Report, trajectories: Sequence[Trajectory], baseline: Sequence[Trajectory] | None, out: Path
) -> list[str]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("plots need matplotlib: pip install 'gymflow[report]', or pass plots=False") from err
    figures: dict[str, Any] = {}

    def figure(name: str, height: float, width: float = 6.4, columns: int = 1) -> Any:
        figures[name] = Figure(figsize=(width, height), layout="constrained")
        FigureCanvasAgg(figures[name])  # Agg, never a display or pyplot's global figure registry
        return figures[name].subplots(1, columns)

    def rewards(trajs: Sequence[Trajectory] | None) -> list[float]:
        return [t.reward.total for t in trajs or () if not t.infra_failed and t.reward is not None]

    policy, base = rewards(trajectories), rewards(baseline)
    if not policy:
        return []
    conf = f"{report.method.confidence:.0%} CI"
    ax = figure("rewards.png", 4.0)
    ax.hist([policy, base] if base else [policy], bins=20, label=["policy", "baseline"][: 2 if base else 1])
    ax.set(xlabel="reward", ylabel="scored rollouts")
    ax.set_title(f"Reward distribution ({report.policy.infra_failed} infra-failed rollouts excluded)", fontsize=10)
    ax.legend()

    rows = [r for r in report.per_task if r.mean is not None]
    ax = figure("per_task.png", 1.2 + 0.28 * len(rows))
    _whiskers(ax, [(r.task_id[:40], r.mean or 0.0, r.low, r.high) for r in rows])
    ax.set(xlabel=f"mean reward ({conf})", title="Per-task mean reward")

    sides = [(name, side) for name, side in (("policy", report.policy), ("baseline", report.baseline)) if side]
    points = [
        (f"{name} {label}", e.value, e.low, e.high)
        for name, side in sides
        for label, e in (("mean", side.mean), ("IQM", side.iqm))
        if e
    ]
    ax = figure("aggregates.png", 1.4 + 0.4 * len(points))
    _whiskers(ax, points)
    ax.set(xlabel="reward", title=f"Aggregate estimates ({conf}, stratified bootstrap)")

    if c := report.comparison:
        left, mid, right = figure("comparison.png", 3.8, width=12.0, columns=3)
        for ax, label, e, ref in (
            (left, "policy - baseline", c.difference, 0.0),
            (mid, "P(policy > baseline)", c.probability_of_improvement, 0.5),
        ):
            _whiskers(ax, [(label, e.value, e.low, e.high)])
            ax.axvline(ref, color="grey", linestyle="--")
            ax.set(title=conf)
        xs, ys = [p.baseline_mean for p in c.per_task], [p.policy_mean for p in c.per_task]
        right.scatter(xs, ys)
        lo, hi = min(xs + ys), max(xs + ys)
        right.plot([lo, hi], [lo, hi], color="grey", linestyle="--")
        right.set(xlabel="baseline task mean", ylabel="policy task mean", title=f"Per task ({c.tasks} tasks)")
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=110)
    return list(figures)


def _whiskers(ax: Any, points: Sequence[tuple[str, float, float | None, float | None]]) -> None:
    """Labelled points top to bottom with CI whiskers (none where the CI is missing)."""
    value = [v for _, v, _, _ in points]
    low = [v - (lo if lo is not None else v) for _, v, lo, _ in points]
    high = [(hi if hi is not None else v) - v for _, v, _, hi in points]
    ax.errorbar(value, range(len(points)), xerr=[low, high], fmt="o", capsize=3)
    ax.set_yticks(range(len(points)), [label for label, _, _, _ in points])
    ax.invert_yaxis()
