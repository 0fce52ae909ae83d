"""Evaluation reports: the numbers of a batch of trajectories (and a baseline's), named and linked.

`summarize` turns contract `Trajectory` objects (and optionally a baseline's) into a `Report`:
what was compared (env, policy and baseline labels, models, the batches with their Web UI links)
and the numbers. `gymflow.envs.eval.html.render_html` makes it one self-contained HTML page with inline
SVG plots; the JSON is `Report.model_dump_json()`. Every statistic comes from `gymflow.envs.eval.stats`, so
the files say exactly what a trainer computing the same numbers would get. Pure: no I/O, no
temporalio (the `render_batch_report` activity and `gymflow eval` write the files).

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
* Plots are hand-made SVG (gymflow.envs.eval.svg): no plotting library on workers, and axes chosen for
  rewards (never a 0.96-1.04 axis when every reward is 1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from gymflow.envs.contract import Trajectory
from gymflow.envs.eval import stats


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

    label: str = "policy"
    """What ran: a baseline policy's name, an endpoint, a checkpoint."""
    models: list[str] = []
    """Model names its rollouts carry."""
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


class BatchRef(BaseModel):
    """A batch the report draws on, and where to look at it."""

    role: str
    """``policy`` or ``baseline``."""
    batch_id: str
    label: str
    ui: str | None = None
    """The batch's rollouts in the Temporal Web UI."""
    report: str | None = None
    """URI of the batch's own report (written when the batch ended)."""
    lineage: str | None = None
    """How the batch came to be, when not by running all of its rollouts: ``rescored from B with
    reward R``, ``resumes B (N rollouts carried over)``."""
    rollout_batches: list[str] = []
    """The batches whose rollout workflows these trajectories are, when not this one alone (a rescored
    batch's source; a resumed batch and the batches it resumed); empty: this batch."""


class Report(BaseModel):
    """Everything `report.json` holds."""

    envs: list[str]
    models: list[str]
    batches: list[BatchRef] = []
    ui_base: str | None = None
    """Web UI URL of the namespace (``http://host:port/namespaces/NS``): rollouts are linked from it."""
    policy: Side
    pass_k: list[stats.PassK]
    per_task: list[TaskRow]
    baseline: Side | None = None
    comparison: ComparisonSummary | None = None
    method: Method
    sandbox: list[str] = []
    """Sandbox opt-outs the trajectories record (`Trajectory.sandbox`), each with its rollout count:
    model code ran without guaranteed isolation, so rewards may come from read answers."""


# -- numbers ---------------------------------------------------------------------------------
def _side(
    trajectories: Sequence[Trajectory], boot: stats.Bootstrap, label: str
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
        label=label,
        models=sorted({t.model for t in trajectories if t.model}),
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
    "tasks fixed, so they leave out the variance from choosing other tasks. Where every task has a single "
    "scored rollout there is nothing to redraw within a task, and the tasks themselves are resampled instead.",
    "Per-task CIs: percentile bootstrap of the task's mean; none below two scored rollouts.",
    "pass@k (Chen et al. 2021, unbiased) and pass^k (tau-bench), k up to the fewest scored rollouts of a scored task.",
]


def summarize(
    trajectories: Sequence[Trajectory],
    *,
    baseline: Sequence[Trajectory] | None = None,
    boot: stats.Bootstrap = stats.DEFAULT_BOOTSTRAP,
    success_threshold: float = 1.0,
    labels: tuple[str, str] = ("policy", "baseline"),
    batches: Sequence[BatchRef] = (),
    ui_base: str | None = None,
) -> Report:
    """The report's numbers, without writing anything.

    Args:
        trajectories: The evaluated policy's rollouts, infra-failed ones included (counted, excluded).
        baseline: Another policy's rollouts on the same tasks, to compare against.
        boot: Bootstrap replicates, confidence and seed of every interval.
        success_threshold: A reward total at or above it counts as correct for pass@k.
        labels: What the policy and the baseline are (names shown everywhere in the report).
        batches: The batches the trajectories come from, with their links.
        ui_base: The Web UI URL of the namespace, for links to the rollouts.
    """
    policy, scored, failed = _side(trajectories, boot, labels[0])
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
        models=sorted({t.model for t in (*trajectories, *(baseline or ())) if t.model}),
        batches=list(batches),
        ui_base=ui_base,
        policy=policy,
        pass_k=stats.pass_k_table(n, c) if n else [],
        per_task=per_task,
        method=Method(
            reps=boot.reps, confidence=boot.confidence, seed=boot.seed, success_threshold=success_threshold, notes=notes
        ),
    )
    opted_out = Counter(t.sandbox for t in (*trajectories, *(baseline or ())) if t.sandbox)
    report.sandbox = [f"{text} ({count} rollout(s))" for text, count in sorted(opted_out.items())]
    if baseline is not None:
        report.baseline, base, _ = _side(baseline, boot, labels[1])
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
