"""A report as one self-contained HTML page: what was compared, the numbers, inline SVG plots, links.

The page names the env, the policy and the baseline (labels and models), the batches with links
to their rollouts in the Temporal Web UI, then the summary, pass@k, the comparison, the plots
(both sides on every plot that compares) and a per-task table whose rows link to the task's
rollouts (``GymflowBatch`` and ``GymflowTask`` search attributes). No script, no external asset.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from urllib.parse import quote

from gymflow.envs.contract import Trajectory
from gymflow.envs.eval import stats, svg
from gymflow.envs.eval.report import BatchRef, Report, Side, summarize
from gymflow.envs.eval.stats import Estimate

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #111827; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #e5e7eb; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.92em; }
th, td { border: 1px solid #e5e7eb; padding: 3px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.policy { color: #2563eb; font-weight: 600; } .baseline { color: #ea580c; font-weight: 600; }
.meta td:first-child { color: #6b7280; } .note { color: #6b7280; font-size: 0.9em; }
.warning { color: #b91c1c; }
figure { margin: 1em 0; }
"""


MAX_TASK_ROWS = 40
"""Up to this many tasks get a per-task dot plot (beyond it, the scatter and the table)."""


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ci(e: Estimate | None) -> str:
    if e is None:
        return "-"
    return f"{e.value:.3f}" + ("" if e.low is None or e.high is None else f" [{e.low:.3f}, {e.high:.3f}]")


def _link(url: str | None, text: str) -> str:
    return f'<a href="{escape(url)}">{escape(text)}</a>' if url else escape(text)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool] = ()) -> str:
    """Cells are HTML already (escape before)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{c}</td>' if i < len(numeric) and numeric[i] else f"<td>{c}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _query_url(ui_base: str | None, query: str) -> str | None:
    return f"{ui_base}/workflows?query={quote(query)}" if ui_base else None


def _sides(report: Report) -> list[tuple[str, Side]]:
    return [(role, side) for role, side in (("policy", report.policy), ("baseline", report.baseline)) if side]


def _meta(report: Report) -> str:
    rows = [["environment", escape(", ".join(report.envs))]]
    for role, side in _sides(report):
        models = ", ".join(side.models) or "(the endpoint's default)"
        rows.append([role, f'<span class="{role}">{escape(side.label)}</span> — model {escape(models)}'])
    for batch in report.batches:
        own = f" · {_link(batch.report, 'its report')}" if batch.report else ""
        own += f" · {escape(batch.lineage)}" if batch.lineage else ""
        rows.append([f"{batch.role} batch", f"{_link(batch.ui, batch.batch_id)} ({escape(batch.label)}){own}"])
    return '<table class="meta">' + "".join(f"<tr><td>{a}</td><td>{b}</td></tr>" for a, b in rows) + "</table>"


def _summary(report: Report) -> str:
    rows = []
    for role, side in _sides(report):
        reasons = ", ".join(f"{k}: {v}" for k, v in side.infra_failed_by_reason.items()) or "none"
        rows.append(
            [
                f'<span class="{role}">{escape(side.label)}</span>',
                str(side.rollouts),
                str(side.completed),
                f"{side.infra_failed} ({escape(reasons)})",
                str(side.tasks),
                _ci(side.mean),
                _ci(side.iqm),
            ]
        )
    conf = f"{report.method.confidence:.0%} CI"
    header = ["", "rollouts", "scored", "infra-failed (excluded)", "tasks", f"mean reward [{conf}]", f"IQM [{conf}]"]
    return _table(header, rows, numeric=[False, True, True, False, True, True, True])


def _names(report: Report) -> list[str]:
    """Each side's label, with its role added when both sides have the same label."""
    sides = _sides(report)
    same = len({side.label for _, side in sides}) < len(sides)
    return [f"{side.label} ({role})" if same else side.label for role, side in sides]


def _plots(report: Report, rewards: dict[str, list[float]]) -> list[str]:
    names = _names(report)
    conf = f"{report.method.confidence:.0%} CI"
    figures = []
    if any(rewards.values()):
        series = {name: rewards.get(role, []) for name, (role, _) in zip(names, _sides(report), strict=True)}
        figures.append(svg.histogram(series, title="Reward distribution", xlabel="reward"))
    points = [
        svg.Point(label, e.value, e.low, e.high, series=i)
        for i, (_, side) in enumerate(_sides(report))
        for label, e in (("mean", side.mean), ("IQM", side.iqm))
        if e is not None
    ]
    if points:
        figures.append(svg.dot_plot(points, title=f"Aggregate estimates ({conf})", xlabel="reward", names=names))
    rows = [r for r in report.per_task if r.mean is not None]
    if 0 < len(rows) <= MAX_TASK_ROWS:
        base = {p.task_id: p.baseline_mean for p in report.comparison.per_task} if report.comparison else {}
        tasks = [svg.Point(r.task_id, r.mean or 0.0, r.low, r.high) for r in rows]
        tasks += [svg.Point(t, m, series=1) for t, m in base.items()]
        figures.append(svg.dot_plot(tasks, title=f"Per-task mean reward ({conf})", xlabel="reward", names=names))
    if c := report.comparison:
        diff = [svg.Point("policy - baseline", c.difference.value, c.difference.low, c.difference.high)]
        figures.append(
            svg.dot_plot(
                diff,
                title=f"Difference in mean reward ({conf})",
                xlabel="reward difference",
                unit=(-1.0, 1.0),
                reference=0.0,
            )
        )
        poi = c.probability_of_improvement
        figures.append(
            svg.dot_plot(
                [svg.Point("P(policy > baseline)", poi.value, poi.low, poi.high)],
                title=f"Probability of improvement ({conf})",
                xlabel="probability",
                reference=0.5,
            )
        )
        figures.append(
            svg.scatter(
                [(p.baseline_mean, p.policy_mean) for p in c.per_task],
                title=f"Per-task mean reward ({c.tasks} tasks)",
                xlabel=f"{names[1]} (baseline)" if len(names) > 1 else "baseline",
                ylabel=f"{names[0]} (policy)",
            )
        )
    return figures


def _batch_query(batch: BatchRef) -> str:
    """The visibility query of the batch's rollouts (those of the batches they came from, if others)."""
    ids = batch.rollout_batches or [batch.batch_id]
    if len(ids) == 1:
        return f'GymflowBatch="{ids[0]}"'
    return "GymflowBatch IN (" + ", ".join(f'"{i}"' for i in ids) + ")"


def _per_task(report: Report) -> str:
    base = {r.task_id: r for r in (report.comparison.per_task if report.comparison else [])}
    batch = {b.role: _batch_query(b) for b in report.batches}
    rows = []
    for r in report.per_task:
        query = f'{batch["policy"]} AND GymflowTask="{r.task_id}"' if "policy" in batch else ""
        task = _link(_query_url(report.ui_base, query) if query else None, r.task_id)
        row = [task, str(r.rollouts), str(r.completed), str(r.infra_failed), str(r.correct), _num(r.mean)]
        row.append("-" if r.low is None or r.high is None else f"[{r.low:.3f}, {r.high:.3f}]")
        if report.baseline is not None:
            row.append(_num(base[r.task_id].baseline_mean) if r.task_id in base else "-")
        rows.append(row)
    header = ["task", "rollouts", "scored", "infra-failed", "correct", "mean", f"{report.method.confidence:.0%} CI"]
    if report.baseline is not None:
        header.append(f"{report.baseline.label} mean")
    return _table(header, rows, numeric=[False, True, True, True, True, True, True, True])


def render_html(report: Report, *, rewards: dict[str, list[float]] | None = None) -> str:
    """The report page.

    Args:
        report: What `gymflow.envs.eval.report.summarize` computed.
        rewards: The scored reward totals per side (``{"policy": [...], "baseline": [...]}``), for
            the reward distribution plot.
    """
    labels = _names(report)
    title = f"{', '.join(report.envs)}: {' vs '.join(labels)}"
    parts = [f"<h1>Evaluation — {escape(title)}</h1>", _meta(report)]
    parts += [f'<p class="warning"><b>Unsafe sandbox:</b> {escape(line)}</p>' for line in report.sandbox]
    parts += ["<h2>Summary</h2>", _summary(report)]
    if report.pass_k:
        parts += [f'<h2>pass@k</h2><p class="note">Correct = reward ≥ {report.method.success_threshold:g}.</p>']
        parts.append(
            _table(
                ["k", "pass@k", "pass^k", "tasks"],
                [[str(p.k), _num(p.pass_at_k), _num(p.pass_hat_k), str(p.n_tasks)] for p in report.pass_k],
                numeric=[True] * 4,
            )
        )
    if c := report.comparison:
        parts.append(f"<h2>{escape(labels[0])} vs {escape(labels[1])}</h2><p>On the {c.tasks} tasks both scored.</p>")
        rows = [
            ["policy - baseline (mean reward)", _ci(c.difference)],
            ["P(policy > baseline)", _ci(c.probability_of_improvement)],
        ]
        parts.append(_table(["estimate", f"value [{report.method.confidence:.0%} CI]"], rows, numeric=[False, True]))
        if c.excluded_tasks:
            parts.append(
                f'<p class="note">Left out (scored by one side only): {escape(", ".join(c.excluded_tasks))}.</p>'
            )
    plots = _plots(report, rewards or {})
    if plots:
        parts += ["<h2>Plots</h2>", *(f"<figure>{p}</figure>" for p in plots)]
    open_ = " open" if len(report.per_task) <= 40 else ""
    parts.append(
        f"<h2>Per task</h2><details{open_}><summary>{len(report.per_task)} tasks</summary>{_per_task(report)}</details>"
    )
    m = report.method
    notes = "".join(f"<li>{escape(n)}</li>" for n in m.notes)
    parts.append(
        f"<h2>Method</h2><ul><li>Bootstrap: {m.reps} replicates, {m.confidence:.0%} confidence, "
        f"seed {m.seed}.</li>{notes}</ul>"
    )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>" + "\n".join(parts) + "</body></html>\n"
    )


def scored_rewards(trajectories: Sequence[Trajectory] | None) -> list[float]:
    """The reward totals of the scored (not infra-failed) rollouts."""
    return [t.reward.total for t in trajectories or () if not t.infra_failed and t.reward is not None]


def render_report(
    trajectories: Sequence[Trajectory],
    *,
    baseline: Sequence[Trajectory] | None = None,
    boot: stats.Bootstrap = stats.DEFAULT_BOOTSTRAP,
    success_threshold: float = 1.0,
    labels: tuple[str, str] = ("policy", "baseline"),
    batches: Sequence[BatchRef] = (),
    ui_base: str | None = None,
) -> tuple[Report, str, str]:
    """The report of `trajectories` (vs `baseline`), its HTML page and its JSON text.

    Args: as `gymflow.envs.eval.report.summarize`.
    """
    report = summarize(
        trajectories,
        baseline=baseline,
        boot=boot,
        success_threshold=success_threshold,
        labels=labels,
        batches=batches,
        ui_base=ui_base,
    )
    rewards = {"policy": scored_rewards(trajectories), "baseline": scored_rewards(baseline)}
    return report, render_html(report, rewards=rewards), report.model_dump_json(indent=2) + "\n"
