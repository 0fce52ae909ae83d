"""A SQLite database opened so that nothing can write to it, with bounded queries.

Read-only three times over: the file is opened with a ``file:...?mode=ro`` URI, the connection
sets ``PRAGMA query_only``, and an authorizer allows only reading actions (SELECT, reading
columns, functions, recursive CTEs) — a write, PRAGMA, ATTACH or schema change is refused by
SQLite itself while the statement is prepared, before anything runs, whatever the SQL text says.
Queries are bounded in rows, time and value size. Errors are `ToolError`s naming the cause.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError

MAX_ROWS = 200
"""Rows returned by one call at most."""
QUERY_SECONDS = 5.0
"""A statement running longer than this is interrupted."""
MAX_VALUE_BYTES = 1_000_000
"""SQLite's length limit for any string or blob a query makes."""

_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, 33})
"""What a statement may do (33 is SQLITE_RECURSIVE, missing from older sqlite3 modules)."""


class Database:
    """The rollout's database, opened read-only on first use (the env stages it after the server starts)."""

    def __init__(self, path: Path, *, query_seconds: float = QUERY_SECONDS) -> None:
        self.path = path
        self.query_seconds = query_seconds
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _open(self) -> sqlite3.Connection:
        if self._conn is None:
            if not self.path.is_file():
                raise ToolError(f"the CRM database {self.path.name} is not available in this workspace")
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
            conn.execute("PRAGMA query_only = ON")
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
            conn.set_authorizer(_authorize)
            self._conn = conn
        return self._conn

    def rows(
        self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
    ) -> tuple[list[str], list[tuple[Any, ...]], bool]:
        """Column names, at most `MAX_ROWS` rows, and whether more were left out."""
        with self._lock:
            conn = self._open()
            deadline = time.monotonic() + self.query_seconds
            conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
            try:
                cursor = conn.execute(sql, params)
                fetched = cursor.fetchmany(MAX_ROWS + 1)
                columns = [d[0] for d in cursor.description or ()]
            except (sqlite3.DatabaseError, sqlite3.Warning) as exc:  # Warning: several statements (older Pythons)
                raise ToolError(
                    _explain(exc, timed_out=time.monotonic() > deadline, seconds=self.query_seconds)
                ) from exc
            finally:
                conn.set_progress_handler(None, 0)
            return columns, fetched[:MAX_ROWS], len(fetched) > MAX_ROWS

    def records(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The rows as dicts keyed by column."""
        columns, rows, _ = self.rows(sql, params)
        return [dict(zip(columns, row, strict=True)) for row in rows]


def _authorize(action: int, arg1: str | None, arg2: str | None, db_name: str | None, trigger: str | None) -> int:
    del arg1, arg2, db_name, trigger
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def _explain(exc: sqlite3.DatabaseError | sqlite3.Warning, *, timed_out: bool, seconds: float) -> str:
    text = str(exc)
    if "not authorized" in text or "authorization denied" in text:
        return "query refused: the CRM database is read-only; only SELECT statements may run (not authorized)"
    if "one statement at a time" in text:
        return "query refused: run_query runs exactly one statement (no ';'-separated statements)"
    if timed_out or "interrupted" in text:
        return f"query interrupted after {seconds:g} s"
    return f"query failed: {text}"
