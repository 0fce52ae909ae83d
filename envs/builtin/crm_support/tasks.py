"""Support tasks: a customer with a goal and private facts, and the scripted customer who plays them.

Five families, cycled through by task index, each on an order drawn from the generated CRM:

| family | the customer wants | a perfect episode leaves | and says |
| --- | --- | --- | --- |
| refund | a damaged line refunded (at most the limit) | one refund of the line's amount | the amount |
| refund_over_limit | the same, for a line over the limit | one escalation, no refund | the escalation id |
| cancel | a processing order cancelled | the order cancelled | that it is cancelled |
| cancel_shipped | a shipped order cancelled | nothing | that it has shipped |
| status | an order's status | nothing | the status |

The customer's e-mail address and birth date are in its instruction (`Task.init_args["user"]`),
which the agent never sees: the agent must ask for them to verify the customer. The customer
(`customer_line`) answers what it is asked from its instruction and stops once the agent has said
what it did, so it can be a `ScriptedUser` in-process or a "model" behind an HTTP endpoint
(gymflow.envs.builtin.crm_support.policy.CustomerPolicy) for a `ModelUser`.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Iterator
from typing import Any

from gymflow.envs.builtin.crm import db
from gymflow.envs.builtin.crm_support.rules import REFUND_LIMIT
from gymflow.envs.builtin.crm_support.store import cents
from gymflow.envs.contract import Task
from gymflow.envs.users import STOP

FAMILIES = ("refund", "refund_over_limit", "cancel", "cancel_shipped", "status")

_EMAIL = re.compile(r"Your e-mail address is (\S+) and your birth date is (\d{4}-\d{2}-\d{2})")
_ORDER = re.compile(r"\b(ORD-\d{5})\b")
_PRODUCT = re.compile(r"the (.+?) in your order")


@functools.lru_cache(maxsize=4)
def _data(seed: int) -> db.CrmData:
    return db.generate(seed)


def _orders(data: db.CrmData, family: str) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(order, line) pairs a task of `family` may be about; line None for families without one."""
    names = {p["product_id"]: p["name"] for p in data.products}
    lines: dict[str, list[dict[str, Any]]] = {}
    for item in data.order_items:
        lines.setdefault(item["order_id"], []).append({**item, "name": names[item["product_id"]]})
    for order in data.orders:
        if order["contact_id"] is None:
            continue
        status = order["status"]
        if family in ("refund", "refund_over_limit") and status == "delivered":
            for line in lines[order["order_id"]]:
                over = cents(line["quantity"] * line["unit_price"]) > cents(REFUND_LIMIT)
                if over == (family == "refund_over_limit"):
                    yield order, line
        elif (
            (family == "cancel" and status == "processing")
            or (family == "cancel_shipped" and status == "shipped")
            or (family == "status" and status != "cancelled")
        ):
            yield order, None


def generate_tasks(n: int, *, seed: int = 0) -> list[Task]:
    """`n` tasks over the CRM of `seed`, families in turn, no order used twice."""
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    data = _data(seed)
    contacts = data.by_id("contacts", "contact_id")
    pools = {f: list(_orders(data, f)) for f in FAMILIES}
    rng = random.Random(f"crm-support-{seed}")
    for pool in pools.values():
        rng.shuffle(pool)
    used: set[str] = set()
    tasks: list[Task] = []
    for index in range(n):
        family = FAMILIES[index % len(FAMILIES)]
        pool = pools[family]
        while pool and pool[-1][0]["order_id"] in used:
            pool.pop()
        if not pool:
            raise ValueError(f"the CRM of seed {seed} has too few orders for {n} support tasks")
        order, line = pool.pop()
        used.add(order["order_id"])
        tasks.append(_task(seed, index, family, order, line=line, contact=contacts[order["contact_id"]]))
    return tasks


def _task(
    seed: int, index: int, family: str, order: dict[str, Any], *, line: dict[str, Any] | None, contact: dict[str, Any]
) -> Task:
    order_id = order["order_id"]
    truth: dict[str, Any] = {"family": family, "order_id": order_id, "status": order["status"]}
    if line is not None:
        truth |= {"product_id": line["product_id"], "amount": cents(line["quantity"] * line["unit_price"]) / 100}
        goal = f"One item of your order {order_id}, the {line['name']} in your order, arrived damaged: "
        goal += "you want it refunded."
        prompt = f"Hi, the {line['name']} in my order {order_id} arrived damaged. I would like a refund for it."
    elif family.startswith("cancel"):
        goal = f"You want to cancel your order {order_id}."
        prompt = f"Hello, I need to cancel my order {order_id}, please."
    else:
        goal = f"You want to know the status of your order {order_id}."
        prompt = f"Hi, what is the status of my order {order_id}?"
    who = f"You are {contact['first_name']} {contact['last_name']}. {goal}"
    facts = f"Your e-mail address is {contact['email']} and your birth date is {contact['birth_date']}."
    user = f"{who} {facts} Give them only when the agent asks to verify you. You know no other ids."
    return Task(
        id=f"crm-support-s{seed}-{index:05d}",
        prompt=prompt,
        ground_truth=truth,
        init_args={"db_seed": seed, "user": user},
        metadata={"family": family},
    )


def customer_line(instruction: str, agent_said: str) -> str:
    """What the scripted customer says next to the agent's last message: its e-mail address and birth
    date when asked to verify, its order when asked which, else STOP (the agent has said what it did,
    or cannot help)."""
    said = agent_said.lower()
    facts = _EMAIL.search(instruction)
    order = _ORDER.search(instruction)
    if facts and any(word in said for word in ("e-mail", "email", "birth", "verify", "identity")):
        return f"My e-mail address is {facts.group(1)} and my birth date is {facts.group(2)}."
    if order and "?" in said and any(word in said for word in ("which order", "order number", "order id")):
        product = _PRODUCT.search(instruction)
        return f"It is order {order.group(1)}" + (f", the {product.group(1)}." if product else ".")
    return STOP
