"""The support desk's reward: the policy kept, the database left as it should be, the customer told.

All or nothing, as tau-bench's is: a rollout scores 1 only if

* ``policy``: it broke no rule of the desk's policy (gymflow.envs.builtin.crm_support.rules) — a
  violation scores 0 whatever else it did;
* ``state``: its writes are exactly those of a perfect episode (the right refund to the cent, the
  escalation, the cancellation; nothing else);
* ``communicated``: its messages told the customer what matters (the refund's amount, the
  escalation id, that the order is cancelled or has shipped, the order's status).

Each part is a component of the reward, and `info` says what was expected and what was found.
"""

from __future__ import annotations

import re
from typing import Any

from gymflow.envs.builtin.crm_support.rules import expected_writes, violations
from gymflow.envs.builtin.crm_support.store import Outcome, cents
from gymflow.envs.contract import Message, Reward

_AMOUNT = re.compile(r"\d[\d,]*(?:\.\d{1,2})?")


def found_writes(outcome: Outcome) -> dict[str, list[Any]]:
    return {
        "refunds": [(r["order_id"], r["product_id"], r["amount_cents"]) for r in outcome.refunds],
        "escalations": [e["order_id"] for e in outcome.escalations],
        "cancelled": list(outcome.cancelled),
    }


def communicated(text: str, ground_truth: dict[str, Any], outcome: Outcome) -> bool:
    """Whether the agent's messages (`text`) say what the customer must hear for this task."""
    family, lower = ground_truth["family"], text.lower()
    if family == "refund":
        said = {cents(float(m.replace(",", ""))) for m in _AMOUNT.findall(text)}
        return cents(ground_truth["amount"]) in said
    if family == "refund_over_limit":
        return any(e["escalation_id"].lower() in lower for e in outcome.escalations)
    if family == "cancel":
        return "cancelled" in lower or "canceled" in lower
    if family == "cancel_shipped":
        return "shipped" in lower
    return str(ground_truth["status"]).lower() in lower


def support_reward(outcome: Outcome, completion: list[Message], ground_truth: dict[str, Any]) -> Reward:
    """Score one episode from its final database state, its log and what it said."""
    broken = violations(outcome)
    expected, found = expected_writes(ground_truth), found_writes(outcome)
    text = " ".join(m.content for m in completion if m.role == "assistant")
    parts = {
        "policy": float(not broken),
        "state": float(found == expected),
        "communicated": float(communicated(text, ground_truth, outcome)),
    }
    total = parts["policy"] * parts["state"] * parts["communicated"]
    info = {"violations": broken, "expected": expected, "found": found, "family": ground_truth["family"]}
    return Reward(total=total, components=parts, info=info)
