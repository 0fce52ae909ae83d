"""The support desk without Temporal: its MCP server on a real copy (in memory), the log the reward
reads, the policy's checks, and the scripted customer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gymflow.envs.builtin.crm_support import server, store
from gymflow.envs.builtin.crm_support.env import CrmSupportEnv
from gymflow.envs.builtin.crm_support.policy import CustomerPolicy
from gymflow.envs.builtin.crm_support.rewards import support_reward
from gymflow.envs.builtin.crm_support.rules import violations
from gymflow.envs.builtin.crm_support.tasks import customer_line, generate_tasks
from gymflow.envs.contract import Message
from gymflow.envs.users import STOP, user_view

TASKS = generate_tasks(10, seed=0)


@pytest.fixture
def copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(master, the rollout's copy served by the in-memory server)."""
    master = store.master_file(tmp_path / "master", 0)
    path = shutil.copyfile(master, tmp_path / "support.db")
    monkeypatch.setattr(server, "db", store.SupportDb(path))
    return master, path


async def _call(client: Client, tool: str, /, **arguments: Any) -> tuple[bool, Any]:
    result = await client.call_tool(tool, arguments)
    text = "".join(getattr(block, "text", "") for block in result.content)
    return result.is_error, (text if result.is_error else json.loads(text))


def _who(task_index: int) -> dict[str, str]:
    words = TASKS[task_index].init_args["user"].split()
    return {"email": words[words.index("e-mail") + 3], "birth_date": words[words.index("birth") + 3].rstrip(".")}


async def test_the_tools_write_the_copy_and_log_every_call(copy: tuple[Path, Path]) -> None:
    master, path = copy
    truth = TASKS[0].ground_truth  # a refund within the limit
    async with Client(server.server) as client:
        assert (await _call(client, "verify_identity", email="nobody@x.example", birth_date="2000-01-01")) == (
            False,
            {"verified": False},
        )
        error, who = await _call(client, "verify_identity", **_who(0))
        assert not error and who["verified"] is True
        error, order = await _call(client, "get_order", order_id=truth["order_id"])
        assert order["contact_id"] == who["contact_id"] and order["status"] == "delivered"
        line = next(x for x in order["lines"] if x["product_id"] == truth["product_id"])
        assert line["line_total"] == truth["amount"]
        error, text = await _call(
            client,
            "refund_item",
            order_id=truth["order_id"],
            product_id=truth["product_id"],
            amount=truth["amount"] + 1,
            reason="x",
        )
        assert error and "only" in text and "left to refund" in text, "more than the line: refused"
        error, refund = await _call(
            client,
            "refund_item",
            order_id=truth["order_id"],
            product_id=truth["product_id"],
            amount=truth["amount"],
            reason="x",
        )
        assert not error and refund["refund_id"] == "RF-0001"
        error, text = await _call(
            client, "refund_item", order_id=truth["order_id"], product_id="PRD-999", amount=1, reason="x"
        )
        assert error and "has no line for PRD-999" in text
        error, text = await _call(client, "get_order", order_id="ORD-99999")
        assert error and "no order ORD-99999" in text
    found = store.outcome(path, master)
    assert [(r["order_id"], r["amount_cents"]) for r in found.refunds] == [
        (truth["order_id"], round(truth["amount"] * 100))
    ]
    assert [e["tool"] for e in found.log] == ["verify_identity"] * 2 + ["get_order"] + ["refund_item"] * 3 + [
        "get_order"
    ]
    assert "error" in found.log[3]["result"] and "error" in found.log[-1]["result"], "refusals are logged too"
    assert violations(found) == []
    assert store.outcome(master, master).log == [], "the master is never written"


async def test_policy_violations_are_read_from_the_log(copy: tuple[Path, Path]) -> None:
    master, path = copy
    cancel_shipped = TASKS[3].ground_truth
    refund = TASKS[0].ground_truth
    async with Client(server.server) as client:
        await _call(client, "get_order", order_id=refund["order_id"])  # before verifying: a violation
        await _call(client, "verify_identity", **_who(3))
        await _call(client, "cancel_order", order_id=cancel_shipped["order_id"], reason="x")  # shipped: a violation
        await _call(
            client, "refund_item", order_id=refund["order_id"], product_id=refund["product_id"], amount=1, reason="x"
        )
    found = store.outcome(path, master)
    assert violations(found) == [
        f"get_order on {refund['order_id']} before the customer's identity was verified",
        f"cancelled {cancel_shipped['order_id']}, whose status was shipped, not processing",
        f"refund_item on {refund['order_id']}, which is not the verified customer's order",
    ]
    reward = support_reward(found, [Message(role="assistant", content="It has shipped.")], cancel_shipped)
    assert reward.total == 0.0 and reward.components["policy"] == 0.0


def test_the_scripted_customer_says_its_facts_only_when_asked() -> None:
    instruction = TASKS[0].init_args["user"]
    assert customer_line(instruction, "How can I help?") == STOP
    said = customer_line(instruction, "To verify you, what are your e-mail address and birth date?")
    assert said == f"My e-mail address is {_who(0)['email']} and my birth date is {_who(0)['birth_date']}."
    assert TASKS[0].ground_truth["order_id"] in customer_line(instruction, "Which order is it?")
    assert customer_line(instruction, "I refunded $4,043.94 for order ORD-00168.") == STOP


def test_the_customer_policy_answers_the_user_simulators_prompt() -> None:
    """Behind an HTTP endpoint the customer reads what a ModelUser sends: its instruction in the system
    message, the agent's lines as user messages."""
    instruction = TASKS[0].init_args["user"]
    conversation = [
        Message(role="system", content="the desk's policy"),
        Message(role="user", content=TASKS[0].prompt),
        Message(role="assistant", content="Please tell me your e-mail address and birth date."),
    ]
    view = [Message.model_validate(m) for m in user_view(instruction, conversation)]
    reply = CustomerPolicy().respond(view, [])
    assert reply.content == customer_line(instruction, conversation[-1].content) != STOP


def test_too_many_tasks_for_one_database_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="too few orders for 100000 support tasks"):
        generate_tasks(100_000, seed=0)


@pytest.mark.parametrize("seed", [-1, "0", True])
async def test_a_bad_db_seed_is_refused_before_anything_starts(tmp_path: Path, seed: object) -> None:
    env = CrmSupportEnv(workspace_root=tmp_path)
    try:
        with pytest.raises(ValueError, match="'db_seed' must be a non-negative integer"):
            await env.init_rollout("r", db_seed=seed, user="You are Ann.")
        assert env.live_rollouts() == [] and not list(tmp_path.glob("ws-*")), "no rollout, no workspace left"
    finally:
        await env.shutdown()
