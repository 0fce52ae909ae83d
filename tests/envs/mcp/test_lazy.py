"""Servers started at the first tool call (`McpEnv.lazy_servers`), and idle servers evicted and
brought back by replaying their calls (`McpEnv.evict_idle_s`), on real server processes."""

from __future__ import annotations

import pytest
from mcp_support import MakeEnv, wait_until

from gymflow.envs.errors import InfraError
from gymflow.envs.mcp.env import McpEnv


class Lazy(McpEnv):
    stateless = True
    lazy_servers = True


class Evicting(McpEnv):
    replayable = True  # the counter's state is rebuilt by replaying its increments
    evict_idle_s = 0.3


async def test_a_lazy_rollout_starts_its_servers_at_its_first_call(make_env: MakeEnv) -> None:
    env = make_env(cls=Lazy)
    await env.init_rollout("a")
    await env.init_rollout("idle")
    assert env.server_pids("a") == {} and env.workspace("a").is_dir(), "a workspace, no process yet"
    assert (await env.run_tool("a", "increment", by=2)).text == "2"
    assert env.server_pids("a")["counter"] is not None
    assert env.server_pids("idle") == {}, "a rollout that calls no tool never starts a server"
    assert "increment" in {t.name for t in await env.list_tools()}


async def test_an_evicted_server_comes_back_with_its_state(make_env: MakeEnv) -> None:
    env = make_env(cls=Evicting)
    await env.init_rollout("a")
    await env.run_tool("a", "increment", by=2)
    await env.run_tool("a", "increment", by=3)
    first = env.server_pids("a")["counter"]
    await wait_until(lambda: env.server_pids("a") == {}, timeout_s=10, what="the idle server evicted")
    result = await env.run_tool("a", "increment", by=1)
    assert result.text == "6", "2 + 3 replayed on the new server, then 1"
    assert env.server_pids("a")["counter"] not in (None, first)
    executions = (env.workspace("a") / "executions.log").read_text().splitlines()
    assert executions == ["increment 2", "increment 3", "increment 2", "increment 3", "increment 1"]


async def test_a_replay_that_gives_another_result_is_an_infra_error(make_env: MakeEnv) -> None:
    env = make_env(cls=Evicting)
    await env.init_rollout("a")
    await env.run_tool("a", "pid")  # a result no new server can repeat
    await wait_until(lambda: env.server_pids("a") == {}, timeout_s=10, what="the idle server evicted")
    with pytest.raises(InfraError, match=r"replaying call 0 \(pid\)"):
        await env.run_tool("a", "get")


def test_only_replayable_or_stateless_envs_evict() -> None:
    with pytest.raises(TypeError, match="stateless or replayable"):

        class Stateful(McpEnv):  # declaring it is the test
            evict_idle_s = 1.0
