"""A 1,000-rollout batch with window 64 on the dev server (slow: `pytest -m slow`).

Checks the batch machinery at scale: continue-as-new keeps every run's history far under
Temporal's limits, all trajectories land in storage, and the eval report renders from them.
The env is the in-process math env (no MCP process per rollout) so the test measures the
orchestration, not server start-up.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from mcp_support import eventually
from temporalio.client import Client, WorkflowExecution

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import BatchInput, RolloutOptions
from gymflow.activities.storage import read_trajectories
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.workers.sdk.report import write_report
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.group import BatchRolloutWorkflow

HISTORY_EVENT_LIMIT = 51_200
HISTORY_BYTES_LIMIT = 50 * 1024 * 1024


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_thousand_rollout_batch(client: Client, worker: RunningWorker, tmp_path: Path) -> None:
    batch_id = f"load-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    async with PolicyServer(CalculatorPolicy()) as server:
        result = await client.execute_workflow(
            BatchRolloutWorkflow.run,
            BatchInput(
                env="math-inproc",
                dataset="generated",
                dataset_options={"n": 500, "seed": 1},
                samples_per_task=2,
                options=RolloutOptions(model=ModelConfig(base_url=server.url)),
                window=64,
            ),
            id=batch_id,
            task_queue=worker.task_queue,
        )
    elapsed = time.monotonic() - started
    assert result.total == 1000 and result.completed == 1000 and result.infra_failed == 0
    assert result.mean_reward == 1.0
    assert result.runs >= 2  # continue-as-new happened

    async def listed() -> list[WorkflowExecution]:  # visibility is eventually consistent
        return [w async for w in client.list_workflows(f'WorkflowId="{batch_id}"')]

    runs = await eventually(listed, lambda found: len(found) >= result.runs + 1)
    assert len(runs) == result.runs + 1
    largest = max(runs, key=lambda w: w.history_length)
    history = await client.get_workflow_handle(batch_id, run_id=largest.run_id).fetch_history()
    history_bytes = sum(e.ByteSize() for e in history.events)
    assert largest.history_length < HISTORY_EVENT_LIMIT / 4
    assert history_bytes < HISTORY_BYTES_LIMIT / 4

    trajectories = await read_trajectories(result.parts)
    assert len(trajectories) == 1000 and len({t.rollout_id for t in trajectories}) == 1000
    report = write_report(trajectories, tmp_path / "report", reps=500)
    assert (tmp_path / "report" / "report.html").is_file()
    assert result.report is not None and result.report.endswith(f"{batch_id}/report.html")  # the batch's own
    figures = {
        "rollouts": 1000,
        "window": 64,
        "wall_s": round(elapsed, 1),
        "rollouts_per_s": round(1000 / elapsed, 2),
        "runs": result.runs + 1,
        "max_history_events": largest.history_length,
        "max_history_bytes": history_bytes,
        "parts": len(result.parts),
        "mean_reward": report.policy.mean.value if report.policy.mean else None,
    }
    print(json.dumps(figures))
