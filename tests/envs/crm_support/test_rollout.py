"""crm-support rollouts on the dev server: the reference agent and the scripted customer, each task
family scored from the rollout's own database copy, and policy violations scored 0."""

from __future__ import annotations

import pytest
from temporalio.client import Client

from gymflow.envs.builtin.crm_support.policy import ReferenceAgent
from gymflow.envs.builtin.crm_support.tasks import FAMILIES, generate_tasks
from gymflow.envs.contract import Message, TerminationReason
from gymflow.workers.worker import RunningWorker
from support import ScriptedPolicy, call, play

TASKS = {task.metadata["family"]: task for task in generate_tasks(len(FAMILIES), seed=0)}


def _facts(instruction: str) -> tuple[str, str]:
    """The customer's e-mail address and birth date, from its private instruction."""
    words = instruction.split()
    return words[words.index("e-mail") + 3], words[words.index("birth") + 3].rstrip(".")


async def test_the_reference_agent_serves_every_family(client: Client, worker: RunningWorker) -> None:
    for family, task in TASKS.items():
        result = await play(client, worker, ReferenceAgent(), env="crm-support", task=task)
        assert result.termination == TerminationReason.FINAL_ANSWER and not result.infra_failed, family
        assert result.reward is not None and result.reward.total == 1.0, (family, result.reward)
        users = [m.content for m in result.messages if m.role == "user"]
        assert "birth date is" in users[1], "the customer gave its facts only when asked"
        assert all(task.init_args["user"] not in m.content for m in result.messages), "the instruction is private"


async def test_a_refund_without_verifying_the_customer_scores_zero(client: Client, worker: RunningWorker) -> None:
    task = TASKS["refund"]
    truth = task.ground_truth
    refund = call(
        "refund_item",
        {"order_id": truth["order_id"], "product_id": truth["product_id"], "amount": truth["amount"], "reason": "x"},
    )
    turns = [
        Message(role="assistant", tool_calls=[refund]),
        Message(role="assistant", content=f"Refunded {truth['amount']:.2f}."),
    ]
    result = await play(client, worker, ScriptedPolicy(turns), env="crm-support", task=task)
    assert result.reward is not None and result.reward.total == 0.0
    # The right refund, told right: only the policy failed.
    assert result.reward.components == {"policy": 0.0, "state": 1.0, "communicated": 1.0}
    assert "before the customer's identity was verified" in result.reward.info["violations"][0]


async def test_a_refund_over_the_limit_scores_zero(client: Client, worker: RunningWorker) -> None:
    task = TASKS["refund_over_limit"]
    truth = task.ground_truth
    email, birth = _facts(task.init_args["user"])
    turns = [
        Message(role="assistant", tool_calls=[call("verify_identity", {"email": email, "birth_date": birth})]),
        Message(
            role="assistant",
            tool_calls=[
                call(
                    "refund_item",
                    {
                        "order_id": truth["order_id"],
                        "product_id": truth["product_id"],
                        "amount": truth["amount"],
                        "reason": "x",
                    },
                ),
                call("escalate_order", {"order_id": truth["order_id"], "reason": "x"}),
            ],
        ),
        Message(role="assistant", content="Refunded, and escalated as ESC-0001."),
    ]
    result = await play(client, worker, ScriptedPolicy(turns), env="crm-support", task=task)
    assert result.reward is not None and result.reward.total == 0.0
    assert result.reward.components["policy"] == 0.0
    assert any("over the 5000.00 limit" in v for v in result.reward.info["violations"])


async def test_acting_on_another_customers_order_scores_zero(client: Client, worker: RunningWorker) -> None:
    task, other = TASKS["cancel"], generate_tasks(len(FAMILIES) * 2, seed=0)[len(FAMILIES) + 2]
    assert other.metadata["family"] == "cancel" and other.ground_truth["order_id"] != task.ground_truth["order_id"]
    email, birth = _facts(other.init_args["user"])  # verified as someone else
    turns = [
        Message(role="assistant", tool_calls=[call("verify_identity", {"email": email, "birth_date": birth})]),
        Message(
            role="assistant",
            tool_calls=[call("cancel_order", {"order_id": task.ground_truth["order_id"], "reason": "x"})],
        ),
        Message(role="assistant", content="Your order is cancelled."),
    ]
    result = await play(client, worker, ScriptedPolicy(turns), env="crm-support", task=task)
    assert result.reward is not None and result.reward.total == 0.0
    assert result.reward.info["violations"] == [
        f"cancel_order on {task.ground_truth['order_id']}, which is not the verified customer's order"
    ]


@pytest.mark.heavy  # two more rollouts; the copies' isolation is also what every other test's exact state check needs
async def test_each_rollout_writes_only_its_own_copy(client: Client, worker: RunningWorker) -> None:
    task = TASKS["cancel"]
    first = await play(client, worker, ReferenceAgent(), env="crm-support", task=task)
    again = await play(client, worker, ReferenceAgent(), env="crm-support", task=task)  # the order is still processing
    assert first.reward is not None and again.reward is not None
    assert first.reward.total == again.reward.total == 1.0
    assert again.reward.info["found"]["cancelled"] == [task.ground_truth["order_id"]]


@pytest.mark.parametrize("family", ["status", "cancel_shipped"])
async def test_the_null_agent_scores_zero(client: Client, worker: RunningWorker, family: str) -> None:
    turns = [Message(role="assistant", content="I don't know.")]
    result = await play(client, worker, ScriptedPolicy(turns), env="crm-support", task=TASKS[family])
    assert result.reward is not None and result.reward.total == 0.0
    assert result.reward.components == {"policy": 1.0, "state": 1.0, "communicated": 0.0}
