"""The CRM env's MCP server: typed read-only tools and one parameterised query tool over SQLite.

One process per rollout, started in the rollout's workspace, which holds the rollout's own copy
of the database (``crm.db``): ``python -m gymflow.envs.builtin.crm.servers.crm [--db crm.db]``.

Design decisions:

* Read-only three times over (gymflow.envs.builtin.crm.readonly): a ``mode=ro`` URI, ``PRAGMA query_only`` and an
  authorizer that lets SQLite refuse any write, PRAGMA, ATTACH or schema change while the statement
  is prepared. The env also proves each rollout's copy unchanged by its digest (gymflow.envs.builtin.crm.env).
* No SQL is built from input. Every typed tool runs one constant statement with named parameters,
  optional filters written as ``(:x IS NULL OR column = :x)``; ids, dates and enumerations are
  validated by the tool's schema (an id like ``ACC-0001' OR 1=1`` is an argument error the model
  sees). ``run_query`` runs the model's own single SELECT with its parameters bound.
* Bounded: at most 200 rows come back, a query is interrupted after 5 s (``--query-seconds``), and
  no value may grow past 1 MB (``randomblob(1e9)`` fails instead of eating memory).
* Errors are observations: a refused or broken query raises ``ToolError`` naming the cause.
* Results are compact JSON text (the model reads text; pretty-printing would triple its size).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from gymflow.envs.builtin.crm.readonly import MAX_ROWS, Database

DB_NAME = "crm.db"
"""The database file in the rollout's workspace."""
MAX_SQL_CHARS = 5000

AccountId = Annotated[str, Field(pattern=r"^ACC-\d{4}$", description="an account id, e.g. ACC-0001")]
ContactId = Annotated[str, Field(pattern=r"^CON-\d{4}$", description="a contact id, e.g. CON-0001")]
AgentId = Annotated[str, Field(pattern=r"^AG-\d{3}$", description="an agent id, e.g. AG-001")]
ProductId = Annotated[str, Field(pattern=r"^PRD-\d{3}$", description="a product id, e.g. PRD-001")]
OrderId = Annotated[str, Field(pattern=r"^ORD-\d{5}$", description="an order id, e.g. ORD-00001")]
CaseId = Annotated[str, Field(pattern=r"^CS-\d{5}$", description="a case id, e.g. CS-00001")]
ArticleId = Annotated[str, Field(pattern=r"^KB-\d{3}$", description="a knowledge article id, e.g. KB-001")]
TranscriptId = Annotated[str, Field(pattern=r"^TR-\d{5}$", description="a transcript id, e.g. TR-00001")]
Date = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description="a date, YYYY-MM-DD (inclusive)")]
Text = Annotated[str, Field(min_length=1, max_length=200)]
Limit = Annotated[int, Field(ge=1, le=MAX_ROWS)]

server = MCPServer(
    "crm",
    instructions=(
        "Read-only tools over a company's CRM (accounts, contacts, agents, products, orders, cases, "
        "knowledge articles, chat transcripts). Use the typed tools, or run_query for one read-only "
        "SELECT with ? parameters. describe_schema lists the tables and columns."
    ),
)


db = Database(Path(DB_NAME))


def tool() -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register a tool: read-only (annotated so), and text only — its JSON text is the whole result, not
    repeated as structured content (which would double every tool result in history)."""
    return server.tool(structured_output=False, annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=False))


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _one(sql: str, params: dict[str, Any], what: str) -> dict[str, Any]:
    found = db.records(sql, params)
    if not found:
        raise ToolError(f"no {what} {next(iter(params.values()))}")
    return found[0]


def _listing(key: str, sql: str, params: dict[str, Any]) -> str:
    columns, rows, more = db.rows(sql, params)
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    return _json({key: records, "count": len(records), **({"truncated": True} if more else {})})


# -- schema ------------------------------------------------------------------------------------
@tool()
def describe_schema() -> str:
    """The tables of the CRM database, with their columns and types."""
    tables = db.records("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name", {})
    return _json({t["name"]: dict(_COLUMN_RE.findall(t["sql"])) for t in tables})


_COLUMN_RE = re.compile(r"[(,]\s*(\w+) (TEXT|REAL|INTEGER)")


# -- accounts and contacts -----------------------------------------------------------------------
@tool()
def search_accounts(
    *,
    name: Text | None = None,
    industry: Text | None = None,
    region: Text | None = None,
    tier: Literal["gold", "silver", "bronze"] | None = None,
    limit: Limit = 20,
) -> str:
    """Accounts whose name contains `name` (case-insensitive) and that match the other filters."""
    return _listing(
        "accounts",
        "SELECT * FROM accounts WHERE (:name IS NULL OR name LIKE '%' || :name || '%') "
        "AND (:industry IS NULL OR industry = lower(:industry)) AND (:region IS NULL OR region = lower(:region)) "
        "AND (:tier IS NULL OR tier = :tier) ORDER BY account_id LIMIT :limit",
        {"name": name, "industry": industry, "region": region, "tier": tier, "limit": limit},
    )


@tool()
def get_account(account_id: AccountId) -> str:
    """One account, with its number of contacts, orders and open cases."""
    return _json(
        _one(
            "SELECT a.*, (SELECT COUNT(*) FROM contacts c WHERE c.account_id = a.account_id) AS contacts, "
            "(SELECT COUNT(*) FROM orders o WHERE o.account_id = a.account_id) AS orders, "
            "(SELECT COUNT(*) FROM cases s WHERE s.account_id = a.account_id AND s.status != 'closed') AS open_cases "
            "FROM accounts a WHERE a.account_id = :account_id",
            {"account_id": account_id},
            "account",
        )
    )


@tool()
def list_contacts(account_id: AccountId) -> str:
    """The contacts of an account (work details only; get_contact has the full record)."""
    return _listing(
        "contacts",
        "SELECT contact_id, account_id, first_name, last_name, title, email, phone FROM contacts "
        "WHERE account_id = :account_id ORDER BY contact_id",
        {"account_id": account_id},
    )


@tool()
def search_contacts(
    name: Text | None = None, email: Text | None = None, account_id: AccountId | None = None, limit: Limit = 20
) -> str:
    """Contacts whose full name or e-mail contains the given text (work details only)."""
    return _listing(
        "contacts",
        "SELECT contact_id, account_id, first_name, last_name, title, email, phone FROM contacts "
        "WHERE (:name IS NULL OR first_name || ' ' || last_name LIKE '%' || :name || '%') "
        "AND (:email IS NULL OR email LIKE '%' || :email || '%') "
        "AND (:account_id IS NULL OR account_id = :account_id) ORDER BY contact_id LIMIT :limit",
        {"name": name, "email": email, "account_id": account_id, "limit": limit},
    )


@tool()
def get_contact(contact_id: ContactId) -> str:
    """A contact's full record, personal fields included (which must never be disclosed)."""
    return _json(_one("SELECT * FROM contacts WHERE contact_id = :contact_id", {"contact_id": contact_id}, "contact"))


# -- agents and products ---------------------------------------------------------------------
@tool()
def search_agents(
    name: Text | None = None,
    team: Literal["billing", "technical", "returns", "onboarding"] | None = None,
    region: Text | None = None,
) -> str:
    """Support agents by name (contains), team and region."""
    return _listing(
        "agents",
        "SELECT * FROM agents WHERE (:name IS NULL OR name LIKE '%' || :name || '%') "
        "AND (:team IS NULL OR team = :team) AND (:region IS NULL OR region = lower(:region)) ORDER BY agent_id",
        {"name": name, "team": team, "region": region},
    )


@tool()
def get_agent(agent_id: AgentId) -> str:
    """One agent, with the number of cases assigned and closed."""
    return _json(
        _one(
            "SELECT a.*, (SELECT COUNT(*) FROM cases c WHERE c.agent_id = a.agent_id) AS cases, "
            "(SELECT COUNT(*) FROM cases c WHERE c.agent_id = a.agent_id AND c.status = 'closed') AS closed_cases "
            "FROM agents a WHERE a.agent_id = :agent_id",
            {"agent_id": agent_id},
            "agent",
        )
    )


@tool()
def search_products(name: Text | None = None, category: Text | None = None) -> str:
    """Products by name (contains) and category."""
    return _listing(
        "products",
        "SELECT * FROM products WHERE (:name IS NULL OR name LIKE '%' || :name || '%') "
        "AND (:category IS NULL OR category = lower(:category)) ORDER BY product_id",
        {"name": name, "category": category},
    )


@tool()
def get_product(product_id: ProductId) -> str:
    """One product, with how many units were ordered and how many cases mention it."""
    return _json(
        _one(
            "SELECT p.*, (SELECT COALESCE(SUM(quantity), 0) FROM order_items i WHERE i.product_id = p.product_id) "
            "AS units_ordered, (SELECT COUNT(*) FROM cases c WHERE c.product_id = p.product_id) AS cases "
            "FROM products p WHERE p.product_id = :product_id",
            {"product_id": product_id},
            "product",
        )
    )


# -- orders ----------------------------------------------------------------------------------
@tool()
def list_orders(
    *,
    account_id: AccountId | None = None,
    product_id: ProductId | None = None,
    status: Literal["processing", "shipped", "delivered", "cancelled"] | None = None,
    placed_from: Date | None = None,
    placed_to: Date | None = None,
    limit: Limit = 50,
) -> str:
    """Orders matching every filter given (product: orders with that product among their items)."""
    return _listing(
        "orders",
        "SELECT * FROM orders o WHERE (:account_id IS NULL OR o.account_id = :account_id) "
        "AND (:product_id IS NULL OR EXISTS (SELECT 1 FROM order_items i WHERE i.order_id = o.order_id "
        "AND i.product_id = :product_id)) AND (:status IS NULL OR o.status = :status) "
        "AND (:placed_from IS NULL OR o.ordered_on >= :placed_from) "
        "AND (:placed_to IS NULL OR o.ordered_on <= :placed_to) ORDER BY o.order_id LIMIT :limit",
        {
            "account_id": account_id,
            "product_id": product_id,
            "status": status,
            "placed_from": placed_from,
            "placed_to": placed_to,
            "limit": limit,
        },
    )


@tool()
def get_order(order_id: OrderId) -> str:
    """One order with its line items."""
    order = _one("SELECT * FROM orders WHERE order_id = :order_id", {"order_id": order_id}, "order")
    items = db.records(
        "SELECT i.product_id, p.name, i.quantity, i.unit_price FROM order_items i "
        "JOIN products p ON p.product_id = i.product_id WHERE i.order_id = :order_id ORDER BY i.product_id",
        {"order_id": order_id},
    )
    return _json(order | {"items": items})


# -- cases -----------------------------------------------------------------------------------
@tool()
def list_cases(
    *,
    account_id: AccountId | None = None,
    agent_id: AgentId | None = None,
    product_id: ProductId | None = None,
    status: Literal["open", "pending", "closed"] | None = None,
    priority: Literal["low", "medium", "high", "urgent"] | None = None,
    escalated: bool | None = None,
    opened_from: Date | None = None,
    opened_to: Date | None = None,
    limit: Limit = 50,
) -> str:
    """Support cases matching every filter given, oldest first."""
    return _listing(
        "cases",
        "SELECT * FROM cases WHERE (:account_id IS NULL OR account_id = :account_id) "
        "AND (:agent_id IS NULL OR agent_id = :agent_id) AND (:product_id IS NULL OR product_id = :product_id) "
        "AND (:status IS NULL OR status = :status) AND (:priority IS NULL OR priority = :priority) "
        "AND (:escalated IS NULL OR escalated = :escalated) "
        "AND (:opened_from IS NULL OR substr(opened_at, 1, 10) >= :opened_from) "
        "AND (:opened_to IS NULL OR substr(opened_at, 1, 10) <= :opened_to) ORDER BY opened_at LIMIT :limit",
        {
            "account_id": account_id,
            "agent_id": agent_id,
            "product_id": product_id,
            "status": status,
            "priority": priority,
            "escalated": None if escalated is None else int(escalated),
            "opened_from": opened_from,
            "opened_to": opened_to,
            "limit": limit,
        },
    )


@tool()
def get_case(case_id: CaseId) -> str:
    """One case, with its handle time in hours (closed cases) and its chat transcript ids."""
    case = _one(
        "SELECT *, CASE WHEN closed_at IS NULL THEN NULL ELSE "
        "round((julianday(closed_at) - julianday(opened_at)) * 24, 2) END AS handle_hours "
        "FROM cases WHERE case_id = :case_id",
        {"case_id": case_id},
        "case",
    )
    transcripts = db.records(
        "SELECT transcript_id FROM chat_transcripts WHERE case_id = :case_id ORDER BY transcript_id",
        {"case_id": case_id},
    )
    return _json(case | {"transcripts": [t["transcript_id"] for t in transcripts]})


_GROUPS = {
    "agent": "agent_id",
    "product": "product_id",
    "account": "account_id",
    "status": "status",
    "priority": "priority",
    "channel": "channel",
    "month": "substr(opened_at, 1, 7)",
}
_STATS_SQL = {
    group: f"SELECT {column} AS key, COUNT(*) AS cases, SUM(status = 'closed') AS closed, "
    "round(AVG(CASE WHEN closed_at IS NULL THEN NULL ELSE (julianday(closed_at) - julianday(opened_at)) * 24 END), 2) "
    "AS avg_handle_hours FROM cases WHERE (:agent_id IS NULL OR agent_id = :agent_id) "
    "AND (:product_id IS NULL OR product_id = :product_id) AND (:account_id IS NULL OR account_id = :account_id) "
    "AND (:status IS NULL OR status = :status) "
    "AND (:opened_from IS NULL OR substr(opened_at, 1, 10) >= :opened_from) "
    "AND (:opened_to IS NULL OR substr(opened_at, 1, 10) <= :opened_to) GROUP BY key ORDER BY key"
    for group, column in _GROUPS.items()
}
"""One constant statement per grouping, built once at import from this module's own names."""


@tool()
def case_stats(
    group_by: Literal["agent", "product", "account", "status", "priority", "channel", "month"],
    *,
    agent_id: AgentId | None = None,
    product_id: ProductId | None = None,
    account_id: AccountId | None = None,
    status: Literal["open", "pending", "closed"] | None = None,
    opened_from: Date | None = None,
    opened_to: Date | None = None,
) -> str:
    """Case counts, closed counts and average handle hours per group, over the cases matching the filters."""
    return _listing(
        "groups",
        _STATS_SQL[group_by],
        {
            "agent_id": agent_id,
            "product_id": product_id,
            "account_id": account_id,
            "status": status,
            "opened_from": opened_from,
            "opened_to": opened_to,
        },
    )


# -- knowledge and transcripts -------------------------------------------------------------------
_WORD_RE = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    [
        "the",
        "and",
        "for",
        "with",
        "how",
        "does",
        "what",
        "who",
        "which",
        "when",
        "can",
        "are",
        "was",
        "from",
        "this",
        "that",
        "into",
        "about",
    ]
)


def _terms(text: str) -> list[str]:
    return [w for w in dict.fromkeys(_WORD_RE.findall(text.lower())) if len(w) > 1 and w not in _STOP]


@tool()
def search_knowledge(query: Annotated[str, Field(min_length=1, max_length=500)], limit: Limit = 5) -> str:
    """Knowledge articles ranked by how many of the query's words they contain (title words count double)."""
    terms = _terms(query)
    if not terms:
        raise ToolError("the query has no searchable words")
    articles = db.records("SELECT article_id, title, category, product_id, body FROM knowledge_articles", {})
    scored = []
    for article in articles:
        title, body = set(_terms(article["title"])), set(_terms(article["body"]))
        score = sum(2 * (t in title) + (t in body) for t in terms)
        if score:
            snippet = article.pop("body")[:160]
            scored.append(article | {"score": score, "snippet": snippet})
    scored.sort(key=lambda a: (-a["score"], a["article_id"]))
    return _json({"articles": scored[:limit], "count": min(limit, len(scored))})


@tool()
def get_article(article_id: ArticleId) -> str:
    """One knowledge article in full."""
    return _json(
        _one("SELECT * FROM knowledge_articles WHERE article_id = :article_id", {"article_id": article_id}, "article")
    )


@tool()
def list_transcripts(
    case_id: CaseId | None = None, agent_id: AgentId | None = None, contact_id: ContactId | None = None
) -> str:
    """Chat transcripts (ids and metadata) of a case, an agent or a contact."""
    return _listing(
        "transcripts",
        "SELECT transcript_id, case_id, agent_id, contact_id, started_at FROM chat_transcripts "
        "WHERE (:case_id IS NULL OR case_id = :case_id) AND (:agent_id IS NULL OR agent_id = :agent_id) "
        "AND (:contact_id IS NULL OR contact_id = :contact_id) ORDER BY transcript_id",
        {"case_id": case_id, "agent_id": agent_id, "contact_id": contact_id},
    )


@tool()
def get_transcript(transcript_id: TranscriptId) -> str:
    """One chat transcript in full (lines start with `Agent:` or `Customer:`)."""
    return _json(
        _one(
            "SELECT * FROM chat_transcripts WHERE transcript_id = :transcript_id",
            {"transcript_id": transcript_id},
            "transcript",
        )
    )


# -- free queries ----------------------------------------------------------------------------
@tool()
def run_query(
    sql: Annotated[str, Field(min_length=1, max_length=MAX_SQL_CHARS)],
    params: Annotated[list[str | int | float | None], Field(max_length=50)] | None = None,
) -> str:
    """Run ONE read-only SELECT statement; put values in `params` and write ? for each in the SQL.

    Example: sql="SELECT case_id FROM cases WHERE agent_id = ? AND status = ?", params=["AG-001", "open"].
    Writes, PRAGMA and ATTACH are refused. At most 200 rows are returned.
    """
    columns, rows, more = db.rows(sql, list(params or []))
    return _json({"columns": columns, "rows": [list(r) for r in rows], "count": len(rows), "truncated": more})


def main(argv: Sequence[str] | None = None) -> None:
    """Serve over stdio; `--db` names the database file (default: crm.db in the working directory)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=Path(DB_NAME))
    parser.add_argument("--query-seconds", type=float, default=db.query_seconds, help="time limit of one query")
    args = parser.parse_args(argv)
    db.path, db.query_seconds = args.db, args.query_seconds
    server.run()


if __name__ == "__main__":
    main()
