"""kill -9 of a crm-support worker after the refund was written, while the customer's last reply is
being generated: the rollout moves to a new worker, whose fresh copy of the database gets the
recorded tool calls again, and the reward finds the refund exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from mcp_support import wait_until
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import Client
from users_support import start_users_worker

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RetrySettings, RolloutInput
from gymflow.envs.builtin.crm_support.policy import CustomerPolicy, ReferenceAgent
from gymflow.envs.builtin.crm_support.tasks import generate_tasks
from gymflow.envs.contract import Message
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.servers.policy import AppServer, PolicyServer

TESTS = Path(__file__).parents[2]


def gated_customer(calls: list[int], gate: asyncio.Event) -> Starlette:
    """The scripted customer over HTTP; its second reply (after the refund) waits for `gate`."""

    async def completions(request: Request) -> Response:
        body = await request.json()
        calls.append(1)
        if len(calls) == 2:
            await gate.wait()
        view = [Message.model_validate(m) for m in body["messages"]]
        text = CustomerPolicy().respond(view, []).content
        return JSONResponse(
            {"model": "customer", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
        )

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def start_worker(tmp_path: Path, address: str, queue: str, user_url: str, name: str) -> subprocess.Popen[bytes]:
    return start_users_worker(
        address=address, queue=queue, user_url=user_url, data_dir=tmp_path / name,
        workspace_root=tmp_path / f"{name}-workspaces", log=tmp_path / f"{name}.log",
    )  # fmt: skip


@pytest.mark.heavy
async def test_a_refund_survives_its_worker_killed(client: Client, temporal_address: str, tmp_path: Path) -> None:
    task = generate_tasks(1, seed=0)[0]
    assert task.metadata["family"] == "refund"
    calls: list[int] = []
    gate = asyncio.Event()
    queue = f"support-kill-{uuid.uuid4().hex[:8]}"
    async with AppServer(gated_customer(calls, gate)) as user, PolicyServer(ReferenceAgent()) as model:
        first = start_worker(tmp_path, temporal_address, queue, user.url, "first")
        second = None
        try:
            handle = await start_rollout(
                client,
                RolloutInput(
                    env="crm-support-llm",
                    task=task,
                    model=ModelConfig(base_url=model.url),
                    retry=RetrySettings(node_timeout_s=3, max_recoveries=3),
                ),
                task_queue=queue,
            )
            await wait_until(lambda: len(calls) == 2, timeout_s=90, what="the customer's reply after the refund")
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            second = start_worker(tmp_path, temporal_address, queue, user.url, "second")
            gate.set()  # the lost call's answer goes to a dead connection
            result = await asyncio.wait_for(handle.result(), 180)
        finally:
            gate.set()
            for process in (first, second):
                if process is not None and process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
    assert not result.infra_failed and result.reward is not None, result.error
    assert result.recoveries >= 1, "the rollout moved to the second worker"
    assert result.reward.total == 1.0, result.reward
    refunds = result.reward.info["found"]["refunds"]
    assert refunds == [
        [task.ground_truth["order_id"], task.ground_truth["product_id"], round(task.ground_truth["amount"] * 100)]
    ]
    tool_results = [m for m in result.messages if m.role == "tool"]
    assert [m.name for m in tool_results] == ["verify_identity", "get_order", "refund_item"], (
        "each call once in history"
    )
