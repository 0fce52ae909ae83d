"""The ways people reach a rollout: the temporal CLI with JSON input, search attributes in the
Web UI, the `gymflow demo` command — and what must never show up there (API keys)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import ROLLOUT_WORKFLOW, SA_ENV, SA_TASK
from gymflow.activities.schema import RolloutInput, RolloutResult
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.workers.sdk.client import run_rollout, start_rollout
from gymflow.workers.servers.policy import AppServer, build_app
from gymflow.workers.servers.temporal import temporal_binary
from gymflow.workers.worker import RunningWorker, running_worker
from support import make_settings


def temporal_cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [temporal_binary(), *args, "--address", address], capture_output=True, text=True, timeout=60, check=True
    )


async def test_rollout_started_from_temporal_cli(
    client: Client, worker: RunningWorker, temporal_address: str, calculator_policy_url: str
) -> None:
    task = generate_tasks(1, seed=5)[0]
    payload = {"env": "math", "task": task.model_dump(mode="json"), "model": {"base_url": calculator_policy_url}}
    workflow_id = f"cli-{uuid.uuid4().hex[:8]}"
    temporal_cli(
        temporal_address, "workflow", "start", "--type", ROLLOUT_WORKFLOW, "--task-queue", worker.task_queue,
        "--workflow-id", workflow_id, "--input", json.dumps(payload),
    )  # fmt: skip
    handle = client.get_workflow_handle(workflow_id, result_type=RolloutResult)
    result = await handle.result()
    assert result.reward is not None and result.reward.total == 1.0
    assert result.tool_calls >= 1
    # Started without search attributes: the workflow set them, GymflowTask included.
    attributes = (await handle.describe()).typed_search_attributes
    assert attributes.get(SA_TASK) == task.id and attributes.get(SA_ENV) == "math"
    # The finished rollout's details and result lead with its outcome.
    metadata = await handle.query("__temporal_workflow_metadata")
    assert metadata.current_details.startswith("reward 1.000 · final_answer · "), metadata
    completed = (await handle.fetch_history()).events[-1].workflow_execution_completed_event_attributes
    assert completed.result.payloads[0].data.startswith(b'{"reward":{"total":1.0')


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"env": "math"}, "task"),
        ({"env": "math", "task": {"id": "t1"}}, "task.prompt"),
        ({"env": "math", "task": {"id": "t1", "prompt": "hi"}, "limits": {"max_turns": "many"}}, "limits.max_turns"),
        ({"env": "math", "task": {"id": "t1", "prompt": "hi"}, "modle": {}}, "modle"),
    ],
)
async def test_invalid_cli_input_fails_workflow_at_once(
    client: Client, worker: RunningWorker, temporal_address: str, payload: dict[str, object], field: str
) -> None:
    workflow_id = f"bad-{uuid.uuid4().hex[:8]}"
    temporal_cli(
        temporal_address, "workflow", "start", "--type", ROLLOUT_WORKFLOW, "--task-queue", worker.task_queue,
        "--workflow-id", workflow_id, "--input", json.dumps(payload),
    )  # fmt: skip
    handle = client.get_workflow_handle(workflow_id)
    with pytest.raises(WorkflowFailureError) as info:
        await asyncio.wait_for(handle.result(), timeout=20)
    cause = info.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "InvalidInput" and cause.non_retryable
    assert field in cause.message
    events = [e for e in (await handle.fetch_history()).events]
    assert not any(e.HasField("workflow_task_failed_event_attributes") for e in events)  # no retry loop


async def test_search_attributes_find_rollouts(
    client: Client, worker: RunningWorker, calculator_policy_url: str
) -> None:
    batch = f"batch-{uuid.uuid4().hex[:8]}"
    tasks = generate_tasks(2, seed=9)
    model = ModelConfig(base_url=calculator_policy_url, model="calc-baseline")
    await asyncio.gather(
        *(
            run_rollout(
                client, RolloutInput(env="math", task=t, model=model, batch_id=batch), task_queue=worker.task_queue
            )
            for t in tasks
        )
    )
    query = (
        f'GymflowEnv="math" AND GymflowBatch="{batch}" AND GymflowStatus="completed" '
        f'AND GymflowReward=1.0 AND GymflowModel="calc-baseline" AND GymflowTask IN ("{tasks[0].id}", "{tasks[1].id}")'
    )
    deadline = time.monotonic() + 15
    # Visibility is eventually consistent and has no change feed: poll it, with a deadline.
    while (count := (await client.count_workflows(query)).count) < 2 and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    assert count == 2


class HeaderRecorder:
    """ASGI wrapper that records the Authorization header of every request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.authorization: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            self.authorization.append(headers.get(b"authorization", b"").decode())
        await self.app(scope, receive, send)


async def test_api_key_is_used_but_never_in_history(client: Client, tmp_path: Path) -> None:
    secret = f"sk-test-{uuid.uuid4().hex}"
    recorder = HeaderRecorder(build_app(CalculatorPolicy()))
    settings = make_settings(tmp_path, model_api_key=secret)
    async with AppServer(recorder) as server, running_worker(client, settings):
        task = generate_tasks(1, seed=21)[0]
        handle = await start_rollout(
            client, RolloutInput(env="math", task=task, model=ModelConfig(base_url=server.url)),
            task_queue=settings.task_queue,
        )  # fmt: skip
        result = await handle.result()
    assert result.reward is not None and result.reward.total == 1.0
    assert recorder.authorization and all(h == f"Bearer {secret}" for h in recorder.authorization)
    history = (await handle.fetch_history()).to_json()
    assert secret not in history and secret[8:] not in history


@pytest.mark.heavy
def test_demo_command_runs_a_batch(temporal_address: str, tmp_path: Path) -> None:
    """`gymflow demo` as a user runs it (against the test server): 16 rollouts, all solved."""
    queue = f"demo-{uuid.uuid4().hex[:8]}"
    out = subprocess.run(
        [sys.executable, "-m", "gymflow.workers.cli", "demo", "--address", temporal_address,
         "--task-queue", queue, "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["summary"]["rollouts"] == 16 and report["summary"]["completed"] == 16
    assert report["summary"]["mean_reward"] == 1.0
    for row in report["rollouts"]:
        shown = temporal_cli(temporal_address, "workflow", "show", "--workflow-id", row["workflow_id"], "-o", "json")
        kinds = [
            e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
            for e in json.loads(shown.stdout)["events"]
            if "activityTaskScheduledEventAttributes" in e
        ]
        assert kinds.count("play_turn") >= 2  # math fuses its turns: a tool turn, then the answer
