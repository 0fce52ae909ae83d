"""The generated CRM database: deterministic, consistent, written whole, and its schema as documented."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gymflow.envs.builtin.crm import db


def test_generation_is_deterministic_and_seeded() -> None:
    first, again, other = db.generate(0), db.generate.__wrapped__(0), db.generate(1)
    assert first.cases == again.cases and first.contacts == again.contacts
    assert first.cases != other.cases


def test_rows_are_consistent() -> None:
    data = db.generate(0)
    accounts, agents = data.by_id("accounts", "account_id"), data.by_id("agents", "agent_id")
    products, orders = data.by_id("products", "product_id"), data.by_id("orders", "order_id")
    assert len(accounts) == len(data.accounts) == len({a["name"] for a in data.accounts})
    assert all(c["account_id"] in accounts and c["agent_id"] in agents for c in data.cases)
    assert all(c["product_id"] in products for c in data.cases)
    assert all(i["order_id"] in orders and i["product_id"] in products for i in data.order_items)
    for order in data.orders:
        items = [i for i in data.order_items if i["order_id"] == order["order_id"]]
        assert abs(order["total"] - sum(i["quantity"] * i["unit_price"] for i in items)) < 0.01
    closed = [c for c in data.cases if c["status"] == "closed"]
    assert closed and all(c["closed_at"] > c["opened_at"] for c in closed)
    assert all(c["closed_at"] is None for c in data.cases if c["status"] != "closed")
    assert set(data.issues) == {t["case_id"] for t in data.chat_transcripts}
    assert all(f"Customer: {data.issues[t['case_id']]}" in t["body"] for t in data.chat_transcripts)


def test_database_file_holds_every_row(tmp_path: Path) -> None:
    path = db.database_file(tmp_path, 0)
    assert db.database_file(tmp_path, 0) == path  # built once
    assert not list(tmp_path.glob(".*.tmp"))
    data = db.generate(0)
    with sqlite3.connect(path) as conn:
        for table in db.TABLES:
            assert conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == len(getattr(data, table))
        row = conn.execute("SELECT * FROM cases WHERE case_id = 'CS-00001'").fetchone()
    assert row[0] == "CS-00001" and row[1] == data.cases[0]["account_id"]
    assert len(db.digest(path)) == 64
