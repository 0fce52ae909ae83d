"""The support desk's MCP server: identity checks, order look-ups and the writes support may make.

One process per rollout, started in the rollout's workspace, which holds the rollout's own writable
copy of the support database: ``python -m gymflow.envs.builtin.crm_support.server [--db support.db]``.

Design decisions:

* The tools keep the database consistent (an unknown order, a product not in the order, a refund
  larger than what is left of its line, a second cancellation are refused as tool errors) but do
  not enforce the domain policy: verifying the customer, the refund limit and whose order it is
  are the agent's to follow, as a human agent's are. The reward reads every call from the log
  (gymflow.envs.builtin.crm_support.store) and scores a violation 0.
* No SQL is built from input: constant statements with bound parameters, ids validated by schema.
* Results are compact JSON text; refusals are ``ToolError`` naming the cause.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from gymflow.envs.builtin.crm_support.store import SupportDb, SupportError, cents

DB_NAME = "support.db"
"""The database file in the rollout's workspace."""

OrderId = Annotated[str, Field(pattern=r"^ORD-\d{5}$", description="an order id, e.g. ORD-00001")]
ProductId = Annotated[str, Field(pattern=r"^PRD-\d{3}$", description="a product id, e.g. PRD-001")]
Email = Annotated[str, Field(min_length=3, max_length=200, description="the customer's e-mail address")]
BirthDate = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description="the customer's birth date, YYYY-MM-DD")]
Amount = Annotated[float, Field(gt=0, le=1_000_000, description="dollars, to the cent")]
Reason = Annotated[str, Field(min_length=1, max_length=500)]

server = MCPServer(
    "crm-support",
    instructions=(
        "Tools of a customer-support desk over the company's CRM: verify a customer, look up an order, "
        "refund an order line, escalate an order to a supervisor, cancel an order. Every call is logged."
    ),
)
db = SupportDb(Path(DB_NAME))


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _run(tool: str, args: dict[str, Any], run: Any) -> str:
    try:
        return _json(db.call(tool, args, run))
    except SupportError as exc:
        raise ToolError(str(exc)) from None


def _order(conn: sqlite3.Connection, order_id: str) -> sqlite3.Row:
    row = conn.execute("SELECT * FROM orders WHERE order_id = ?", (order_id,)).fetchone()
    if row is None:
        raise SupportError(f"no order {order_id}")
    return row


@server.tool(structured_output=False)
def verify_identity(email: Email, birth_date: BirthDate) -> str:
    """Verify a customer by e-mail address and birth date: their contact id and name, or verified false."""

    def run(conn: sqlite3.Connection) -> dict[str, Any]:
        row = conn.execute(
            "SELECT contact_id, first_name, last_name FROM contacts WHERE lower(email) = lower(?) AND birth_date = ?",
            (email.strip(), birth_date),
        ).fetchone()
        if row is None:
            return {"verified": False}
        return {"verified": True, "contact_id": row["contact_id"], "name": f"{row['first_name']} {row['last_name']}"}

    return _run("verify_identity", {"email": email, "birth_date": birth_date}, run)


@server.tool(structured_output=False)
def get_order(order_id: OrderId) -> str:
    """An order: its contact, status, date and total, its lines (product, quantity, price) and its refunds."""

    def run(conn: sqlite3.Connection) -> dict[str, Any]:
        order = dict(_order(conn, order_id))
        order["lines"] = [
            {**dict(r), "line_total": cents(r["quantity"] * r["unit_price"]) / 100}
            for r in conn.execute(
                "SELECT i.product_id, p.name, i.quantity, i.unit_price FROM order_items i "
                "JOIN products p USING (product_id) WHERE i.order_id = ? ORDER BY i.product_id",
                (order_id,),
            )
        ]
        order["refunds"] = [
            {"refund_id": r["refund_id"], "product_id": r["product_id"], "amount": r["amount_cents"] / 100}
            for r in conn.execute("SELECT * FROM refunds WHERE order_id = ? ORDER BY refund_id", (order_id,))
        ]
        return order

    return _run("get_order", {"order_id": order_id}, run)


@server.tool(structured_output=False)
def refund_item(order_id: OrderId, product_id: ProductId, amount: Amount, reason: Reason) -> str:
    """Refund `amount` dollars of one line of an order; the refund's id."""

    def run(conn: sqlite3.Connection) -> dict[str, Any]:
        _order(conn, order_id)
        line = conn.execute(
            "SELECT quantity, unit_price FROM order_items WHERE order_id = ? AND product_id = ?", (order_id, product_id)
        ).fetchone()
        if line is None:
            raise SupportError(f"order {order_id} has no line for {product_id}")
        done = conn.execute(
            "SELECT COALESCE(SUM(amount_cents), 0) FROM refunds WHERE order_id = ? AND product_id = ?",
            (order_id, product_id),
        ).fetchone()[0]
        left = cents(line["quantity"] * line["unit_price"]) - done
        if cents(amount) > left:
            raise SupportError(f"only {left / 100:.2f} of that line is left to refund, not {amount:.2f}")
        count = conn.execute("SELECT COUNT(*) FROM refunds").fetchone()[0]
        refund_id = f"RF-{count + 1:04d}"
        conn.execute(
            "INSERT INTO refunds VALUES (?, ?, ?, ?, ?)", (refund_id, order_id, product_id, cents(amount), reason)
        )
        return {"refund_id": refund_id, "order_id": order_id, "product_id": product_id, "amount": cents(amount) / 100}

    return _run(
        "refund_item", {"order_id": order_id, "product_id": product_id, "amount": amount, "reason": reason}, run
    )


@server.tool(structured_output=False)
def escalate_order(order_id: OrderId, reason: Reason) -> str:
    """Hand an order to a supervisor (what the policy asks for beyond the agent's authority); the escalation's id."""

    def run(conn: sqlite3.Connection) -> dict[str, Any]:
        _order(conn, order_id)
        count = conn.execute("SELECT COUNT(*) FROM escalations").fetchone()[0]
        escalation_id = f"ESC-{count + 1:04d}"
        conn.execute("INSERT INTO escalations VALUES (?, ?, ?)", (escalation_id, order_id, reason))
        return {"escalation_id": escalation_id, "order_id": order_id}

    return _run("escalate_order", {"order_id": order_id, "reason": reason}, run)


@server.tool(structured_output=False)
def cancel_order(order_id: OrderId, reason: Reason) -> str:
    """Cancel an order (its status becomes cancelled)."""

    def run(conn: sqlite3.Connection) -> dict[str, Any]:
        order = _order(conn, order_id)
        if order["status"] == "cancelled":
            raise SupportError(f"order {order_id} is already cancelled")
        conn.execute("UPDATE orders SET status = 'cancelled' WHERE order_id = ?", (order_id,))
        return {"order_id": order_id, "status": "cancelled", "was": order["status"]}

    return _run("cancel_order", {"order_id": order_id, "reason": reason}, run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=DB_NAME, help="the rollout's copy of the support database")
    args = parser.parse_args()
    db.path = Path(args.db)
    server.run()


if __name__ == "__main__":
    main()
