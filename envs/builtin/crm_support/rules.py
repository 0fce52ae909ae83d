"""The support desk's domain policy: the text the agent is given, and the check of what it did.

The same rules twice, once as prose for the agent (`POLICY`) and once as code over the log of its
tool calls (`violations`), so the reward scores exactly what the agent was told.
"""

from __future__ import annotations

from typing import Any

from gymflow.envs.builtin.crm_support.store import Outcome, cents

REFUND_LIMIT = 5_000.00
"""The largest refund an agent may make on its own, in dollars; above it the order is escalated."""
WRITES = ("refund_item", "escalate_order", "cancel_order")
"""The tools that change the database."""

POLICY = f"""You are a customer-support agent of the company. You talk with one customer, who writes to you, \
and you act through tools on the company's CRM. Follow this policy exactly:

1. Identity first. Before you look up or act on any order, verify the customer: ask for their e-mail \
address and birth date and call verify_identity. If it fails, help with nothing that concerns their orders.
2. Only the customer's own orders. Act only on orders whose contact_id is the verified customer's.
3. Refunds. Refund only a delivered order's damaged line, for that line's full amount not yet refunded \
(quantity x unit price), with refund_item. You may refund at most ${REFUND_LIMIT:,.2f} yourself: for a \
larger amount do not refund; escalate the order to a supervisor with escalate_order, and give the \
customer the escalation id.
4. Cancellations. Only an order with status processing may be cancelled (cancel_order). A shipped or \
delivered order can no longer be cancelled: tell the customer its status.
5. Status questions: tell the verified customer the order's status.
6. When you are done, tell the customer what you did, with the refund amount in dollars or the \
escalation id. Never act beyond what the customer asked."""


def violations(outcome: Outcome) -> list[str]:
    """The policy's rules the rollout broke (its log of tool calls, read in order; empty: none)."""
    found: list[str] = []
    verified: str | None = None
    for entry in outcome.log:
        tool, args, result = entry["tool"], entry["args"], entry["result"]
        if tool == "verify_identity":
            if result.get("verified"):
                verified = str(result["contact_id"])
            continue
        if "error" in result:
            continue  # refused by the database: it changed nothing
        order = str(args.get("order_id"))
        if verified is None:
            found.append(f"{tool} on {order} before the customer's identity was verified")
            continue
        if tool not in WRITES:
            continue
        if outcome.owners.get(order) != verified:
            found.append(f"{tool} on {order}, which is not the verified customer's order")
        if tool == "refund_item":
            if cents(float(args["amount"])) > cents(REFUND_LIMIT):
                found.append(f"a refund of {float(args['amount']):.2f} on {order}, over the {REFUND_LIMIT:.2f} limit")
            if outcome.statuses.get(order) != "delivered":
                found.append(f"a refund on {order}, whose status is {outcome.statuses.get(order)}, not delivered")
        if tool == "cancel_order" and outcome.statuses.get(order) != "processing":
            found.append(f"cancelled {order}, whose status was {outcome.statuses.get(order)}, not processing")
    return found


def expected_writes(ground_truth: dict[str, Any]) -> dict[str, list[Any]]:
    """What the database should hold after a perfect episode of the task, write by write."""
    family, order = ground_truth["family"], ground_truth["order_id"]
    writes: dict[str, list[Any]] = {"refunds": [], "escalations": [], "cancelled": []}
    if family == "refund":
        writes["refunds"] = [(order, ground_truth["product_id"], cents(ground_truth["amount"]))]
    elif family == "refund_over_limit":
        writes["escalations"] = [order]
    elif family == "cancel":
        writes["cancelled"] = [order]
    return writes
