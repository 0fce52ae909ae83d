"""`gymflow status` asks each workflow type only what it answers and prints tables, never dicts.

A running group (which has no `progress` query) shows its running rollouts, counted by
visibility, instead of a failed query; a training run's progress (phase, step, scalars,
checkpoints, history, launch record...) becomes a row of a table.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from mcp_support import eventually
from temporalio.client import Client

from gymflow.activities import names
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import GroupInput, RolloutInput
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.workers.cli import inspect, status
from gymflow.workers.servers.policy import AppServer
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.group import GroupRolloutWorkflow
from support import SlowModel

UI = "http://localhost:9999/namespaces/default"


def test_only_the_types_with_a_progress_query_are_asked() -> None:
    from gymflow.workers.roles import all_workflows

    answering = {
        cls.__name__ for cls in all_workflows() if callable(getattr(cls, inspect.PROGRESS_QUERY, None))
    }  # the classes are named after their workflow types
    assert answering == inspect.PROGRESS_TYPES and names.GROUP_WORKFLOW not in answering


async def test_a_running_group_shows_its_rollouts_not_a_failed_query(client: Client, worker: RunningWorker) -> None:
    held = SlowModel(CalculatorPolicy())
    async with AppServer(held) as model:
        task = generate_tasks(1, seed=11)[0]
        group = await client.start_workflow(
            GroupRolloutWorkflow.run,
            GroupInput(rollout=RolloutInput(env="math", task=task, model=ModelConfig(base_url=model.url)), n=3),
            id=f"status-group-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
        try:
            found = await eventually(
                lambda: status.collect(client, ui_url=UI, timeout_s=2.0),
                lambda s: any(r.workflow_id == group.id and r.progress == {"rollouts_running": 3} for r in s.parents),
            )
        finally:
            held.release.set()
        await group.result()
    text = status.render(found)
    lines = text.splitlines()
    row = next(line for line in lines if line.split() and line.split()[0] == group.id)
    assert "unavailable" not in row and "Query handler" not in text
    header = next(line for line in reversed(lines[: lines.index(row)]) if line.strip().startswith("workflow "))
    assert "GroupRolloutWorkflow" in text and "rollouts running" in text, text
    assert row[header.index("rollouts running") :].split()[0] == "3", (header, row)


def test_a_training_run_is_a_table_row() -> None:
    progress = {
        "phase": "training", "step": 12, "scalars": {"reward": 0.8125, "loss": 0.0421, "kl": 0.001, "lr": 15.0},
        "history": [{"step": 1.0, "reward": 0.1}], "runs": 0,
        "checkpoints": [{"report": {"name": "step-5"}, "eval": {"mean": 0.7}}, {"report": {"name": "step-10"}}],
        "launch": {"backend": "local", "run_id": "r", "pid": 4242}, "prepared": {"spec_uri": "file:///x"},
        "finish": None,
    }  # fmt: skip
    started = datetime.now(UTC) - timedelta(minutes=75)
    found = status.Status(
        parents=[
            status.Row("math-reference", names.TRAINING_WORKFLOW, started.isoformat(), 4500.0, f"{UI}/workflows/m",
                       env="math", progress=progress),
            status.Row("math-other", names.TRAINING_WORKFLOW, started.isoformat(), 30.0, f"{UI}/workflows/o",
                       env="math", progress="unavailable: no worker answered within 5 s"),
        ]
    )  # fmt: skip
    text = status.render(found)
    assert "{" not in text and "'" not in text, text
    header, row, other = text.splitlines()[1:4]
    for column, value in (("phase", "training"), ("step", "12"), ("running", "1 h 15 min"), ("env", "math")):
        assert row[header.index(column) :].startswith(value), (column, header, row)
    assert "reward 0.812, loss 0.0421, kl 0.001" in row and "2 (1 evaluated)" in row
    assert row.endswith(f"{UI}/workflows/m")
    assert other.split()[:3] == ["math-other", "math", "30"] and "unavailable: no worker answered" in other
