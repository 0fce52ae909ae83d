"""Orphans of a dead worker (server process groups, workspaces) are reaped; a live worker's never are."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from mcp_support import HTTP_COUNTER, ROOT, MakeEnv, wait_until

from gymflow.envs.mcp.ledger import reap_orphans, start_time

DEAD_WORKER = """
import asyncio, json, sys
from pathlib import Path
from gymflow.envs.mcp.env import McpEnv

async def main():
    env = McpEnv(workspace_root=Path(sys.argv[1]), servers={"counter": json.loads(sys.argv[2])}, pool_size=1)
    await env.init_rollout("r")
    await env.warm()
    pids = [s.pid for sset in [env._get("r"), *env.pool._ready] for s in sset.sessions.values()]
    print(json.dumps({"pids": pids, "workspace": str(env.workspace("r"))}), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def alive(pid: int) -> bool:
    return start_time(pid) is not None


@pytest.mark.heavy
async def test_reaper_kills_a_dead_workers_servers_and_spares_live_ones(make_env: MakeEnv, tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    worker = await asyncio.create_subprocess_exec(
        *[sys.executable, "-c", DEAD_WORKER, str(root / "node-dead" / "counter"), json.dumps(HTTP_COUNTER)],
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"},
    )
    assert worker.stdout is not None
    held = json.loads(await asyncio.wait_for(worker.stdout.readline(), timeout=60))
    live = make_env(workspace_root=root / "node-live" / "counter")
    await live.init_rollout("mine")
    mine = live.server_pids("mine")["counter"]
    assert mine is not None

    assert reap_orphans(root).owners == []  # both owners alive: nothing touched
    assert all(alive(p) for p in held["pids"])

    worker.send_signal(signal.SIGKILL)  # the worker dies without cleaning up
    await worker.wait()
    assert all(alive(p) for p in held["pids"])  # HTTP servers outlive it (own process groups)
    report = reap_orphans(root)
    assert sorted(report.killed) == sorted(held["pids"]) and len(report.workspaces) == 2
    await wait_until(lambda: not any(alive(p) for p in held["pids"]), what="orphans to die")
    assert not Path(held["workspace"]).exists()
    assert [p.name for p in (root / "node-dead" / "counter").iterdir()] == [".ledger"]
    assert alive(mine) and (await live.run_tool("mine", "increment", by=1)).text == "1"
    assert reap_orphans(root).owners == []  # idempotent
