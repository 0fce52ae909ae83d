"""Shared servers (McpEnv.shared_servers): one server process serves every rollout of a stateless env,
each call carrying its rollout's id and workspace; rollouts keep workspaces of their own."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from mcp_support import wait_until
from temporalio.client import Client

from gymflow.envs.contract import Message, Task
from gymflow.envs.errors import InfraError
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.registry import register
from gymflow.workers.worker import RunningWorker
from support import ScriptedPolicy, call, play

SERVER = str(Path(__file__).with_name("shared_server.py"))


class SharedEnv(McpEnv):
    name = "shared-test"
    stateless = True
    shared_servers = True
    mcp_servers = {"s": {"command": "python", "args": [SERVER]}}


register(SharedEnv.name, SharedEnv)


async def _who(env: McpEnv, rollout: str) -> dict[str, Any]:
    result = await env.run_tool(rollout, "whoami")
    assert not result.is_error, result.text
    answer: dict[str, Any] = json.loads(result.text)
    return answer


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_one_server_serves_every_rollout_with_its_own_workspace(tmp_path: Path) -> None:
    env = SharedEnv(workspace_root=tmp_path)
    try:
        await env.init_rollout("a")
        await env.init_rollout("b")
        a, b = await _who(env, "a"), await _who(env, "b")
        assert a["pid"] == b["pid"], "one process"
        assert (a["rollout"], b["rollout"]) == ("a", "b")
        assert a["workspace"] == str(env.workspace("a")) != b["workspace"] == str(env.workspace("b"))
        assert (await env.run_tool("a", "note", text="for a")).text == ""
        assert (await env.run_tool("b", "note", text="for b")).text == "", "b's workspace is not a's"
        assert (env.workspace("a") / "note.txt").read_text() == "for a"
        workspace_a = env.workspace("a")
        await env.release_rollout("a")
        assert not workspace_a.exists(), "a released: its workspace is gone"
        assert (await _who(env, "b"))["pid"] == a["pid"] and _alive(a["pid"]), "the server serves b still"
        await env.release_rollout("b")
        assert _alive(a["pid"]), "the shared server outlives its rollouts"
    finally:
        await env.shutdown()
    await wait_until(lambda: not _alive(a["pid"]), what="the shared server stopped with its env")


async def test_a_dead_shared_server_fails_its_calls_and_the_next_init_starts_it_again(tmp_path: Path) -> None:
    env = SharedEnv(workspace_root=tmp_path)
    try:
        await env.init_rollout("a")
        first = (await _who(env, "a"))["pid"]
        with pytest.raises(InfraError):
            await env.run_tool("a", "crash")
        await env.release_rollout("a")
        await env.init_rollout("b")  # the rollout recovered: a fresh init
        assert (await _who(env, "b"))["pid"] != first
    finally:
        await env.shutdown()


def test_only_stateless_envs_share_servers() -> None:
    with pytest.raises(TypeError, match="stateless envs only"):

        class Stateful(McpEnv):  # declaring it is the test
            shared_servers = True


async def test_a_shared_env_with_a_sandbox_runtime_is_refused(tmp_path: Path) -> None:
    class Boxed(SharedEnv):
        runtime = {"kind": "bwrap"}

    env = Boxed(workspace_root=tmp_path)
    with pytest.raises(ValueError, match="shared servers run on the host"):
        await env.init_rollout("a")
    await env.shutdown()


async def test_rollouts_on_a_worker_share_the_server(client: Client, worker: RunningWorker) -> None:
    turns = [Message(role="assistant", tool_calls=[call("whoami")]), Message(role="assistant", content="done")]
    pids, rollouts = set(), set()
    for n in range(3):
        result = await play(
            client, worker, ScriptedPolicy(turns), env="shared-test", task=Task(id=f"t{n}", prompt="who?")
        )
        seen = json.loads(next(m.content for m in result.messages if m.role == "tool"))
        pids.add(seen["pid"])
        rollouts.add(seen["rollout"])
    assert len(pids) == 1 and len(rollouts) == 3
