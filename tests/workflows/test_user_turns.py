"""Simulated users (gymflow.envs.users): rollouts that alternate agent and user turns on the dev server.

The user wants a refund and knows its order number; the agent must ask for it. A scripted user,
and a model user served over real HTTP, play it; a user endpoint that fails leaves the rollout
infra-failed, never scored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from temporalio.client import Client

from gymflow.envs.contract import BaseEnv, Message, Reward, Task, TerminationReason, ToolResult, ToolSpec
from gymflow.envs.policy import Policy
from gymflow.envs.registry import register
from gymflow.envs.users import STOP, ModelUser, ScriptedUser, UserSimulator, UserTurns, user_view
from gymflow.workers.servers.policy import AppServer
from gymflow.workers.worker import RunningWorker
from support import play

NUMBER = re.compile(r"order (\d+)")


# --8<-- [start:env]


def customer(instruction: str, conversation: Sequence[Message]) -> str:
    """The refund customer: gives its order number when asked, stops once refunded."""
    order = NUMBER.search(instruction).group(1)  # type: ignore[union-attr]
    last = conversation[-1].content.lower()
    if f"refunded order {order}" in last:
        return STOP
    if "order number" in last:
        return f"It is order {order}."
    return "I still want my refund."


class RefundDesk(UserTurns, BaseEnv):
    """No tools: the agent must ask for the order number, then refund that order."""

    name = "refund-desk"
    user: ClassVar[UserSimulator | None] = ScriptedUser(customer)
    max_user_turns = 4

    async def list_tools(self) -> list[ToolSpec]:
        return []

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
        raise NotImplementedError

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        said = " ".join(m.content for m in completion if m.role == "assistant").lower()
        return Reward.of({"refunded": float(f"refunded order {ground_truth}" in said)})


register(RefundDesk.name, RefundDesk)
# --8<-- [end:env]


class ModelRefundDesk(RefundDesk):
    """The same desk with a model playing the user (each test gives it its endpoint)."""

    name = "refund-desk-model"
    user = ModelUser("http://127.0.0.1:9/v1", attempts=2, timeout_s=10)


register(ModelRefundDesk.name, ModelRefundDesk)


class Agent(Policy):
    """Asks for the order number, then refunds the order the user named."""

    name = "agent"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        found = NUMBER.search(messages[-1].content)
        if found:
            return Message(role="assistant", content=f"Refunded order {found.group(1)}.")
        return Message(role="assistant", content="Sure. What is your order number?")


class Guesser(Policy):
    """Refunds without asking: it cannot know the order."""

    name = "guesser"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        return Message(role="assistant", content="Refunded order 1.")


# --8<-- [start:task]
def task(order: int) -> Task:
    return Task(
        id=f"refund-{order}",
        prompt="Hi, I would like a refund.",
        ground_truth=order,
        init_args={"user": f"You want a refund for your order {order}. Give the number only when asked."},
    )
# --8<-- [end:task]


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


def user_app(mode: str, calls: list[list[dict[str, str]]]) -> Starlette:
    """A model playing the user: reads its instruction from its system message."""

    async def completions(request: Request) -> Response:
        body = await request.json()
        calls.append(body["messages"])
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
        monkeypatch.setattr(ModelRefundDesk, "user", ModelUser(server.url, attempts=2, timeout_s=10))
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
        monkeypatch.setattr(ModelRefundDesk, "user", ModelUser(server.url, attempts=2, timeout_s=10))
        result = await play(client, worker, Agent(), env="refund-desk-model", task=task(815))
    assert result.infra_failed and result.reward is None, "never the agent's 0"
    assert "user simulator failed 2 time(s)" in (result.error or "")
    assert len(calls) == 2


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
