"""GymflowEnv and a final GymflowStatus on every workflow gymflow runs, however it ends (the suite
also checks the whole server at the end of the session, tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from statuses import SELF_TEST_NAMESPACE, scan_statuses
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ApplicationError, CancelledError, TimeoutError, TimeoutType
from temporalio.workflow import ContinueAsNewError

from gymflow.activities import names
from gymflow.activities.model import ModelConfig
from gymflow.activities.names import GROUP_WORKFLOW, ROLLOUT_WORKFLOW, SA_BATCH, SA_ENV, SA_MODEL, SA_STATUS
from gymflow.activities.schema import RolloutInput
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.contract import Task
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.worker import RunningWorker
from gymflow.workflows import status
from support import temporal_cli


def test_final_status_of_every_ending() -> None:
    assert status.final_status(None) is names.Status.COMPLETED
    assert status.final_status(asyncio.CancelledError()) is names.Status.CANCELLED
    assert status.final_status(CancelledError("x")) is names.Status.CANCELLED
    assert status.final_status(ApplicationError("bad", type="InvalidInput")) is names.Status.FAILED
    assert status.final_status(TimeoutError("t", type=TimeoutType.START_TO_CLOSE, last_heartbeat_details=[])) is (
        names.Status.FAILED
    )
    # Nothing to write: the next run closes; the task is retried; the run was evicted.
    assert status.final_status(type("ContinueAsNew", (ContinueAsNewError,), {})()) is None
    assert status.final_status(RuntimeError("bug")) is None
    assert status.final_status(GeneratorExit()) is None


def test_start_attributes_never_carry_a_status() -> None:
    pairs = names.start_attributes("math", model="m", batch="b", task=None, run="")
    expected = [("GymflowEnv", "math"), ("GymflowModel", "m"), ("GymflowBatch", "b")]
    assert [(p.key.name, p.value) for p in pairs] == expected


async def failed_with_status(client: Client, workflow_id: str) -> tuple[str, str | None, str | None]:
    handle = client.get_workflow_handle(workflow_id)
    with pytest.raises(WorkflowFailureError) as info:
        await asyncio.wait_for(handle.result(), timeout=30)
    cause = info.value.cause
    assert isinstance(cause, ApplicationError)
    described = await handle.describe()
    assert described.status == WorkflowExecutionStatus.FAILED
    attrs = described.typed_search_attributes
    return cause.message, attrs.get(SA_ENV), attrs.get(SA_STATUS)


@pytest.mark.parametrize(("env", "error"), [("no-such-env", "unknown env"), ("missing/env.yaml", "not found")])
async def test_rollout_failing_at_start_closes_as_failed(
    client: Client, worker: RunningWorker, env: str, error: str
) -> None:
    rollout = RolloutInput(env=env, task=Task(id="t", prompt="p"), model=ModelConfig(base_url="http://127.0.0.1:9/v1"))
    handle = await start_rollout(client, rollout, task_queue=worker.task_queue)
    message, sa_env, sa_status = await failed_with_status(client, handle.id)
    assert error in message.lower()
    assert (sa_env, sa_status) == (env, "failed")


async def test_rollout_started_bare_from_the_cli_gets_its_env_and_a_final_status(
    client: Client, worker: RunningWorker, temporal_address: str
) -> None:
    workflow_id = f"bare-{uuid.uuid4().hex[:8]}"
    payload = {"env": "no-such-env", "task": {"id": "t", "prompt": "p"}}
    temporal_cli(
        temporal_address, "workflow", "start", "--type", ROLLOUT_WORKFLOW, "--task-queue", worker.task_queue,
        "--workflow-id", workflow_id, "--input", json.dumps(payload),
    )  # fmt: skip
    _, sa_env, sa_status = await failed_with_status(client, workflow_id)
    assert (sa_env, sa_status) == ("no-such-env", "failed")


async def test_group_started_from_the_cli_carries_its_env_and_closes_completed(
    client: Client, worker: RunningWorker, temporal_address: str, calculator_policy_url: str
) -> None:
    task = generate_tasks(1, seed=11)[0]
    payload = {
        "rollout": {"env": "math", "task": task.model_dump(mode="json"), "model": {"base_url": calculator_policy_url}},
        "n": 2,
    }
    workflow_id = f"cli-group-{uuid.uuid4().hex[:8]}"
    temporal_cli(
        temporal_address, "workflow", "start", "--type", GROUP_WORKFLOW, "--task-queue", worker.task_queue,
        "--workflow-id", workflow_id, "--input", json.dumps(payload),
    )  # fmt: skip
    handle = client.get_workflow_handle(workflow_id)
    await asyncio.wait_for(handle.result(), timeout=60)
    attrs = (await handle.describe()).typed_search_attributes
    assert (attrs.get(SA_ENV), attrs.get(SA_MODEL), attrs.get(SA_STATUS)) == ("math", "default", "completed")
    for child in (f"{workflow_id}/s0", f"{workflow_id}/s1"):
        child_attrs = (await client.get_workflow_handle(child).describe()).typed_search_attributes
        assert (child_attrs.get(SA_ENV), child_attrs.get(SA_STATUS)) == ("math", "completed")


async def test_invalid_batch_closes_failed_with_its_env(
    client: Client, worker: RunningWorker, temporal_address: str
) -> None:
    workflow_id = f"bad-batch-{uuid.uuid4().hex[:8]}"
    temporal_cli(
        temporal_address, "workflow", "start", "--type", "BatchRolloutWorkflow", "--task-queue", worker.task_queue,
        "--workflow-id", workflow_id, "--input", json.dumps({"env": "math"}),
    )  # fmt: skip
    message, sa_env, sa_status = await failed_with_status(client, workflow_id)
    assert "needs `tasks` or a `dataset`" in message
    assert (sa_env, sa_status) == ("math", "failed")
    attrs = (await client.get_workflow_handle(workflow_id).describe()).typed_search_attributes
    assert attrs.get(SA_BATCH) == workflow_id


async def test_the_session_scan_flags_a_closed_workflow_tagged_running(client: Client) -> None:
    """The end-of-session check can fail: a rollout someone tagged "running", then terminated."""
    config = client.service_client.config
    scoped = await Client.connect(config.target_host, namespace=SELF_TEST_NAMESPACE)
    workflow_id = f"stale-{uuid.uuid4().hex[:8]}"
    stale = TypedSearchAttributes([SearchAttributePair(SA_ENV, "math"), SearchAttributePair(SA_STATUS, "running")])
    queue = f"nobody-{uuid.uuid4().hex}"
    handle = await scoped.start_workflow(
        ROLLOUT_WORKFLOW, {"env": "math"}, id=workflow_id, task_queue=queue, search_attributes=stale
    )
    assert not (await scan_statuses(scoped)).problems  # running and tagged running: not (yet) a lie
    await handle.terminate("test")
    deadline = time.monotonic() + 20
    while not any(p.startswith(workflow_id) for p in (await scan_statuses(scoped)).problems):
        assert time.monotonic() < deadline, "the scan never flagged the stale status"
        await asyncio.sleep(0.2)
