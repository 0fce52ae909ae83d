"""The warm pool and per-rollout isolation, on real server processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from mcp_support import MakeEnv, wait_until

from gymflow.envs.errors import InfraError
from gymflow.envs.mcp.pool import MAX_CONSECUTIVE_FAILURES


def pooled_pids(env) -> set[int]:  # type: ignore[no-untyped-def]
    return {s.pid for sset in env.pool._ready for s in sset.sessions.values()}


async def test_warm_pool_init_takes_milliseconds_and_refills(make_env: MakeEnv) -> None:
    env = make_env(pool_size=2)
    await env.warm()
    assert env.pool.ready == 2
    started = time.perf_counter()
    await env.init_rollout("r1")
    elapsed = time.perf_counter() - started
    assert elapsed < 0.1, f"a warm init took {elapsed:.3f}s"
    assert (await env.run_tool("r1", "increment", by=1)).text == "1"
    await env.warm()  # refilled in the background: back to two ready sets
    assert env.pool.ready == 2
    assert env.server_pids("r1")["counter"] not in pooled_pids(env)


async def test_pooled_server_that_dies_is_replaced(make_env: MakeEnv) -> None:
    env = make_env(pool_size=2)
    await env.warm()
    victim = next(iter(pooled_pids(env)))
    os.kill(victim, signal.SIGKILL)
    await wait_until(lambda: victim not in pooled_pids(env), what="the dead server to leave the pool")
    await env.warm()
    assert env.pool.ready == 2 and victim not in pooled_pids(env)
    await env.init_rollout("r")
    assert (await env.run_tool("r", "get")).text == "0"


async def test_server_that_cannot_start_fails_init_without_a_crash_loop(make_env: MakeEnv, tmp_path: Path) -> None:
    env = make_env({"broken": {"command": "python", "args": ["-c", "import sys; sys.exit(3)"]}}, pool_size=2)
    with pytest.raises(InfraError, match="exited with code 3"):
        await env.init_rollout("r")
    await env.warm(timeout_s=30)  # returns once refilling has given up, not after 30 s
    assert env.pool.ready == 0 and env.pool._failures >= MAX_CONSECUTIVE_FAILURES
    assert env.live_rollouts() == []
    assert [p.name for p in (tmp_path / "ws").iterdir()] == [".ledger"]  # no workspace left behind


async def test_concurrent_rollouts_never_see_each_others_state_or_files(make_env: MakeEnv) -> None:
    env = make_env(pool_size=2)
    await env.warm()
    await asyncio.gather(env.init_rollout("a"), env.init_rollout("b"))

    async def play(rollout: str, by: int) -> list[str]:
        out = []
        for _ in range(3):
            out.append((await env.run_tool(rollout, "increment", by=by)).text)
        await env.run_tool(rollout, "write_note", name=f"{rollout}.txt", text=rollout)
        return out

    a, b = await asyncio.gather(play("a", 1), play("b", 100))
    assert a == ["1", "2", "3"] and b == ["100", "200", "300"]
    assert (await env.run_tool("a", "list_files")).text.split("\n") == ["a.txt", "executions.log"]
    assert (await env.run_tool("b", "list_files")).text.split("\n") == ["b.txt", "executions.log"]
    wa, wb = env.workspace("a"), env.workspace("b")
    assert wa != wb and wa.parent == wb.parent
    for rollout, workspace in (("a", wa), ("b", wb)):
        pid = env.server_pids(rollout)["counter"]
        assert pid is not None and Path(f"/proc/{pid}/cwd").resolve() == workspace.resolve()
    await env.release_rollout("a")
    assert not wa.exists() and (await env.run_tool("b", "get")).text == "300"
