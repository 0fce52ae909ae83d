"""The support desk's database: the CRM plus what support writes, and the log every tool call leaves.

This module is the one boundary to the support database (SQLite): the MCP server reads and writes
through `SupportDb`, and the env's reward reads the final state through `outcome`.

Each rollout works on its own writable copy of a master built once per seed: the generated CRM
(gymflow.envs.builtin.crm.db) plus three tables of its own:

* ``refunds`` and ``escalations``: what the agent did, written by the tools;
* ``support_log``: one row per tool call, in order (tool, arguments, outcome). The reward reads
  policy violations from it: an action before the customer's identity was verified, a refund over
  the limit, an action on another customer's order. The agent cannot write it except by calling
  tools, and no tool takes SQL.

Cancelling an order sets its ``status`` to ``cancelled``.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymflow.envs.builtin.crm import db as crm_db

SCHEMA = """
CREATE TABLE refunds (
    refund_id TEXT PRIMARY KEY, order_id TEXT NOT NULL REFERENCES orders, product_id TEXT NOT NULL REFERENCES products,
    amount_cents INTEGER NOT NULL, reason TEXT NOT NULL);
CREATE TABLE escalations (
    escalation_id TEXT PRIMARY KEY, order_id TEXT NOT NULL REFERENCES orders, reason TEXT NOT NULL);
CREATE TABLE support_log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, tool TEXT NOT NULL, args TEXT NOT NULL, result TEXT NOT NULL);
"""
VERSION = 1
"""Bumped with the schema, so a worker never reuses a master of another layout."""


class SupportError(Exception):
    """A tool call the database refuses (an unknown order, a refund larger than its line): the
    message is what the agent reads."""


def master_file(root: Path, seed: int) -> Path:
    """The support master of `seed` under `root`, built on first use (safe under concurrency: a
    build writes a file of its own name and renames it into place)."""
    path = root / f"support-v{VERSION}-crm-v{crm_db.VERSION}-s{seed}.sqlite"
    with _BUILD_LOCK:
        if path.is_file():
            return path
        crm = crm_db.database_file(root, seed)
        tmp = root / f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        try:
            shutil.copyfile(crm, tmp)
            conn = sqlite3.connect(tmp)
            try:
                conn.executescript(SCHEMA)
                conn.commit()
            finally:
                conn.close()
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


_BUILD_LOCK = threading.Lock()


def cents(amount: float) -> int:
    """Dollars to whole cents (order amounts are stored as REAL dollars)."""
    return round(amount * 100)


class SupportDb:
    """The rollout's copy, opened on first use; every public method is one tool call, logged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _open(self) -> sqlite3.Connection:
        if self._conn is None:
            if not self.path.is_file():
                raise SupportError(f"the support database {self.path.name} is not available in this workspace")
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            conn.row_factory = sqlite3.Row
            self._conn = conn
        return self._conn

    def call(self, tool: str, args: dict[str, Any], run: Any) -> dict[str, Any]:
        """Run `run(conn)` as one transaction and log the call with its result (or its refusal)."""
        with self._lock:
            conn = self._open()
            conn.execute("BEGIN IMMEDIATE")
            try:
                result: dict[str, Any] = run(conn)
            except SupportError as exc:
                conn.execute("ROLLBACK")
                conn.execute("BEGIN IMMEDIATE")
                _log(conn, tool, args, {"error": str(exc)})
                conn.execute("COMMIT")
                raise
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            _log(conn, tool, args, result)
            conn.execute("COMMIT")
            return result


def _log(conn: sqlite3.Connection, tool: str, args: dict[str, Any], result: dict[str, Any]) -> None:
    conn.execute(
        "INSERT INTO support_log (tool, args, result) VALUES (?, ?, ?)",
        (tool, json.dumps(args, sort_keys=True), json.dumps(result, sort_keys=True)),
    )


@dataclass
class Outcome:
    """What a rollout left in its copy: its writes and its log."""

    refunds: list[dict[str, Any]] = field(default_factory=list)
    escalations: list[dict[str, Any]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    """Orders whose status is ``cancelled`` now and was not in the master."""
    log: list[dict[str, Any]] = field(default_factory=list)
    """Each tool call in order: ``tool``, ``args`` and ``result`` (dicts)."""
    owners: dict[str, str | None] = field(default_factory=dict)
    """order id -> its contact, for every order the log names."""
    statuses: dict[str, str] = field(default_factory=dict)
    """order id -> its status before the rollout (in the master), for every order the log names."""


def outcome(copy: Path, master: Path) -> Outcome:
    """Read the final state of a rollout's `copy` against its `master` (both read-only here)."""
    conn = sqlite3.connect(f"{copy.resolve().as_uri()}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("ATTACH DATABASE ? AS master", (f"{master.resolve().as_uri()}?mode=ro",))
        found = Outcome(
            refunds=[dict(r) for r in conn.execute("SELECT * FROM refunds ORDER BY refund_id")],
            escalations=[dict(r) for r in conn.execute("SELECT * FROM escalations ORDER BY escalation_id")],
            cancelled=[
                r[0]
                for r in conn.execute(
                    "SELECT o.order_id FROM main.orders o JOIN master.orders m USING (order_id) "
                    "WHERE o.status = 'cancelled' AND m.status != 'cancelled' ORDER BY o.order_id"
                )
            ],
            log=[
                {"tool": r["tool"], "args": json.loads(r["args"]), "result": json.loads(r["result"])}
                for r in conn.execute("SELECT * FROM support_log ORDER BY seq")
            ],
        )
        named = {str(e["args"]["order_id"]) for e in found.log if "order_id" in e["args"]}
        for order_id in sorted(named):
            row = conn.execute(
                "SELECT contact_id, status FROM master.orders WHERE order_id = ?", (order_id,)
            ).fetchone()
            if row is not None:
                found.owners[order_id], found.statuses[order_id] = row[0], row[1]
        return found
    finally:
        conn.close()
