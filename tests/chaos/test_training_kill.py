"""kill -9 the worker watching a training run (two real worker processes, the reference trainer).

The run is still watched (the watch activity resumes on the other worker once its heartbeat times
out), every checkpoint is evaluated exactly once, and nothing is launched twice: one trainer
process, one launch activity, one eval batch per checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import figures
import pytest
from chaos_support import fleet, fleet_spec
from mcp_support import ROOT, node_ids, wait_polling
from temporalio.client import Client, WorkflowHandle

from gymflow.activities import names
from gymflow.activities.names import node_queue, training_queue
from gymflow.activities.training_schema import RunConfig, TrainingRunInput
from gymflow.workflows.training import TrainingRunWorkflow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


async def progress(handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
    try:
        return dict(await asyncio.wait_for(handle.query(TrainingRunWorkflow.progress), 30))
    except Exception:  # a worker just died with the workflow cached: the next query answers
        return {"phase": "?", "checkpoints": []}


async def watcher_pid(handle: WorkflowHandle[Any, Any]) -> int | None:
    """The pid of the worker running the run's watch activity (its identity is pid@host)."""
    for activity in (await handle.describe()).raw_description.pending_activities:
        if activity.activity_type.name == "watch_trainer" and activity.last_worker_identity:
            return int(activity.last_worker_identity.split("@")[0])
    return None


async def activity_counts(client: Client, run_id: str) -> Counter[str]:
    """Activities scheduled over every run of the workflow (it may have continued as new)."""
    counts: Counter[str] = Counter()
    async for execution in client.list_workflows(f'WorkflowId="{run_id}"'):
        history = await client.get_workflow_handle(run_id, run_id=execution.run_id).fetch_history()
        for event in history.events:
            if event.HasField("activity_task_scheduled_event_attributes"):
                counts[event.activity_task_scheduled_event_attributes.activity_type.name] += 1
    return counts


async def test_kill_9_the_watching_worker_nothing_launched_twice(
    client: Client, temporal_address: str, tmp_path: Path
) -> None:
    queue = f"chaos-train-{uuid.uuid4().hex[:8]}"
    run_id = f"chaos-train-{uuid.uuid4().hex[:6]}"
    spec = fleet_spec(tmp_path, temporal_address, queue)
    run = RunConfig.model_validate({
        "run_id": run_id, "env": "math", "baseline": {"policy": "softmax"},
        "dataset": {"uri": "generated", "train": {"n": 64, "seed": 0, "difficulty": [1, 2]},
                    "eval": {"n": 20, "seed": 1000, "difficulty": [1, 2]}},
        "trainer": {
            "backend": "local",
            "command": ["python", "-m", "gymflow.workers.trainers.reference"],
            "workdir": str(ROOT),
        },
        "algorithm": {"steps": 6, "group_size": 4, "tasks_per_step": 4, "lr": 15, "checkpoint_every": 2},
        "eval": {"tasks": 20, "reps": 500}, "limits": {"max_turns": 8},
        "retry": {"node_timeout_s": 5, "max_recoveries": 5},
        "validation": {"smoke_policy": {"policy": "calculator"}, "smoke_rollouts": 2},
    })  # fmt: skip
    started = time.monotonic()
    with fleet(spec, tmp_path / "fleet") as workers:
        await wait_polling(client, [node_queue(queue, node) for node in node_ids(2)])
        handle = await client.start_workflow(TrainingRunWorkflow.run, TrainingRunInput(config=run), id=run_id,
                                             task_queue=training_queue(queue))  # fmt: skip
        deadline = time.monotonic() + 900
        while not ((p := await progress(handle))["phase"] == "watching" and p["checkpoints"]):
            assert time.monotonic() < deadline, f"the run never reached a checkpoint: {p}"
            await asyncio.sleep(0.5)
        pid = await watcher_pid(handle)
        assert pid is not None
        rank = next(r for r, process in workers.processes.items() if process.pid == pid)
        killed_at = time.monotonic()
        workers.kill(rank)
        assert not workers.alive(rank)
        while (after := await watcher_pid(handle)) in (None, pid):  # watched again, by the other worker
            assert time.monotonic() - killed_at < 120, "the watch did not resume"
            await asyncio.sleep(0.5)
        rewatched_s = time.monotonic() - killed_at
        workers.start(rank)
        result = (await asyncio.wait_for(handle.result(), 1200)).model_dump(mode="json")
    elapsed = time.monotonic() - started

    assert result["status"] == "completed", result
    assert after != pid
    checkpoints = [c["report"]["name"] for c in result["checkpoints"]]
    assert checkpoints == ["step-000002", "step-000004", "step-000006"]
    assert all(c["eval"] and c["eval"]["error"] is None and c["eval"]["n_tasks"] == 20 for c in result["checkpoints"])
    batches = Counter([e.id async for e in client.list_workflows(
        f'{names.SA_RUN.name}="{run_id}" AND WorkflowType="{names.BATCH_WORKFLOW}"')])  # fmt: skip
    assert sorted(batches) == sorted([f"{run_id}/smoke", f"{run_id}/eval/baseline"]
                                     + [f"{run_id}/eval/{c}" for c in checkpoints])  # fmt: skip
    assert set(batches.values()) == {1}  # every checkpoint evaluated once
    run_dir = tmp_path / "data" / "training" / run_id
    assert (run_dir / "trainer.log").read_text().count(f"run {run_id}:") == 1  # one trainer process ever
    assert sorted(p.name for p in run_dir.glob("*.json")) == ["policy-calculator.json", "policy-softmax.json",
                                                              "trainer.json"]  # fmt: skip
    counts = await activity_counts(client, run_id)
    assert counts["launch_trainer"] == 1 and counts["start_policy_services"] == 1 and counts["watch_trainer"] >= 1
    manifest = json.loads(Path(result["manifest_uri"].removeprefix("file://")).read_text())
    assert manifest["launch"]["reused"] is False  # the one launch started the trainer
    figures.record(
        "chaos", "kill -9 the worker watching a training run (2 worker processes, reference trainer)",
        checkpoints=len(checkpoints), evals_per_checkpoint=max(batches.values()), trainers_launched=1,
        watch_resumed_s=round(rewatched_s, 1), run_s=round(elapsed, 1),
        final_eval=result["checkpoints"][-1]["eval"]["mean"],
    )  # fmt: skip
