"""Per-rollout HTTP servers with a bearer token: the rollout's client gets in, nobody else does."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from mcp_support import HTTP_COUNTER, MakeEnv

from gymflow.envs.mcp.config import McpServerConfig
from gymflow.envs.mcp.http import TOKEN_PREFIX

TOKEN_COUNTER = {**HTTP_COUNTER, "bearer_token": True}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def test_requests_without_the_token_are_refused(make_env: MakeEnv) -> None:
    env = make_env({"counter": TOKEN_COUNTER})
    await env.init_rollout("a")
    await env.init_rollout("b")
    assert (await env.run_tool("a", "increment", by=5)).text == "5"  # the rollout's own client: accepted
    process = env._get("a").sessions["counter"].http_process
    assert process is not None and process.url and process.token and process.token.startswith(TOKEN_PREFIX)
    other = env._get("b").sessions["counter"].http_process
    assert other is not None and other.token != process.token  # one token per server process
    async with httpx.AsyncClient(timeout=10) as http:
        anonymous = await http.post(process.url, json=INITIALIZE, headers=HEADERS)
        wrong = await http.post(process.url, json=INITIALIZE, headers={**HEADERS, "Authorization": "Bearer nope"})
        stolen = await http.post(  # rollout b's token does not open rollout a's server
            process.url, json=INITIALIZE, headers={**HEADERS, "Authorization": f"Bearer {other.token}"}
        )
        own = await http.post(
            process.url, json=INITIALIZE, headers={**HEADERS, "Authorization": f"Bearer {process.token}"}
        )
    assert (anonymous.status_code, wrong.status_code, stolen.status_code) == (401, 401, 401)
    assert own.status_code == 200
    assert (await env.run_tool("a", "get")).text == "5"  # nobody else changed the counter


async def test_the_token_is_in_the_environment_not_on_the_command_line(make_env: MakeEnv) -> None:
    env = make_env({"counter": TOKEN_COUNTER})
    await env.init_rollout("r")
    process = env._get("r").sessions["counter"].http_process
    assert process is not None and process.token and process.pid
    cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes()
    environ = Path(f"/proc/{process.pid}/environ").read_bytes()
    assert process.token.encode() not in cmdline
    assert f"GYMFLOW_MCP_TOKEN={process.token}".encode() in environ.split(b"\0")
    ledger = "".join(p.read_text() for p in env.workspace_root.rglob("*.json"))
    assert process.token not in ledger  # orphan reaping needs pids, never tokens
    assert os.environ.get("GYMFLOW_MCP_TOKEN") is None  # and the worker's own environment is untouched


def test_bearer_token_needs_a_per_rollout_http_server() -> None:
    with pytest.raises(ValueError, match="bearer_token"):
        McpServerConfig.model_validate({"command": "python", "args": ["server.py"], "bearer_token": True})
    with pytest.raises(ValueError, match="bearer_token"):
        McpServerConfig.model_validate({"url": "http://127.0.0.1:9000/mcp", "bearer_token": True})
    args, env = McpServerConfig.model_validate({**TOKEN_COUNTER, "env": {"API_TOKEN": "{token}"}}).render(
        workspace="/w", port=1, token="t0k"
    )
    assert env == {"API_TOKEN": "t0k", "GYMFLOW_MCP_TOKEN": "t0k"} and "t0k" not in " ".join(args)
