"""The CRM task families whose answers are ids, e-mails or amounts (exact rewards).

Each family draws its parameters from the generated rows and returns a `TaskSpec` whose ground
truth is computed in Python, with the reference solution as tool calls (gymflow.envs.builtin.crm.spec).
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter, defaultdict
from typing import Any

from gymflow.envs.builtin.crm import db
from gymflow.envs.builtin.crm.db import CrmData
from gymflow.envs.builtin.crm.spec import (
    NoTask,
    Results,
    Step,
    TaskSpec,
    exact,
    first,
    join_ids,
    month_range,
    months,
    unique_contact,
)


def open_cases(data: CrmData, rng: random.Random) -> TaskSpec:
    account = rng.choice(data.accounts)
    priority = rng.choice(["medium", "high", "urgent", "low"])
    ids = [
        c["case_id"]
        for c in data.cases
        if c["account_id"] == account["account_id"] and c["status"] == "open" and c["priority"] == priority
    ]
    if not ids:
        raise NoTask
    return TaskSpec(
        "open_cases",
        f'List the ids of all open {priority}-priority cases of the account "{account["name"]}".',
        exact(ids),
        (
            Step("search_accounts", lambda r: {"name": account["name"]}),
            Step(
                "list_cases",
                lambda r: {
                    "account_id": first(r, 0, "accounts", "account_id", name=account["name"]),
                    "status": "open",
                    "priority": priority,
                    "limit": 200,
                },
            ),
        ),
        lambda r: join_ids(r, 1, "cases", "case_id"),
    )


def escalated_cases(data: CrmData, rng: random.Random) -> TaskSpec:
    agent = rng.choice(data.agents)
    month = rng.choice(months(data))
    start, end = month_range(month)
    ids = [
        c["case_id"]
        for c in data.cases
        if c["agent_id"] == agent["agent_id"] and c["escalated"] and start <= c["opened_at"][:10] <= end
    ]
    if not ids:
        raise NoTask
    when = dt.date.fromisoformat(start).strftime("%B %Y")
    return TaskSpec(
        "escalated_cases",
        f"Which escalated cases assigned to the agent {agent['name']} were opened in {when}? List their ids.",
        exact(ids),
        (
            Step("search_agents", lambda r: {"name": agent["name"]}),
            Step(
                "list_cases",
                lambda r: {
                    "agent_id": first(r, 0, "agents", "agent_id", name=agent["name"]),
                    "escalated": True,
                    "opened_from": start,
                    "opened_to": end,
                    "limit": 200,
                },
            ),
        ),
        lambda r: join_ids(r, 1, "cases", "case_id"),
    )


def product_buyers(data: CrmData, rng: random.Random) -> TaskSpec:
    product = rng.choice(data.products)
    year = rng.choice(["2024", "2025"])
    orders = {o["order_id"]: o for o in data.orders if o["ordered_on"].startswith(year)}
    ids = sorted(
        {
            orders[i["order_id"]]["account_id"]
            for i in data.order_items
            if i["product_id"] == product["product_id"] and i["order_id"] in orders
        }
    )
    if not ids:
        raise NoTask
    return TaskSpec(
        "product_buyers",
        f'Which accounts placed an order containing the product "{product["name"]}" in {year}? List their account ids.',
        exact(ids),
        (
            Step("search_products", lambda r: {"name": product["name"]}),
            Step(
                "list_orders",
                lambda r: {
                    "product_id": first(r, 0, "products", "product_id", name=product["name"]),
                    "placed_from": f"{year}-01-01",
                    "placed_to": f"{year}-12-31",
                    "limit": 200,
                },
            ),
        ),
        lambda r: join_ids(r, 1, "orders", "account_id"),
    )


TOP_AGENT_SQL = (
    "SELECT agent_id, COUNT(*) AS closed FROM cases WHERE product_id = ? AND status = 'closed' "
    "AND substr(closed_at, 1, 4) = ? GROUP BY agent_id ORDER BY closed DESC, agent_id LIMIT 1"
)


def top_agent(data: CrmData, rng: random.Random) -> TaskSpec:
    product = rng.choice(data.products)
    year = rng.choice(["2024", "2025"])
    counts = Counter(
        c["agent_id"]
        for c in data.cases
        if c["product_id"] == product["product_id"] and c["status"] == "closed" and c["closed_at"][:4] == year
    )
    ranked = counts.most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        raise NoTask
    return TaskSpec(
        "top_agent",
        f'Which agent closed the most cases about the product "{product["name"]}" in {year}? Answer with the agent id.',
        exact([ranked[0][0]]),
        (
            Step("search_products", lambda r: {"name": product["name"]}),
            Step(
                "run_query",
                lambda r: {
                    "sql": TOP_AGENT_SQL,
                    "params": [first(r, 0, "products", "product_id", name=product["name"]), year],
                },
            ),
        ),
        lambda r: str(r[1]["rows"][0][0]),
    )


FASTEST_SQL = (
    "SELECT c.agent_id, AVG((julianday(c.closed_at) - julianday(c.opened_at)) * 24) AS hours FROM cases c "
    "JOIN agents a ON a.agent_id = c.agent_id WHERE a.team = ? AND c.status = 'closed' "
    "AND substr(c.closed_at, 1, 7) = ? GROUP BY c.agent_id ORDER BY hours, c.agent_id LIMIT 1"
)


def _hours(case: dict[str, Any]) -> float:
    opened = dt.datetime.fromisoformat(case["opened_at"])
    return (dt.datetime.fromisoformat(case["closed_at"]) - opened).total_seconds() / 3600


def fastest_agent(data: CrmData, rng: random.Random) -> TaskSpec:
    team = rng.choice(db.TEAMS)
    month = rng.choice(months(data)[:-1])
    team_agents = {a["agent_id"] for a in data.agents if a["team"] == team}
    hours: dict[str, list[float]] = defaultdict(list)
    for c in data.cases:
        if c["agent_id"] in team_agents and c["status"] == "closed" and c["closed_at"][:7] == month:
            hours[c["agent_id"]].append(_hours(c))
    means = sorted((sum(v) / len(v), k) for k, v in hours.items())
    if len(means) < 2 or means[1][0] - means[0][0] < 0.05:
        raise NoTask
    when = dt.date.fromisoformat(month + "-01").strftime("%B %Y")
    return TaskSpec(
        "fastest_agent",
        f"Among the agents of the {team} team, who had the lowest average handle time (hours from opening to "
        f"closing) on the cases they closed in {when}? Answer with the agent id.",
        exact([means[0][1]]),
        (Step("run_query", lambda r: {"sql": FASTEST_SQL, "params": [team, month]}),),
        lambda r: str(r[0]["rows"][0][0]),
    )


TOTAL_SQL = (
    "SELECT ROUND(SUM(total), 2) FROM orders WHERE account_id = ? AND status != 'cancelled' "
    "AND ordered_on BETWEEN ? AND ?"
)
QUARTERS = {"Q1": ("01-01", "03-31"), "Q2": ("04-01", "06-30"), "Q3": ("07-01", "09-30"), "Q4": ("10-01", "12-31")}


def order_total(data: CrmData, rng: random.Random) -> TaskSpec:
    account = rng.choice(data.accounts)
    year, quarter = rng.choice([("2024", q) for q in QUARTERS] + [("2025", "Q1"), ("2025", "Q2")])
    start, end = (f"{year}-{d}" for d in QUARTERS[quarter])
    totals = [
        o["total"]
        for o in data.orders
        if o["account_id"] == account["account_id"] and o["status"] != "cancelled" and start <= o["ordered_on"] <= end
    ]
    if not totals:
        raise NoTask
    return TaskSpec(
        "order_total",
        f'What is the total value of the orders the account "{account["name"]}" placed in {quarter} {year}, '
        "leaving out cancelled orders? Answer with the amount in dollars, to the cent (e.g. 1234.50).",
        {"type": "numeric", "answer": f"{sum(totals):.2f}", "tolerance": 0.005},
        (
            Step("search_accounts", lambda r: {"name": account["name"]}),
            Step(
                "run_query",
                lambda r: {
                    "sql": TOTAL_SQL,
                    "params": [first(r, 0, "accounts", "account_id", name=account["name"]), start, end],
                },
            ),
        ),
        lambda r: f"{float(r[1]['rows'][0][0]):.2f}",
    )


def _contact(results: Results, contact: dict[str, Any], field: str) -> Any:
    """`field` of `contact`'s row in the first result (a search_contacts listing)."""
    return first(results, 0, "contacts", field, first_name=contact["first_name"], last_name=contact["last_name"])


def account_owner(data: CrmData, rng: random.Random) -> TaskSpec:
    contact = unique_contact(data, rng)
    name = f"{contact['first_name']} {contact['last_name']}"
    owner = data.by_id("accounts", "account_id")[contact["account_id"]]["owner_agent_id"]
    return TaskSpec(
        "account_owner",
        f"{name} has a question about their contract. Which agent owns the account {name} works for? "
        "Answer with the agent id.",
        exact([owner]),
        (
            Step("search_contacts", lambda r: {"name": name}),
            Step("get_account", lambda r: {"account_id": _contact(r, contact, "account_id")}),
        ),
        lambda r: str(r[1]["owner_agent_id"]),
    )


def contact_email(data: CrmData, rng: random.Random) -> TaskSpec:
    contact = unique_contact(data, rng)
    name = f"{contact['first_name']} {contact['last_name']}"
    account = data.by_id("accounts", "account_id")[contact["account_id"]]
    return TaskSpec(
        "contact_email",
        f'I need to send a quote to {name} at "{account["name"]}". What is their work e-mail address?',
        exact([contact["email"]]),
        (Step("search_contacts", lambda r: {"name": name}),),
        lambda r: str(_contact(r, contact, "email")),
    )
