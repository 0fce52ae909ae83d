"""Secrets the test suite uses, and a scan of Temporal histories for any of them.

Every secret a test hands a worker (API keys, encryption keys, codec auth values — everything
`support.make_settings` puts in a SecretStr setting) is registered here, and per-rollout MCP
tokens are recognised by their prefix. At the end of the session the dev-server fixture reads the
raw history of every workflow the suite ran (what the server stores, before any codec) and fails
if one of them shows up (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from google.protobuf import json_format
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowHistory

from gymflow.envs.mcp.http import TOKEN_PREFIX

KNOWN: set[str] = set()
"""Literal secrets used by the suite."""
PATTERNS = [
    re.compile(re.escape(TOKEN_PREFIX) + r"[0-9a-f]{48}"),  # per-rollout MCP bearer tokens
    re.compile(r"sk-test-[0-9a-f]{32}"),  # the model API keys tests make up
]


def register(value: str) -> str:
    """Remember `value` as a secret that must never appear in a history; returns it."""
    if value:
        KNOWN.add(value)
    return value


def leaks_in(text: str) -> list[str]:
    """The secrets (shortened) that `text` contains."""
    found = [f"{s[:6]}..." for s in KNOWN if s in text]
    found += [f"{m.group(0)[:10]}..." for p in PATTERNS for m in p.finditer(text)]
    return found


def payloads_in(message: Message) -> Iterator[Payload]:
    """Every Payload inside a protobuf message (a history, an event), depth first."""
    if isinstance(message, Payload):
        yield message
        return
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        if isinstance(value, Message):
            yield from payloads_in(value)
            continue
        for item in value.values() if hasattr(value, "values") else value:  # a map or a repeated field
            if isinstance(item, Message):
                yield from payloads_in(item)


def history_text(history: WorkflowHistory | History) -> str:
    """A history as searchable text: its JSON plus the decoded bytes of every payload in it.

    Protobuf JSON shows payload data as base64, where a literal search would miss a secret.
    """
    proto = history if isinstance(history, History) else History(events=history.events)
    texts = [json_format.MessageToJson(proto)]
    for payload in payloads_in(proto):
        texts.append(payload.data.decode(errors="replace"))
        texts.extend(v.decode(errors="replace") for v in payload.metadata.values())
    return "\n".join(texts)


@dataclass
class ScanReport:
    """What a history scan read and found."""

    histories: int = 0
    events: int = 0
    leaks: dict[str, list[str]] = field(default_factory=dict)
    """workflow id -> leaked secrets."""


async def scan_histories(client: Client, *, query: str = "", concurrency: int = 16) -> ScanReport:
    """Read the raw history of every workflow matching `query` and look for secrets."""
    report = ScanReport()
    semaphore = asyncio.Semaphore(concurrency)

    async def scan(workflow_id: str, run_id: str) -> None:
        async with semaphore:
            history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        report.histories += 1
        report.events += len(history.events)
        found = leaks_in(history_text(history))
        if found:
            report.leaks[f"{workflow_id}/{run_id}"] = found

    runs = [(w.id, w.run_id) async for w in client.list_workflows(query or None)]
    await asyncio.gather(*(scan(workflow_id, run_id) for workflow_id, run_id in runs))
    return report
