"""crm-support-llm: the customer played by a "model" over real HTTP (the scripted customer behind an
OpenAI-compatible endpoint), an endpoint that fails, and `gymflow eval` of both desks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from temporalio.client import Client
from tls_support import free_port

from gymflow.activities.schema import RetrySettings
from gymflow.envs.builtin.crm_support.env import CrmSupportLlmEnv
from gymflow.envs.builtin.crm_support.policy import CustomerPolicy, ReferenceAgent
from gymflow.envs.builtin.crm_support.tasks import generate_tasks
from gymflow.envs.contract import TerminationReason
from gymflow.workers.servers.policy import AppServer, PolicyServer
from gymflow.workers.worker import RunningWorker
from support import play


async def test_a_model_plays_the_customer_over_http(
    client: Client, worker: RunningWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with PolicyServer(CustomerPolicy()) as user:
        monkeypatch.setenv("GYMFLOW_USER_URL", user.url)
        for task in generate_tasks(5, seed=1):  # one task of each family, on another database
            result = await play(client, worker, ReferenceAgent(), env="crm-support-llm", task=task)
            assert result.termination == TerminationReason.FINAL_ANSWER and not result.infra_failed
            assert result.reward is not None and result.reward.total == 1.0, (task.metadata, result.reward)


def broken_user(mode: str, calls: list[int]) -> Starlette:
    async def completions(request: Request) -> Response:
        await request.body()
        calls.append(1)
        if mode == "500":
            return PlainTextResponse("Internal Server Error", 500)
        return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": None}}]})

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


@pytest.mark.heavy  # ~12 s each (3 attempts x 3 inits, with back-off); the refund desk tests both modes by default
@pytest.mark.parametrize("mode", ["500", "garbage"])
async def test_a_failing_customer_endpoint_leaves_the_rollout_infra_failed(
    client: Client, worker: RunningWorker, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    calls: list[int] = []
    async with AppServer(broken_user(mode, calls)) as user:
        monkeypatch.setenv("GYMFLOW_USER_URL", user.url)
        result = await play(client, worker, ReferenceAgent(), env="crm-support-llm", task=generate_tasks(1)[0])
    assert result.infra_failed and result.reward is None, "never scored: not the agent's 0"
    assert f"user simulator failed {CrmSupportLlmEnv.user.attempts} time(s)" in (result.error or "")
    # Its attempts per reply; the desk is replayable, so the rollout re-inits it (a fresh copy, the
    # tool calls replayed) and asks again, up to its recoveries: bounded, then infra-failed.
    assert len(calls) == CrmSupportLlmEnv.user.attempts * (1 + RetrySettings().max_recoveries)


def test_without_a_user_endpoint_the_llm_desk_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GYMFLOW_USER_URL", raising=False)
    problem = CrmSupportLlmEnv.unavailable()
    assert problem is not None and "GYMFLOW_USER_URL is not set" in str(problem)
    assert "gymflow policy serve crm-support --policy customer" in str(problem)


def _eval(env: str, temporal_address: str, tmp_path: Path, extra_env: dict[str, str]) -> dict[str, object]:
    out_dir = tmp_path / f"report-{env}"
    command = [
        sys.executable, "-m", "gymflow.workers.cli", "eval", env, "--policy", "reference", "--baseline", "null",
        "--n", "10", "--reps", "200", "--out", str(out_dir), "--json",
        "--address", temporal_address, "--task-queue", f"eval-{uuid.uuid4().hex[:8]}",
    ]  # fmt: skip
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False, env={**os.environ, **extra_env}
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report: dict[str, object] = json.loads((out_dir / "report.json").read_text())
    return report


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"the customer endpoint did not come up: {process.stderr.read() if process.stderr else b''!r}"
                ) from None
            time.sleep(0.1)


@pytest.mark.slow  # two CLI evals with baselines, one with the customer served by `gymflow policy serve`
def test_eval_crm_support_reference_vs_null_with_both_users(temporal_address: str, tmp_path: Path) -> None:
    report = _eval("crm-support", temporal_address, tmp_path, {})
    assert report["policy"]["mean"]["value"] == 1.0 and report["baseline"]["mean"]["value"] == 0.0  # type: ignore[index]
    port = free_port()
    serve = [sys.executable, "-m", "gymflow.workers.cli", "policy", "serve", "crm-support", "--policy", "customer"]
    user = subprocess.Popen([*serve, "--port", str(port)], stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        _wait_for_port(port, user)
        url = f"http://127.0.0.1:{port}/v1"
        report = _eval("crm-support-llm", temporal_address, tmp_path, {"GYMFLOW_USER_URL": url})
    finally:
        user.terminate()
        user.wait(timeout=30)
    assert report["policy"]["mean"]["value"] == 1.0 and report["baseline"]["mean"]["value"] == 0.0  # type: ignore[index]
    assert report["policy"]["infra_failed"] == 0 and report["policy"]["completed"] == 10  # type: ignore[index]
