"""Writing a report's files: `report.html` (self-contained, inline SVG plots) and `report.json`.

The numbers and the page come from `gymflow.envs.eval.report` (pure); this is the file side, used by
`gymflow eval` for its policy-vs-baseline report. Each batch's own report is written into the
batch's storage by the `render_batch_report` activity (gymflow.activities.report) with the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gymflow.envs.contract import Trajectory
from gymflow.envs.eval import stats
from gymflow.envs.eval.html import render_report
from gymflow.envs.eval.report import BatchRef, Report, summarize

__all__ = ["Report", "summarize", "write_report"]


def write_report(
    trajectories: Sequence[Trajectory],
    out_dir: str | Path,
    *,
    baseline: Sequence[Trajectory] | None = None,
    seed: int = 0,
    reps: int = 2000,
    confidence: float = 0.95,
    success_threshold: float = 1.0,
    labels: tuple[str, str] = ("policy", "baseline"),
    batches: Sequence[BatchRef] = (),
    ui_base: str | None = None,
) -> Report:
    """Write `report.html` and `report.json` into `out_dir` (created if missing).

    Args:
        trajectories: The evaluated policy's rollouts, infra-failed ones included.
        out_dir: Directory to write into.
        baseline: Another policy's rollouts on the same tasks, to compare against.
        seed: Seed of every bootstrap.
        reps: Bootstrap replicates per interval.
        confidence: Nominal two-sided coverage of every interval.
        success_threshold: A reward total at or above it counts as correct for pass@k.
        labels: Names of the policy and the baseline.
        batches: The batches the trajectories come from, with their links.
        ui_base: Web UI URL of the namespace, for links to rollouts.

    Returns:
        The summary written to `report.json`.
    """
    report, page, data = render_report(
        trajectories,
        baseline=baseline,
        boot=stats.Bootstrap(reps=reps, confidence=confidence, seed=seed),
        success_threshold=success_threshold,
        labels=labels,
        batches=batches,
        ui_base=ui_base,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.html").write_text(page)
    (out / "report.json").write_text(data)
    return report
