"""Harness rollouts at their edges: bad requests get the API's own errors, budgets and cancellation stop
the program (and kill it), a program that cannot start is an infra failure, never a score."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness_support import (
    AGENTS,
    FileTaskPolicy,
    agent_python,
    file_task,
    harness_env_file,
    processes_with,
    wait_for,
)
from temporalio.client import Client, WorkflowFailureError

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RetrySettings, RolloutInput, RolloutLimits
from gymflow.envs.contract import TerminationReason
from gymflow.workers.client import DATA_CONVERTER
from gymflow.workers.sdk.client import run_rollout, start_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker, running_worker
from support import make_settings

SLEEPER = [sys.executable, "-c", "import sys, time; time.sleep(600)"]


@pytest.fixture(scope="module")
async def upstream() -> PolicyServer:
    async with PolicyServer(FileTaskPolicy(), record_requests=True) as server:
        yield server


def rollout(env: Path, upstream: PolicyServer, **limits: int) -> RolloutInput:
    return RolloutInput(
        env=str(env),
        task=file_task(0),
        model=ModelConfig(base_url=upstream.url),
        limits=RolloutLimits(**limits),
    )


async def test_a_malformed_request_gets_the_apis_own_error(
    client: Client, worker: RunningWorker, upstream: PolicyServer, tmp_path: Path
) -> None:
    """The real clients raise their own error types from the gateway's answers: the programs end at once."""
    answered = len(upstream.requests)

    async def malformed(script: str) -> dict[str, Any]:
        directory = tmp_path / script
        directory.mkdir()
        env = harness_env_file(directory, [str(agent_python()), str(AGENTS / script), "--malformed"])
        result = await run_rollout(client, rollout(env, upstream), task_queue=worker.task_queue)
        assert result.termination is TerminationReason.AGENT_EXIT and result.turns == 0
        assert result.program is not None and result.program.exit_code == 3, result.program
        error: dict[str, Any] = json.loads(result.program.output.strip().splitlines()[-1])
        assert error["status"] == 400
        return error["body"]

    openai_error, anthropic_error = await asyncio.gather(malformed("openai_agent.py"), malformed("anthropic_agent.py"))
    # The openai client hands over the body's "error" object; anthropic's the body {"type": "error", "error": ...}.
    assert openai_error["type"] == "invalid_request_error" and "messages" in openai_error["message"]
    assert anthropic_error["type"] == "error" and anthropic_error["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in anthropic_error["error"]["message"]
    assert len(upstream.requests) == answered  # refused at the gateway: nothing reached the model


async def test_tokens_and_routes_are_checked_in_each_apis_shape(worker: RunningWorker) -> None:
    gateway = worker.gateway
    base = gateway.url.removesuffix("/v1")
    admitted = gateway.admit(workflow_id=f"no-such-rollout-{uuid.uuid4().hex[:6]}", run_id="", start=0)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(timeout=30) as http:
        wrong = await http.post(f"{base}/v1/chat/completions", json=chat, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        wrong = await http.post(f"{base}/r/nope/v1/messages", json={}, headers={"x-api-key": "nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        assert wrong.json()["type"] == "error"
        mixed = await http.post(
            f"{admitted.openai_base_url}/chat/completions", json=chat, headers={"authorization": "Bearer other"}
        )
        assert mixed.status_code == 401
        garbage = await http.post(
            f"{admitted.openai_base_url}/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert garbage.status_code == 400 and garbage.json()["error"]["type"] == "invalid_request_error"
        models = await http.get(f"{admitted.openai_base_url}/models")
        assert models.status_code == 200 and models.json()["data"][0]["id"]
        assert (await http.get(f"{base}/v1/models", headers={"authorization": "Bearer nope"})).status_code == 401
        nowhere = await http.post(f"{admitted.openai_base_url}/embeddings", json={})
        assert nowhere.status_code == 404 and "no route" in nowhere.json()["error"]["message"]
        over = await http.post(f"{admitted.openai_base_url}/chat/completions", json=chat)
        assert over.status_code == 400 and "rollout is over" in over.json()["error"]["message"]
        gateway.revoke(admitted.token)
        revoked = await http.post(f"{admitted.openai_base_url}/chat/completions", json=chat)
        assert revoked.status_code == 401


async def test_the_call_budget_stops_the_program(
    client: Client, worker: RunningWorker, upstream: PolicyServer, tmp_path: Path
) -> None:
    env = harness_env_file(tmp_path, [str(agent_python()), str(AGENTS / "openai_agent.py")])
    answered = len(upstream.requests)
    result = await run_rollout(client, rollout(env, upstream, max_turns=1), task_queue=worker.task_queue)
    assert result.termination is TerminationReason.MAX_TURNS, result
    assert result.turns == 1 and len(upstream.requests) - answered == 1
    assert result.reward is not None and result.reward.total == 1.0  # the file was written before the stop
    assert result.program is not None and result.program.exit_code is None  # stopped, not exited


async def test_wall_time_stops_the_program_and_kills_it(
    client: Client, worker: RunningWorker, upstream: PolicyServer, tmp_path: Path
) -> None:
    marker = f"sleeper-{uuid.uuid4().hex}"
    env = harness_env_file(tmp_path, [*SLEEPER, marker], timeout_s=3)
    result = await run_rollout(client, rollout(env, upstream), task_queue=worker.task_queue)
    assert result.termination is TerminationReason.TIME_BUDGET and not result.infra_failed
    assert result.reward is not None and result.reward.total == 0.0
    assert processes_with(marker) == []


async def test_a_cancelled_rollout_kills_its_program_and_frees_its_workspace(
    client: Client, worker: RunningWorker, upstream: PolicyServer, tmp_path: Path
) -> None:
    marker = f"sleeper-{uuid.uuid4().hex}"
    env = harness_env_file(tmp_path, [*SLEEPER, marker])
    handle = await start_rollout(client, rollout(env, upstream), task_queue=worker.task_queue)
    await wait_for(lambda: bool(processes_with(marker)), what="the program to start")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    await wait_for(lambda: not processes_with(marker), timeout_s=30, what="the program to be killed")
    await wait_for(lambda: not worker.env.held(), timeout_s=30, what="the workspace to be released")


async def test_a_program_that_cannot_start_is_an_infra_failure(
    client: Client, worker: RunningWorker, upstream: PolicyServer, tmp_path: Path
) -> None:
    env = harness_env_file(tmp_path, ["no-such-agent-program", "--go"])
    result = await run_rollout(client, rollout(env, upstream), task_queue=worker.task_queue)
    assert result.infra_failed and result.termination is TerminationReason.ENV_ERROR
    assert result.reward is None and "no-such-agent-program" in (result.error or "")


@pytest.mark.slow  # a rolling restart under a program
async def test_a_worker_shutting_down_under_a_program_moves_the_rollout(
    client: Client, temporal_address: str, upstream: PolicyServer, tmp_path: Path
) -> None:
    """A graceful stop of the worker running the program (a rolling restart) kills the program; the rollout
    recovers on another worker and starts the program again there, which finishes it."""
    marker = f"napper-{uuid.uuid4().hex}"
    env = harness_env_file(tmp_path, [sys.executable, "-c", "import time; time.sleep(2)", marker])
    queue = f"test-{uuid.uuid4().hex[:10]}"
    other = await Client.connect(temporal_address, data_converter=DATA_CONVERTER)  # one worker set per client
    async with contextlib.AsyncExitStack() as staying:
        async with running_worker(client, make_settings(tmp_path / "a", task_queue=queue)):
            # The stale release on the stopped node's queue waits node_timeout_s for a worker (none comes back here).
            moving = rollout(env, upstream).model_copy(update={"retry": RetrySettings(node_timeout_s=3)})
            handle = await start_rollout(client, moving, task_queue=queue)
            await wait_for(lambda: bool(processes_with(marker)), what="the program to start")
            await staying.enter_async_context(running_worker(other, make_settings(tmp_path / "b", task_queue=queue)))
        assert not processes_with(marker)  # killed with its worker's shutdown
        result = await handle.result()
    assert result.termination is TerminationReason.AGENT_EXIT and not result.infra_failed, result
    assert result.recoveries == 1 and result.program is not None and result.program.starts == 2
    assert result.program.exit_code == 0
