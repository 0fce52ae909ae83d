"""`gymflow eval math` killed (-9, the whole command: its worker, policy server and MCP servers) in the
middle of its batch, then `gymflow eval math --resume BATCH`: the merged report equals an uninterrupted
`gymflow eval math` (slow: three CLI runs of real MCP rollouts; the default suite kills a worker
process in tests/workflows/test_resume.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from mcp_support import eventually
from temporalio.client import Client, WorkflowExecutionStatus

from gymflow.workflows.group import BatchRolloutWorkflow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GYMFLOW = Path(sys.executable).parent / "gymflow"
TASKS = 12
KILL_AFTER = 4
"""Kill the command once its batch has finished this many rollouts."""


def command(address: str, tmp_path: Path, *args: str) -> list[str]:
    queue = f"resume-cli-{uuid.uuid4().hex[:8]}"
    return [str(GYMFLOW), "eval", "math", "--policy", "calculator", "--reps", "200", "--json", "--address", address,
            "--task-queue", queue, "--data-dir", str(tmp_path / "data"), *args]  # fmt: skip


async def run(argv: list[str], cwd: Path) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(*argv, cwd=cwd, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 600)
    assert process.returncode == 0, err.decode()[-3000:]
    return json.loads(out)


def side(summary: dict[str, Any]) -> tuple[Any, ...]:
    policy = summary["policy"]
    rows = sorted((r["task_id"], r["rollouts"], r["completed"], r["mean"]) for r in summary["per_task"])
    return policy["rollouts"], policy["completed"], policy["infra_failed"], policy["mean"]["value"], rows


async def test_eval_killed_then_resumed(client: Client, temporal_address: str, tmp_path: Path) -> None:
    argv = command(temporal_address, tmp_path, "--n", str(TASKS), "--window", "2")
    process = await asyncio.create_subprocess_exec(*argv, cwd=tmp_path, stdout=asyncio.subprocess.DEVNULL,
                                                   stderr=asyncio.subprocess.PIPE, start_new_session=True)  # fmt: skip
    assert process.stderr is not None
    batch_id = None
    while batch_id is None:  # the command names its batch as it starts it
        line = (await asyncio.wait_for(process.stderr.readline(), 120)).decode()
        assert line, "the command ended before naming its batch"
        if match := re.match(r"policy batch (\S+): ", line):
            batch_id = match[1]
    handle = client.get_workflow_handle(batch_id)
    await eventually(lambda: handle.query(BatchRolloutWorkflow.progress),
                     lambda p: p["completed"] >= KILL_AFTER, timeout_s=300)  # fmt: skip
    os.killpg(process.pid, signal.SIGKILL)  # the command and everything it started
    await process.wait()
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING  # left behind, stuck

    resumed = await run(command(temporal_address, tmp_path, "--resume", batch_id), tmp_path)
    uninterrupted = await run(command(temporal_address, tmp_path, "--n", str(TASKS)), tmp_path)
    assert side(resumed) == side(uninterrupted)
    assert resumed["policy"]["rollouts"] == TASKS and resumed["policy"]["infra_failed"] == 0
    result = resumed["results"]["policy"]
    assert result["resumed_from"] == batch_id and KILL_AFTER <= result["carried"] < TASKS
    assert resumed["batches"][0]["lineage"].startswith(f"resumes {batch_id}")
    assert (await handle.describe()).status == WorkflowExecutionStatus.TERMINATED
