"""A checkpoint's eval batch against the baseline's: the numbers a training run records.

Pure (no I/O): the `compare_checkpoint` activity reads both batches' trajectories and writes the
report this returns. Scores are paired by task; infra-failed rollouts are dropped (never scored
0), and a task only one side scored is left out of the comparison.

Intervals resample tasks (a percentile bootstrap over per-task values, `gymflow.envs.eval.stats.mean_ci`): the
question a checkpoint comparison answers is whether it is better on tasks like these, and with one
sample per task (the default) rliable's stratified bootstrap, which keeps the tasks and redraws
their runs, has nothing to redraw. The probability of improvement is rliable's (per task, the
Mann-Whitney statistic of the two sides' runs, ties half), averaged over tasks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gymflow.activities.training_schema import EvalSummary
from gymflow.envs.contract import Trajectory
from gymflow.envs.errors import StatsError
from gymflow.envs.eval.stats import Bootstrap, group_by_task, mean_ci, probability_of_improvement


def _scores(trajectories: list[Trajectory]) -> dict[str, list[float]]:
    scored = [t for t in trajectories if t.reward is not None and not t.infra_failed]
    if not scored:
        return {}
    grouped = group_by_task([t.task_id for t in scored], [t.reward.total for t in scored if t.reward is not None])
    return {task: [float(v) for v in values] for task, values in grouped.items()}


def compare_batches(
    input: Any, checkpoint: list[Trajectory], baseline: list[Trajectory]
) -> tuple[EvalSummary, dict[str, Any]]:
    """(summary, full report) of `checkpoint` vs `baseline`; `input` is the activity's CompareInput."""
    mine, theirs = _scores(checkpoint), _scores(baseline)
    tasks = [task for task in mine if task in theirs]
    summary = EvalSummary(
        checkpoint=input.checkpoint.name,
        step=input.checkpoint.step,
        batch_id=input.batch_id,
        n_tasks=len(tasks),
        infra_failed=sum(t.infra_failed for t in checkpoint),
    )
    report: dict[str, Any] = {
        "checkpoint": input.checkpoint.model_dump(mode="json"),
        "batch_id": input.batch_id,
        "scores": {task: mine[task] for task in tasks},
        "baseline_scores": {task: theirs[task] for task in tasks},
    }
    if len(tasks) < 2:
        summary.error = f"only {len(tasks)} task(s) scored by both the checkpoint and the baseline"
        return summary, report | {"summary": summary.model_dump(mode="json")}
    boot = Bootstrap(reps=input.reps, seed=0)
    try:
        x = [np.asarray(mine[t]) for t in tasks]
        y = [np.asarray(theirs[t]) for t in tasks]
        mean = mean_ci([v.mean() for v in x], boot=boot)
        base = mean_ci([v.mean() for v in y], boot=boot)
        difference = mean_ci([a.mean() - b.mean() for a, b in zip(x, y, strict=True)], boot=boot)
        poi = mean_ci([probability_of_improvement([a], [b], ragged=True) for a, b in zip(x, y, strict=True)], boot=boot)
    except StatsError as exc:
        summary.error = str(exc)
        return summary, report | {"summary": summary.model_dump(mode="json")}
    summary = summary.model_copy(
        update={
            "mean": mean.value,
            "mean_low": mean.low,
            "mean_high": mean.high,
            "baseline_mean": base.value,
            "difference": difference.value,
            "difference_low": difference.low,
            "difference_high": difference.high,
            "probability_of_improvement": poi.value,
            "poi_low": poi.low,
            "poi_high": poi.high,
        }
    )
    report["summary"] = summary.model_dump(mode="json")
    report["method"] = f"{difference.method}, over per-task values (tasks resampled, paired)"
    return summary, report
