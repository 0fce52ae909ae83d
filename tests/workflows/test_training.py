"""TrainingRunWorkflow on the real dev server with real trainer processes.

The trainers are real subprocesses launched by the local backend: a contract trainer (the SDK:
spec, splits, a GRPO group, reports, finish), one that crashes, and one that just runs until it
is stopped. Storage is a local directory or moto's S3 server.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import boto3
import figures
import pytest
from mcp_support import ROOT, eventually, wait_until
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Replayer

from gymflow.activities import names
from gymflow.activities.trainer_backends import free_port
from gymflow.activities.trainer_jobs import LaunchInput, TrainerActivities
from gymflow.activities.training_schema import PreparedRun, RunConfig, TrainingRunInput
from gymflow.workers.cli.train import start_run
from gymflow.workers.client import DATA_CONVERTER
from gymflow.workers.roles import all_workflows
from gymflow.workers.sandbox_runner import workflow_runner
from gymflow.workers.worker import RunningWorker, running_worker
from gymflow.workflows.training import TrainingRunWorkflow
from support import make_settings

CONTRACT_TRAINER = Path(__file__).with_name("contract_trainer.py")


def config(run_id: str, policy_url: str, **overrides: Any) -> RunConfig:
    """A small math run: 8 train tasks, 6 eval tasks, the contract trainer."""
    values: dict[str, Any] = {
        "run_id": run_id,
        "env": "math",
        "dataset": {
            "uri": "generated",
            "train": {"n": 8, "seed": 1, "difficulty": [1]},
            "eval": {"n": 6, "seed": 2, "difficulty": [1]},
        },
        "trainer": {
            "backend": "local",
            "command": [sys.executable, str(CONTRACT_TRAINER)],
            "workdir": str(ROOT),
            "env": {"CONTRACT_POLICY_URL": policy_url},
            "stop_grace_s": 2,
        },
        "eval": {"tasks": 6, "reps": 200},
        "baseline": {"policy": "null"},
        "validation": {"smoke_policy": {"base_url": policy_url}, "smoke_rollouts": 2, "min_mean_reward": 0.5},
        "limits": {"max_turns": 6},
    }
    values.update(overrides)
    return RunConfig.model_validate(values)


async def start(client: Client, worker: RunningWorker, run: RunConfig, **fields: Any) -> WorkflowHandle[Any, Any]:
    return await start_run(client, run, task_queue=worker.task_queue, out=sys.stderr) if not fields else (
        await client.start_workflow(TrainingRunWorkflow.run, TrainingRunInput(config=run, **fields),
                                    id=run.run_id or "", task_queue=names.training_queue(worker.task_queue))
    )  # fmt: skip


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def s3_worker(client: Client, tmp_path: Path, s3_endpoint: str, aws: None) -> AsyncIterator[RunningWorker]:
    async with running_worker(client, make_settings(tmp_path, s3_endpoint_url=s3_endpoint)) as running:
        yield running


async def failure(handle: WorkflowHandle[Any, Any]) -> BaseException | None:
    with pytest.raises(WorkflowFailureError) as info:
        await asyncio.wait_for(handle.result(), 120)
    return info.value.cause


@pytest.mark.heavy
async def test_a_run_validates_launches_evaluates_and_records_lineage(
    client: Client, s3_worker: RunningWorker, calculator_policy_url: str, s3_endpoint: str, tmp_path: Path
) -> None:
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="runs")
    run = config(run_id(), calculator_policy_url, storage="s3://runs/gymflow",
                 trainer={"command": [sys.executable, str(CONTRACT_TRAINER)], "workdir": str(ROOT),
                          "env": {"CONTRACT_POLICY_URL": calculator_policy_url, "CONTRACT_STEPS": "40"}})  # fmt: skip
    # A short watch slice and a small history budget: the run continues as new while it watches.
    handle = await start(client, s3_worker, run, watch_slice_s=1, continue_as_new_events=60)
    result = (await asyncio.wait_for(handle.result(), 240)).model_dump(mode="json")
    assert result["status"] == "completed" and result["steps"] == 40, result
    (checkpoint,) = result["checkpoints"]
    ev = checkpoint["eval"]
    assert checkpoint["report"]["name"] == "step-40" and ev["n_tasks"] == 6 and ev["infra_failed"] == 0
    assert ev["mean"] == 1.0 and ev["baseline_mean"] == 0.0 and ev["probability_of_improvement"] == 1.0
    assert ev["difference_low"] == ev["difference_high"] == 1.0

    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    manifest = json.loads(s3.get_object(Bucket="runs", Key=f"gymflow/runs/{run.run_id}/manifest.json")["Body"].read())
    assert manifest["status"] == "completed" and manifest["checkpoints"][0]["eval"]["mean"] == 1.0
    digests = manifest["digests"]
    assert all(len(digests[k]) == 64 for k in ("config", "dataset", "env"))
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="runs", Prefix="gymflow/")["Contents"]}
    assert f"gymflow/datasets/{digests['dataset']}/train.jsonl" in keys
    assert any(k.startswith(f"gymflow/bundles/{digests['env']}/") and k.endswith(".tar.gz") for k in keys)
    assert f"gymflow/runs/{run.run_id}/checkpoints/step-40.txt" in keys

    description = await handle.describe()
    assert description.typed_search_attributes.get(names.SA_STATUS) == "completed"
    assert description.typed_search_attributes.get(names.SA_RUN) == run.run_id
    memo = await description.memo()
    assert memo["dataset_digest"] == digests["dataset"] and memo["last_eval"]["probability_of_improvement"] == 1.0
    progress = await handle.query(TrainingRunWorkflow.progress)
    assert progress["runs"] >= 1, "the run should have continued as new"
    assert [h["reward"] for h in progress["history"]][:1] == [1.0]  # the retried step-1 report applied once

    log = tmp_path / "data" / "training" / str(run.run_id) / "trainer.log"
    assert log.read_text().count("started:") == 1

    async def listed() -> list[str]:  # visibility is eventually consistent
        return [e.id async for e in client.list_workflows(f'{names.SA_RUN.name}="{run.run_id}"')]

    children = await eventually(listed, lambda ids: len([c for c in ids if "/eval/" in c or c.endswith("/smoke")]) >= 3)
    batches = sorted(c for c in children if "/groups-" not in c and c != run.run_id)
    assert batches == [f"{run.run_id}/eval/baseline", f"{run.run_id}/eval/step-40", f"{run.run_id}/smoke"]
    assert not list((tmp_path / "data" / "training" / str(run.run_id)).glob("*.exit")) or all(
        p.read_text().strip() == "0" for p in (tmp_path / "data" / "training" / str(run.run_id)).glob("*.exit")
    )
    # Every run of the workflow (it continued as new) replays deterministically against this code.
    replayer = Replayer(workflows=all_workflows(), data_converter=DATA_CONVERTER, workflow_runner=workflow_runner())
    runs = [
        client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id),
        client.get_workflow_handle(handle.id),
    ]
    for each in runs:
        await replayer.replay_workflow(await each.fetch_history())


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("env", {"env": "no-such-env"}),
        ("dataset", {"dataset": {"uri": "/no/such/dataset.jsonl"}}),
        ("trainer.resources.cpus", {"trainer": {"resources": {"cpus": "4096+"}}}),
        ("eval.tasks", {"eval": {"tasks": 50}}),
        ("baseline.policy", {"baseline": {"policy": "oracle"}}),
    ],
)
async def test_a_bad_config_fails_before_anything_is_launched(
    client: Client,
    worker: RunningWorker,
    calculator_policy_url: str,
    field: str,
    change: dict[str, Any],
) -> None:
    run = config(run_id(), calculator_policy_url, **change)
    handle = await start(client, worker, run)
    cause = await failure(handle)
    assert isinstance(cause, ApplicationError) and cause.non_retryable and f"{field}" in cause.message, cause
    assert not (worker.settings.data_dir / "training" / str(run.run_id)).exists()  # no trainer, no service
    description = await handle.describe()
    assert description.typed_search_attributes.get(names.SA_STATUS) == "failed"


async def test_unreachable_storage_fails_before_anything_is_launched(
    client: Client, calculator_policy_url: str, tmp_path: Path, aws: None
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    async with running_worker(client, make_settings(tmp_path, s3_endpoint_url=closed)) as worker:
        run = config(run_id(), calculator_policy_url, storage="s3://nowhere/runs")
        cause = await failure(await start(client, worker, run))
    assert isinstance(cause, ApplicationError) and cause.message.startswith("storage: cannot write"), cause
    assert not (tmp_path / "data" / "training" / str(run.run_id)).exists()


async def test_every_problem_of_a_config_is_named_in_one_failure(
    client: Client, worker: RunningWorker, calculator_policy_url: str, tmp_path: Path
) -> None:
    """Three mistakes in three checks (a policy, the dataset, the storage): one try names all three."""
    run = config(
        run_id(), calculator_policy_url, baseline={"policy": "oracle"},
        dataset={"uri": str(tmp_path / "no-dataset")}, storage="file:///proc/gymflow-nowhere",
    )  # fmt: skip
    cause = await failure(await start(client, worker, run))
    assert isinstance(cause, ApplicationError) and cause.non_retryable, cause
    for field in ("baseline.policy: math has no baseline policy 'oracle'", "dataset: ", "storage: cannot write"):
        assert field in cause.message, cause.message
    assert not (worker.settings.data_dir / "training" / str(run.run_id)).exists()


@pytest.mark.heavy
async def test_a_baseline_checkpoint_the_trainer_never_reports_fails_the_run_saying_so(
    client: Client, worker: RunningWorker, calculator_policy_url: str
) -> None:
    run = config(run_id(), calculator_policy_url, baseline={"checkpoint": "step-000000"})
    cause = await failure(await start(client, worker, run))
    assert isinstance(cause, ApplicationError) and cause.non_retryable, cause
    assert "baseline.checkpoint: the trainer finished without reporting checkpoint 'step-000000'" in cause.message


@pytest.mark.heavy
async def test_a_trainer_that_crashes_fails_the_run_with_its_last_log_lines(
    client: Client, worker: RunningWorker, calculator_policy_url: str
) -> None:
    script = "import sys\nfor i in range(40): print(f'warming up {i}')\nsys.exit('CUDA error: out of memory')"
    run = config(run_id(), calculator_policy_url, baseline={"base_url": calculator_policy_url},
                 validation={"smoke_rollouts": 0},
                 trainer={"command": [sys.executable, "-c", script], "workdir": str(ROOT)})  # fmt: skip
    handle = await start(client, worker, run)
    cause = await failure(handle)
    assert isinstance(cause, ApplicationError) and cause.type == "TrainerFailed", cause
    assert "exit code 1" in cause.message and "CUDA error: out of memory" in cause.message
    assert "warming up 39" in cause.message and "warming up 5\n" not in cause.message  # the last lines only
    assert (await handle.describe()).typed_search_attributes.get(names.SA_STATUS) == "failed"


def _sleeper(marker: Path) -> list[str]:
    script = f"import time\nopen({str(marker)!r}, 'a').write('launched\\n')\nprint('up', flush=True)\ntime.sleep(600)"
    return [sys.executable, "-c", script]


def _trainer_pid(data_dir: Path, run: str) -> int:
    return int(json.loads((data_dir / "training" / run / "trainer.json").read_text())["pid"])


@pytest.mark.heavy
async def test_cancel_stops_the_trainer_within_10_s_and_cancels_children(
    client: Client, worker: RunningWorker, calculator_policy_url: str, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # the baseline eval keeps retrying: a child in flight
    run = config(run_id(), calculator_policy_url, baseline={"base_url": dead}, validation={"smoke_rollouts": 0},
                 trainer={"command": _sleeper(tmp_path / "marker"), "workdir": str(ROOT)})  # fmt: skip
    handle = await start(client, worker, run)
    data_dir = tmp_path / "data"
    await wait_until((data_dir / "training" / str(run.run_id) / "trainer.json").is_file, timeout_s=60,
                     what="the trainer launched")  # fmt: skip
    pid = _trainer_pid(data_dir, str(run.run_id))
    baseline = client.get_workflow_handle(f"{run.run_id}/eval/baseline")
    deadline = time.monotonic() + 60
    while (await handle.query(TrainingRunWorkflow.progress))["phase"] != "watching":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    await wait_until(lambda: Path(f"/proc/{pid}").exists(), what="the trainer running")
    await asyncio.sleep(0)  # the baseline batch was started in the same workflow task as the watch
    cancelled = time.monotonic()
    await handle.cancel()
    await wait_until(lambda: not _running(pid), timeout_s=10, what="the trainer gone within 10 s")
    stopped_after = time.monotonic() - cancelled
    cause = await failure(handle)
    assert isinstance(cause, CancelledError), cause
    assert (await baseline.describe()).status == WorkflowExecutionStatus.CANCELED  # cancelled, not terminated
    assert (await handle.describe()).typed_search_attributes.get(names.SA_STATUS) == "cancelled"
    assert stopped_after < 10
    figures.record("training", "cancel a run", trainer_gone_s=round(stopped_after, 2), baseline_eval="cancelled")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in {"Z", "X"}


@pytest.mark.heavy
async def test_launching_the_same_run_twice_starts_one_trainer(
    client: Client, worker: RunningWorker, calculator_policy_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    run = config(run_id(), calculator_policy_url, baseline={"base_url": calculator_policy_url},
                 validation={"smoke_rollouts": 0},
                 trainer={"command": _sleeper(marker), "workdir": str(ROOT)})  # fmt: skip
    first = await start(client, worker, run)
    second = await start(client, worker, run)  # the CLI's launch of the same run id attaches
    assert first.id == second.id == run.run_id
    await wait_until(marker.is_file, timeout_s=60, what="the trainer started")
    # The launch activity itself, retried (a worker died after starting the trainer): same trainer.
    progress = await first.query(TrainingRunWorkflow.progress)
    deadline = time.monotonic() + 60
    while progress["launch"] is None:
        assert time.monotonic() < deadline
        progress = await first.query(TrainingRunWorkflow.progress)
    activities = TrainerActivities(data_dir=tmp_path / "data", temporal_address="unused:1", namespace="default")
    again = await ActivityEnvironment().run(
        activities.launch,
        LaunchInput(run_id=str(run.run_id), config=run, prepared=PreparedRun.model_validate(progress["prepared"])),
    )
    assert again.reused and again.pid == progress["launch"]["pid"]
    await first.cancel()
    await failure(first)
    assert marker.read_text() == "launched\n"
