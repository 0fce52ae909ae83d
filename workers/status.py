"""`gymflow status`: what is running — batches, groups, dataset and training runs, with progress.

Parents are found through visibility by workflow type (workflows.names: the batch, group, dataset
generation, training and session workflow types) and asked their `progress` query, all at once
with a short timeout each. A type nobody has started yet simply has no rows; a parent whose
worker is down, or whose type has no `progress` query, shows why instead of a number. Running
rollouts are counted per env.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from temporalio.client import Client

from workers.inspect import query_progress
from workflows import names

PARENT_TYPES = (
    names.BATCH_WORKFLOW,
    names.GROUP_WORKFLOW,
    names.DATASET_WORKFLOW,
    names.TRAINING_WORKFLOW,
    names.SESSION_WORKFLOW,
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
    progress = await asyncio.gather(
        *(query_progress(client, r.workflow_id, timeout_s=timeout_s) for r in status.parents)
    )
    for row, value in zip(status.parents, progress, strict=True):
        row.progress = value
    async for execution in client.list_workflows(
        f'ExecutionStatus = "Running" AND WorkflowType = "{names.ROLLOUT_WORKFLOW}"', limit=10_000
    ):
        env = execution.typed_search_attributes.get(names.SA_ENV) or "?"
        status.rollouts_running[env] = status.rollouts_running.get(env, 0) + 1
    return status


def _progress_text(progress: Any) -> str:
    if isinstance(progress, dict):
        return ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in progress.items())
    return progress if isinstance(progress, str) else json.dumps(progress)


def render(status: Status) -> str:
    """The terminal view."""
    lines = []
    for kind in PARENT_TYPES:
        rows = [r for r in status.parents if r.workflow_type == kind]
        if not rows:
            continue
        lines.append(f"{kind} ({len(rows) + status.more.get(kind, 0)} running)")
        for row in rows:
            env = f" [{row.env}]" if row.env else ""
            lines.append(f"  {row.workflow_id}{env} · running {row.running_s:.0f} s · {_progress_text(row.progress)}")
            lines.append(f"    {row.ui}")
        if status.more.get(kind):
            lines.append(f"  ... and {status.more[kind]} more")
    if not lines:
        lines.append("no batches, groups, dataset or training runs are running")
    total = sum(status.rollouts_running.values())
    per_env = ", ".join(f"{env} {n}" for env, n in sorted(status.rollouts_running.items()))
    lines.append(f"rollouts running: {total}" + (f" ({per_env})" if per_env else ""))
    return "\n".join(lines)
