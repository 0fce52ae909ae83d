"""Under load the worker keeps up: `gymflow eval sheets --n 200` with default settings (issue 20).

The eval's in-process worker runs 200 sheets rollouts (a sandboxed MCP server each, sandboxed code
runs, sandboxed recalculating rewards) on this machine's cores at the default window. Counted from
every history of the batch (`bench.health`): every rollout scored 1.0, no activity attempt timed
out by heartbeat or was retried, no workflow task failed or took over 2 s.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import figures
import pytest
from temporalio.client import Client

from bench.health import batch_health
from bench.load import last_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROLLOUTS = 200


async def test_eval_200_sheets_rollouts_with_defaults(temporal_address: str, client: Client, tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "gymflow.workers.cli", "eval", "sheets", "--policy", "reference", "--n", str(ROLLOUTS),
        "--json", "--reps", "200", "--address", temporal_address, "--task-queue", f"load-{uuid.uuid4().hex[:8]}",
        "--data-dir", str(tmp_path / "data"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYMFLOW_")}  # default settings
    run = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=1700, cwd=tmp_path, env=env, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # The summary is the last JSON document on stdout (until the SDK core's log lines go to stderr,
    # a busy run can print warnings before it).
    summary = last_json(run.stdout)
    policy = summary["policy"]
    assert (policy["rollouts"], policy["completed"], policy["infra_failed"]) == (ROLLOUTS, ROLLOUTS, 0)
    assert policy["mean"]["value"] == 1.0

    health = await batch_health(client, summary["batches"][0]["batch_id"])
    figures.record("load", "eval sheets --n 200, default settings", load1=os.getloadavg()[0], **{
        k: v for k, v in health.items() if isinstance(v, int | float)
    })  # fmt: skip
    assert health["workflows"] >= ROLLOUTS + 1  # the rollouts and their batch
    assert health["heartbeat_timeouts"] == 0, health
    assert health["retried_activity_attempts"] == 0, health
    assert health["workflow_task_failures"] == 0, health
    assert health["slow_workflow_tasks"] == 0, health
