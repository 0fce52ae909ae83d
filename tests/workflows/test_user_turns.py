"""Simulated users (gymflow.envs.users): rollouts that alternate agent and user turns on the dev server.

The user wants a refund and knows its order number; the agent must ask for it (the refund desk of
users_support). A scripted user, and a model user served over real HTTP, play it; a user endpoint
that fails leaves the rollout infra-failed, never scored; a user turn survives its worker's kill -9.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from mcp_support import wait_until
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from users_support import Agent, Guesser, RefundDesk, customer, start_users_worker, task

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RetrySettings, RolloutInput
from gymflow.envs.contract import Message, TerminationReason
from gymflow.envs.users import STOP, user_view
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.servers.policy import AppServer, PolicyServer
from gymflow.workers.worker import RunningWorker
from support import play

TESTS = Path(__file__).parents[1]


async def test_the_agent_and_the_scripted_user_take_turns(client: Client, worker: RunningWorker) -> None:
    result = await play(client, worker, Agent(), env="refund-desk", task=task(4711))
    assert result.termination == TerminationReason.FINAL_ANSWER and not result.infra_failed
    assert [(m.role, m.content) for m in result.messages if m.role != "system"] == [
        ("user", "Hi, I would like a refund."),
        ("assistant", "Sure. What is your order number?"),
        ("user", "It is order 4711."),
        ("assistant", "Refunded order 4711."),
    ]
    assert result.reward is not None and result.reward.total == 1.0
    assert all("Give the number only when asked" not in m.content for m in result.messages), "private"


async def test_a_user_that_never_gets_what_it_wants_ends_at_its_turn_budget(
    client: Client, worker: RunningWorker
) -> None:
    result = await play(client, worker, Guesser(), env="refund-desk", task=task(4711))
    users = [m for m in result.messages if m.role == "user"]
    assert len(users) == 1 + RefundDesk.max_user_turns and result.reward is not None and result.reward.total == 0.0


def user_app(mode: str, calls: list[list[dict[str, str]]], gate: asyncio.Event | None = None) -> Starlette:
    """A model playing the user: reads its instruction from its system message. With `gate`, its
    first call waits for it (a user reply in flight)."""

    async def completions(request: Request) -> Response:
        body = await request.json()
        calls.append(body["messages"])
        if gate is not None and len(calls) == 1:
            await gate.wait()
        if mode == "500":
            return PlainTextResponse("Internal Server Error", 500)
        if mode == "garbage":
            return JSONResponse({"choices": []})
        system = body["messages"][0]["content"]
        conversation = [
            Message(role="assistant", content=m["content"]) for m in body["messages"][1:] if m["role"] == "user"
        ]
        text = customer(system, conversation[-1:] or [Message(role="assistant", content="")])
        return JSONResponse(
            {"model": "user", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
        )

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


async def test_a_model_plays_the_user_over_http(
    client: Client, worker: RunningWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[dict[str, str]]] = []
    async with AppServer(user_app("ok", calls)) as server:
        monkeypatch.setenv("GYMFLOW_USER_URL", server.url)
        result = await play(client, worker, Agent(), env="refund-desk-model", task=task(815))
    assert result.reward is not None and result.reward.total == 1.0 and not result.infra_failed
    assert [m.content for m in result.messages if m.role == "user"][1:] == ["It is order 815."]
    first = calls[0]
    assert first[0]["role"] == "system" and "order 815" in first[0]["content"], "the user's own instruction"
    assert [m["role"] for m in first[1:]] == ["assistant", "user"], "roles flipped: the user's lines are its own"
    assert len(calls) == 2, "one reply, then the STOP that ends the episode"


@pytest.mark.parametrize("mode", ["500", "garbage"])
async def test_a_failing_user_simulator_leaves_the_rollout_infra_failed(
    client: Client, worker: RunningWorker, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    calls: list[list[dict[str, str]]] = []
    async with AppServer(user_app(mode, calls)) as server:
        monkeypatch.setenv("GYMFLOW_USER_URL", server.url)
        result = await play(client, worker, Agent(), env="refund-desk-model", task=task(815))
    assert result.infra_failed and result.reward is None, "never the agent's 0"
    assert "user simulator failed 2 time(s)" in (result.error or "")
    # 2 attempts per reply; the desk is stateless, so the rollout re-inits it elsewhere and asks
    # again, up to its recoveries: bounded, then infra-failed.
    assert len(calls) == 2 * (1 + RetrySettings().max_recoveries)


def test_the_user_model_sees_its_instruction_and_its_own_lines() -> None:
    conversation = [
        Message(role="system", content="agent rules"),
        Message(role="user", content="Hi"),
        Message(role="assistant", content="How can I help?"),
    ]
    view = user_view("You are Ann.", conversation)
    assert view[0]["role"] == "system" and "You are Ann." in view[0]["content"] and STOP in view[0]["content"]
    assert [(m["role"], m["content"]) for m in view[1:]] == [("assistant", "Hi"), ("user", "How can I help?")]
    assert "agent rules" not in json.dumps(view)


def start_worker(tmp_path: Path, address: str, queue: str, user_url: str) -> subprocess.Popen[bytes]:
    """A worker process with the refund desk registered (tests/users_worker.py), on its own node."""
    return start_users_worker(
        address=address, queue=queue, user_url=user_url, data_dir=tmp_path / "worker",
        workspace_root=tmp_path / "workspaces", log=tmp_path / "worker.log",
    )  # fmt: skip


@pytest.mark.heavy
async def test_a_user_turn_survives_its_worker_killed(client: Client, temporal_address: str, tmp_path: Path) -> None:
    """kill -9 of the worker while the user's reply is being generated: the rollout goes on on a new
    worker, the user's reply is asked again, and the conversation has it once."""
    calls: list[list[dict[str, str]]] = []
    gate = asyncio.Event()
    queue = f"users-kill-{uuid.uuid4().hex[:8]}"
    async with AppServer(user_app("ok", calls, gate)) as user, PolicyServer(Agent()) as model:
        first = start_worker(tmp_path, temporal_address, queue, user.url)
        second = None
        try:
            handle = await start_rollout(
                client,
                RolloutInput(
                    env="refund-desk-model",
                    task=task(815),
                    model=ModelConfig(base_url=model.url),
                    retry=RetrySettings(node_timeout_s=3, max_recoveries=3),
                ),
                task_queue=queue,
            )
            await wait_until(lambda: len(calls) == 1, timeout_s=60, what="the user's reply in flight")
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            second = start_worker(tmp_path, temporal_address, queue, user.url)
            gate.set()  # the lost call's answer goes to a dead connection
            result = await asyncio.wait_for(handle.result(), 120)
        finally:
            gate.set()
            for process in (first, second):
                if process is not None and process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
    assert not result.infra_failed and result.reward is not None and result.reward.total == 1.0, result.error
    assert [m.content for m in result.messages if m.role == "user"] == [
        "Hi, I would like a refund.",
        "It is order 815.",
    ]
    assert len(calls) >= 3, "the lost reply was asked for again (then the STOP)"


async def test_a_task_without_the_users_instruction_is_refused_with_a_clear_error(
    client: Client, worker: RunningWorker
) -> None:
    """A bad task is the input's fault (as every invalid `init_args` is): the rollout fails at its init
    with the reason, before any model call, and is never scored."""
    bare = task(4711).model_copy(update={"init_args": {}})
    with pytest.raises(WorkflowFailureError) as caught:
        await play(client, worker, Agent(), env="refund-desk", task=bare)
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput", "the input's fault: exit 2"
    assert "init_rollout" in str(cause) and "needs init_args['user']" in str(cause)
