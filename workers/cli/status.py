"""`gymflow status`: what is running — batches, groups, dataset and training runs, with progress.

Parents are found through visibility by workflow type (gymflow.activities.names: the batch, group, dataset
generation, training and session workflow types). Each type is asked only what it answers: the
types with a `progress` query (gymflow.workers.cli.inspect.PROGRESS_TYPES) that query, all at once with a short
timeout each; a group, which has none, the count of its running rollouts from visibility. A type
nobody has started yet simply has no rows; a parent whose worker is down shows why instead of
numbers. Running rollouts are counted per env.

The terminal view is one table per type, whose columns are the fields of that type's progress that
an operator reads (done / in flight / infra-failed / mean reward of a batch, stage and accepted /
target of a dataset run, phase, step, last scalars and checkpoints of a training run, ...);
`--json` gives every field as the query returned it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from temporalio.client import Client
from temporalio.service import RPCError

from gymflow.activities import names
from gymflow.workers.cli.inspect import PROGRESS_TYPES, query_progress

PARENT_TYPES = (
    names.BATCH_WORKFLOW,
    names.GROUP_WORKFLOW,
    names.DATASET_WORKFLOW,
    names.TRAINING_WORKFLOW,
    names.SESSION_WORKFLOW,
    names.RESCORE_WORKFLOW,
)
"""Workflow types `gymflow status` lists, in this order."""
MAX_ROWS = 50
"""Rows listed per type at most (the rest are counted)."""


@dataclass
class Row:
    workflow_id: str
    workflow_type: str
    started: str
    running_s: float
    ui: str
    env: str | None = None
    progress: Any = None
    """The type's progress (a dict), or a sentence saying why it is unavailable."""


@dataclass
class Status:
    """What `gymflow status` shows (also its --json output)."""

    parents: list[Row] = field(default_factory=list)
    more: dict[str, int] = field(default_factory=dict)
    """Running parents per type beyond the rows listed."""
    rollouts_running: dict[str, int] = field(default_factory=dict)
    """Running rollouts per env."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


async def _group_progress(client: Client, workflow_id: str) -> dict[str, Any] | str:
    """A group has no progress query: its running rollouts, counted by visibility."""
    query = f'ExecutionStatus = "Running" AND ParentWorkflowId = "{workflow_id}"'
    try:
        return {"rollouts_running": (await client.count_workflows(query)).count}
    except RPCError as exc:
        return f"unavailable: {exc.message[:160]}"


async def _progress(client: Client, row: Row, timeout_s: float) -> Any:
    if row.workflow_type in PROGRESS_TYPES:
        return await query_progress(client, row.workflow_id, timeout_s=timeout_s)
    if row.workflow_type == names.GROUP_WORKFLOW:
        return await _group_progress(client, row.workflow_id)
    return None


async def collect(client: Client, *, ui_url: str, timeout_s: float = 5.0) -> Status:
    """Query visibility and every running parent's progress."""
    status = Status()
    types = ", ".join(f'"{t}"' for t in PARENT_TYPES)
    query = f'ExecutionStatus = "Running" AND WorkflowType IN ({types})'
    now = datetime.now(UTC)
    per_type: dict[str, int] = {}
    async for execution in client.list_workflows(query, limit=MAX_ROWS * len(PARENT_TYPES)):
        per_type[execution.workflow_type] = per_type.get(execution.workflow_type, 0) + 1
        if per_type[execution.workflow_type] > MAX_ROWS:
            status.more[execution.workflow_type] = per_type[execution.workflow_type] - MAX_ROWS
            continue
        status.parents.append(
            Row(
                workflow_id=execution.id,
                workflow_type=execution.workflow_type,
                started=execution.start_time.isoformat(),
                running_s=(now - execution.start_time).total_seconds(),
                ui=f"{ui_url}/workflows/{quote(execution.id, safe='')}",
                env=execution.typed_search_attributes.get(names.SA_ENV),
            )
        )
    status.parents.sort(key=lambda r: (PARENT_TYPES.index(r.workflow_type), r.started))
    progress = await asyncio.gather(*(_progress(client, r, timeout_s) for r in status.parents))
    for row, value in zip(status.parents, progress, strict=True):
        row.progress = value
    async for execution in client.list_workflows(
        f'ExecutionStatus = "Running" AND WorkflowType = "{names.ROLLOUT_WORKFLOW}"', limit=10_000
    ):
        env = execution.typed_search_attributes.get(names.SA_ENV) or "?"
        status.rollouts_running[env] = status.rollouts_running.get(env, 0) + 1
    return status


# -- the terminal view -------------------------------------------------------------------------
Column = tuple[str, Callable[[dict[str, Any]], Any]]
"""(header, the cell from a row's progress dict)."""


def _number(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _scalars(progress: dict[str, Any]) -> str:
    scalars = progress.get("scalars") or {}
    return ", ".join(f"{k} {v:.3g}" for k, v in list(scalars.items())[:3]) or "-"


def _checkpoints(progress: dict[str, Any]) -> str:
    checkpoints = progress.get("checkpoints") or []
    evaluated = sum(bool(c.get("eval")) for c in checkpoints)
    return f"{len(checkpoints)} ({evaluated} evaluated)" if checkpoints else "0"


COLUMNS: dict[str, Sequence[Column]] = {
    names.BATCH_WORKFLOW: (
        ("done", lambda p: p.get("completed")),
        ("in flight", lambda p: p.get("in_flight")),
        ("infra-failed", lambda p: p.get("infra_failed")),
        ("mean reward", lambda p: _number(p.get("mean_reward"))),
    ),
    names.GROUP_WORKFLOW: (("rollouts running", lambda p: p.get("rollouts_running")),),
    names.DATASET_WORKFLOW: (
        ("stage", lambda p: p.get("stage")),
        ("accepted", lambda p: f"{p.get('accepted', 0)}/{p.get('target', '?')}"),
        ("rejected", lambda p: p.get("rejected")),
        ("batches in flight", lambda p: p.get("batches_in_flight")),
    ),
    names.TRAINING_WORKFLOW: (
        ("phase", lambda p: p.get("phase")),
        ("step", lambda p: "-" if (p.get("step") or 0) < 0 else p.get("step")),
        ("scalars", _scalars),
        ("checkpoints", _checkpoints),
    ),
    names.SESSION_WORKFLOW: (
        ("turns", lambda p: p.get("turns")),
        ("tool calls", lambda p: p.get("tool_calls")),
        ("recoveries", lambda p: p.get("recoveries")),
        ("done", lambda p: "yes" if p.get("done") else "no"),
    ),
    names.RESCORE_WORKFLOW: (
        ("rescored", lambda p: p.get("completed")),
        ("parts", lambda p: f"{p.get('parts', 0)}/{p.get('of_parts') or '?'}"),
        ("infra-failed", lambda p: p.get("infra_failed")),
        ("mean reward", lambda p: _number(p.get("mean_reward"))),
    ),
}
"""Per type, the progress fields of its table."""


def _running(seconds: float) -> str:
    minutes, hours = int(seconds // 60), int(seconds // 3600)
    if hours:
        return f"{hours} h {minutes % 60} min"
    return f"{minutes} min" if minutes else f"{seconds:.0f} s"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, indent: str = "  ") -> list[str]:
    """Rows under headers, columns padded to their widest cell (the last one left ragged).

    A row with fewer cells than headers ends in one cell that spans the rest (a sentence) and
    does not widen the columns it spans.
    """
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row if len(row) == len(headers) else row[:-1]):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) for c, w in zip(cells[:-1], widths, strict=False)]
        return indent + "  ".join([*padded, cells[-1]]).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def _cells(row: Row, columns: Sequence[Column]) -> list[str]:
    head = [row.workflow_id, row.env or "-", _running(row.running_s)]
    if isinstance(row.progress, dict):
        return [*head, *(str(_number(get(row.progress))) for _, get in columns), row.ui]
    # No numbers to show (no worker answered): the reason and the link, across the progress columns.
    reason = row.progress if isinstance(row.progress, str) else "-"
    return [*head, f"{reason} · {row.ui}"]


def render(status: Status) -> str:
    """The terminal view: a table per workflow type, then the running rollouts per env."""
    lines: list[str] = []
    for kind in PARENT_TYPES:
        rows = [r for r in status.parents if r.workflow_type == kind]
        if not rows:
            continue
        columns = COLUMNS[kind]
        if lines:
            lines.append("")
        lines.append(f"{kind} ({len(rows) + status.more.get(kind, 0)} running)")
        headers = ["workflow", "env", "running", *(h for h, _ in columns), "web ui"]
        lines += table(headers, [_cells(r, columns) for r in rows])
        if status.more.get(kind):
            lines.append(f"  ... and {status.more[kind]} more")
    if not lines:
        lines.append("no batches, groups, dataset or training runs are running")
    total = sum(status.rollouts_running.values())
    per_env = ", ".join(f"{env} {n}" for env, n in sorted(status.rollouts_running.items()))
    lines += ["", f"rollouts running: {total}" + (f" ({per_env})" if per_env else "")]
    return "\n".join(lines)
