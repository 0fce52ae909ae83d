"""The CRM MCP server in memory: typed tools, and writes or injections refused without changing a byte."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gymflow.envs.builtin.crm import db
from gymflow.envs.builtin.crm.readonly import Database
from gymflow.envs.builtin.crm.servers import crm

WRITES = [
    "DELETE FROM cases",
    "UPDATE accounts SET name = 'x'",
    "INSERT INTO agents VALUES ('AG-999', 'x', 'billing', 'europe', 'x@y', '2020-01-01')",
    "REPLACE INTO products VALUES ('PRD-001', 'x', 'router', 1.0, '2020-01-01')",
    "DROP TABLE cases",
    "CREATE TABLE t (x)",
    "CREATE TEMP TABLE t (x)",
    "ALTER TABLE cases ADD COLUMN x",
    "WITH doomed AS (SELECT case_id FROM cases) DELETE FROM cases WHERE case_id IN doomed",
    "PRAGMA query_only = 0",
    "ATTACH DATABASE 'evil.db' AS evil",
    "VACUUM INTO 'copy.db'",
    "SELECT 1; DROP TABLE cases",
    "BEGIN; DELETE FROM cases; COMMIT",
]


@pytest.fixture
def copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The rollout's copy of the database, served by the in-memory server (`Client(crm.server)`)."""
    path = shutil.copyfile(db.database_file(tmp_path / "master", 0), tmp_path / "crm.db")
    monkeypatch.setattr(crm, "db", Database(path, query_seconds=0.5))
    return path


async def _call(client: Client, tool: str, /, **arguments: Any) -> tuple[bool, str]:
    result = await client.call_tool(tool, arguments)
    return result.is_error, "".join(getattr(block, "text", "") for block in result.content)


async def test_about_twenty_typed_tools(copy: Path) -> None:
    async with Client(crm.server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert len(tools) >= 20
        assert tools["get_account"].input_schema["properties"]["account_id"]["pattern"] == r"^ACC-\d{4}$"
        assert "enum" in json.dumps(tools["list_cases"].input_schema["properties"]["status"])
        assert all(t.annotations is not None and t.annotations.read_only_hint for t in tools.values())
        result = await client.call_tool("get_case", {"case_id": "CS-00001"})
        assert result.structured_content is None  # the JSON text only, not twice
        error, text = await _call(client, "describe_schema")
        assert not error and set(json.loads(text)) >= set(db.TABLES)
        assert json.loads(text)["cases"]["escalated"] == "INTEGER"


async def test_tools_answer_from_the_database(copy: Path) -> None:
    async with Client(crm.server) as client:
        data = db.generate(0)
        account = data.accounts[4]
        error, text = await _call(client, "search_accounts", name=account["name"].split()[0].lower())
        assert not error and account["account_id"] in {a["account_id"] for a in json.loads(text)["accounts"]}
        _, text = await _call(client, "get_account", account_id=account["account_id"])
        assert json.loads(text)["contacts"] == sum(c["account_id"] == account["account_id"] for c in data.contacts)
        urgent = [c["case_id"] for c in data.cases if c["priority"] == "urgent" and c["status"] == "open"]
        _, text = await _call(client, "list_cases", status="open", priority="urgent", limit=200)
        assert sorted(c["case_id"] for c in json.loads(text)["cases"]) == sorted(urgent)
        _, text = await _call(
            client, "run_query", sql="SELECT COUNT(*) FROM orders WHERE status = ?", params=["cancelled"]
        )
        assert json.loads(text)["rows"] == [[sum(o["status"] == "cancelled" for o in data.orders)]]
        _, text = await _call(client, "case_stats", group_by="status")
        assert sum(g["cases"] for g in json.loads(text)["groups"]) == len(data.cases)
        _, text = await _call(client, "run_query", sql="SELECT case_id FROM cases")
        assert json.loads(text)["count"] == 200 and json.loads(text)["truncated"] is True
        error, text = await _call(client, "get_case", case_id="CS-99999")
        assert error and "no case CS-99999" in text


async def test_writes_and_injections_are_errors_and_change_nothing(copy: Path) -> None:
    async with Client(crm.server) as client:
        before, files = db.digest(copy), sorted(p.name for p in copy.parent.iterdir())
        for sql in WRITES:
            error, text = await _call(client, "run_query", sql=sql)
            assert error, (sql, text)
            assert "query refused" in text, (sql, text)
        injected = {
            "get_account": {"account_id": "ACC-0001' OR '1'='1"},
            "get_case": {"case_id": "CS-00001; DELETE FROM cases"},
            "list_cases": {"status": "open' OR 1=1 --"},
            "list_orders": {"placed_from": "2024-01-01' OR '1'='1"},
            "case_stats": {"group_by": "agent_id; DROP TABLE cases"},
        }
        for tool, arguments in injected.items():
            error, text = await _call(client, tool, **arguments)
            assert error and "validation error" in text, (tool, text)
        # Free text is bound as a value: it matches nothing and runs nothing.
        for name in ("'; DROP TABLE accounts; --", "x' OR '1'='1", '" OR ""="'):
            error, text = await _call(client, "search_accounts", name=name)
            assert not error and json.loads(text)["count"] == 0
        _, text = await _call(client, "run_query", sql="SELECT * FROM accounts WHERE name = ?", params=["x' OR '1'='1"])
        assert json.loads(text)["count"] == 0
        assert db.digest(copy) == before and sorted(p.name for p in copy.parent.iterdir()) == files
        _, text = await _call(client, "run_query", sql="SELECT COUNT(*) FROM cases")
        assert json.loads(text)["rows"] == [[len(db.generate(0).cases)]]


async def test_runaway_queries_are_stopped(copy: Path) -> None:
    async with Client(crm.server) as client:
        loop = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT COUNT(*) FROM r"
        error, text = await _call(client, "run_query", sql=loop)
        assert error and "interrupted after 0.5 s" in text
        error, text = await _call(client, "run_query", sql="SELECT randomblob(100000000)")
        assert error and "too big" in text
        error, text = await _call(client, "run_query", sql="SELECT nope FROM cases")
        assert error and "no such column" in text
        error, text = await _call(client, "search_knowledge", query="?! ...")
        assert error and "no searchable words" in text


async def test_a_missing_database_is_an_error_observation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crm, "db", Database(tmp_path / "crm.db"))
    async with Client(crm.server) as client:
        error, text = await _call(client, "describe_schema")
    assert error and "not available" in text
