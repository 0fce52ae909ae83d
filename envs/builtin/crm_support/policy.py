"""The support desk's reference agent, and the scripted customer as a chat policy.

`ReferenceAgent` follows the desk's policy (gymflow.envs.builtin.crm_support.rules) from the
conversation alone, as a model would: it reads the customer's request from the opening message,
asks for the e-mail address and birth date, verifies them, looks the order up and decides from the
tool results (whose order, its status, the line's amount against the limit) what it may do. It
never sees the ground truth: if the tools lied, it would score 0.

`CustomerPolicy` is the scripted customer (gymflow.envs.builtin.crm_support.tasks.customer_line)
behind `gymflow policy serve crm-support --policy customer`: it reads the user simulator's prompt
(`gymflow.envs.users.user_view`: the instruction in the system message, the agent's lines as user
messages) and answers as the customer, so a `ModelUser` can be tested over real HTTP offline.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from gymflow.envs.builtin.crm_support.rules import REFUND_LIMIT
from gymflow.envs.builtin.crm_support.store import cents
from gymflow.envs.builtin.crm_support.tasks import customer_line
from gymflow.envs.contract import Message, ToolCall, ToolSpec
from gymflow.envs.policy import Policy

_ORDER = re.compile(r"\b(ORD-\d{5})\b")
_PRODUCT = re.compile(r"the (.+?) in my order", re.IGNORECASE)
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")


def _say(text: str) -> Message:
    return Message(role="assistant", content=text)


def _call(name: str, **arguments: Any) -> Message:
    return Message(role="assistant", content="", tool_calls=[ToolCall(id=f"{name}-1", name=name, arguments=arguments)])


def _results(messages: Sequence[Message]) -> dict[str, dict[str, Any]]:
    """The last successful result of each tool, parsed (a tool error counts as no result)."""
    found: dict[str, dict[str, Any]] = {}
    for message in messages:
        if message.role == "tool" and message.name and not message.is_error:
            try:
                found[message.name] = json.loads(message.content)
            except ValueError:
                continue
    return found


class ReferenceAgent(Policy):
    """Verifies, looks up, then refunds, escalates, cancels or reports, as the policy says."""

    name = "reference"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        del tools
        said = [m.content for m in messages if m.role == "user"]
        if not said:
            return _say("How can I help you?")
        request, order_id = said[0], _ORDER.search(said[0])
        if order_id is None:
            return _say("Which order is this about? Please give me its order number.")
        order_id_text = order_id.group(1)
        if messages[-1].role == "tool" and messages[-1].is_error:
            return _say(f"Our system refused that ({messages[-1].content[:200]}), so I cannot finish this now.")
        results = _results(messages)
        verified = results.get("verify_identity")
        if verified is None:
            for text in reversed(said[1:]):
                email, date = _EMAIL.search(text), _DATE.search(text)
                if email and date:
                    return _call("verify_identity", email=email.group(0), birth_date=date.group(1))
            return _say(
                "Before I look at your order, I need to verify you: what are your e-mail address and birth date?"
            )
        if not verified.get("verified"):
            return _say("I could not verify your identity, so I cannot help with this order.")
        order = results.get("get_order")
        if order is None or order.get("order_id") != order_id_text:
            return _call("get_order", order_id=order_id_text)
        if order["contact_id"] != verified["contact_id"]:
            return _say(f"Order {order_id_text} is not on your account, so I cannot act on it.")
        wants = request.lower()
        if "refund" in wants:
            return self._refund(order, request, results)
        if "cancel" in wants:
            if order["status"] != "processing":
                return _say(f"Order {order_id_text} has status {order['status']}, so it can no longer be cancelled.")
            if "cancel_order" not in results:
                return _call("cancel_order", order_id=order_id_text, reason="customer request")
            return _say(f"Order {order_id_text} is cancelled now.")
        return _say(f"Order {order_id_text} has status {order['status']}.")

    def _refund(self, order: dict[str, Any], request: str, results: dict[str, dict[str, Any]]) -> Message:
        order_id = order["order_id"]
        if "refund_item" in results:
            done = results["refund_item"]
            return _say(f"I refunded ${done['amount']:,.2f} for order {order_id} (refund {done['refund_id']}).")
        if "escalate_order" in results:
            escalation = results["escalate_order"]["escalation_id"]
            return _say(f"This refund is above what I may approve, so I escalated order {order_id} as {escalation}.")
        if order["status"] != "delivered":
            return _say(f"Order {order_id} has status {order['status']}: only delivered orders can be refunded.")
        product = _PRODUCT.search(request)
        name = product.group(1).lower() if product else ""
        line = next((line for line in order["lines"] if line["name"].lower() == name), None)
        if line is None:
            return _say(f"I cannot find that item in order {order_id}. Which product is damaged?")
        refunded = sum(cents(r["amount"]) for r in order["refunds"] if r["product_id"] == line["product_id"])
        left = (cents(line["line_total"]) - refunded) / 100
        if left <= 0:
            return _say(f"The {line['name']} in order {order_id} is already refunded.")
        if cents(left) > cents(REFUND_LIMIT):
            return _call("escalate_order", order_id=order_id, reason=f"damaged {line['name']}: refund of {left:.2f}")
        return _call(
            "refund_item", order_id=order_id, product_id=line["product_id"], amount=left, reason="arrived damaged"
        )


class CustomerPolicy(Policy):
    """The scripted customer as a chat policy, for serving a user simulator over HTTP."""

    name = "customer"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        del tools
        system = next((m.content for m in messages if m.role == "system"), "")
        instruction = system.rsplit("Your instructions:", 1)[-1].strip()
        agent_said = next((m.content for m in reversed(messages) if m.role == "user"), "")
        return Message(role="assistant", content=customer_line(instruction, agent_said))
