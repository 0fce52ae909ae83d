"""Helpers for MCP runtime tests (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from third_party_servers import SERVERS, executable, install_command

from gymflow.envs.contract import ToolResult
from gymflow.envs.mcp.env import McpEnv
from support import COUNTER_SERVER

ROOT = Path(__file__).parents[1]

COUNTER = {"command": "python", "args": [str(COUNTER_SERVER)], "tool_timeout_s": 10}
HTTP_COUNTER = {
    "command": "python",
    "args": [str(COUNTER_SERVER), "--port", "{port}"],
    "url": "http://127.0.0.1:{port}/mcp",
}

MakeEnv = Callable[..., McpEnv]
T = TypeVar("T")


def shout(result: ToolResult) -> str:
    """A custom output parser (`mcp_support:shout`): the text, upper-cased."""
    return result.text.upper()


async def wait_until(predicate: Callable[[], bool], *, timeout_s: float = 20.0, what: str = "condition") -> None:
    """Poll `predicate` until it holds, failing after `timeout_s` (no fixed sleeps in tests)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)


async def eventually(probe: Callable[[], Awaitable[T]], ok: Callable[[T], bool], *, timeout_s: float = 30) -> T:
    """Call `probe` until `ok` holds for its value (visibility and queries are eventually consistent)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if ok(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.2)


async def activity_types(client: Client, workflow_id: str) -> list[str]:
    """The activity types the workflow scheduled, in order, from its history."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


async def node_queues_of(client: Client, workflow_id: str, activity: str = "call_tool") -> list[str]:
    """The task queues `activity` was scheduled on, in order, from the workflow's history."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        e.activity_task_scheduled_event_attributes.task_queue.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == activity
    ]


async def polling(client: Client, queue: str) -> bool:
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        )
    )
    return bool(response.pollers)


async def wait_polling(client: Client, queues: list[str], timeout_s: float = 90) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not all([await polling(client, q) for q in queues]):
        assert asyncio.get_running_loop().time() < deadline, f"workers never polled {queues}"
        await asyncio.sleep(0.2)


def node_ids(nodes: int) -> list[str]:
    """The node ids the task's run script gives ranks 0..nodes-1 on this host."""
    return [f"{socket.gethostname()}-{rank}" for rank in range(nodes)]


def third_party(name: str) -> Path:
    """The executable of third-party MCP server `name` (tests/third_party_servers.py); the test is
    skipped, saying how to install it, when its venv is absent."""
    path = executable(name)
    if not path.exists():
        pytest.skip(
            f"{SERVERS[name].executable} is not installed in {path.parents[1]}: run "
            f"`python3 tests/third_party_servers.py` (.ci/run does), or `{install_command(name)}`"
        )
    return path
