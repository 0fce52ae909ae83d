"""A worker with the warm pool on: rollouts take pooled server sets, and a rollout whose server
dies is rebuilt on a fresh set (replayable env) while the pool replaces what it handed out."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from temporalio.client import Client

from gymflow.envs.contract import Message, Task
from gymflow.envs.mcp.env import McpEnv
from gymflow.workers.worker import running_worker
from support import ScriptedPolicy, call, make_settings, play


async def test_pooled_worker_recovers_a_killed_server(client: Client, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, mcp_pool_size=2)
    async with running_worker(client, settings) as worker:
        env = worker.env.env("counter-replayable")
        assert isinstance(env, McpEnv) and env.pool.size == 2
        await env.warm()
        pooled = {s.pid for sset in env.pool._ready for s in sset.sessions.values()}

        def kill() -> None:
            (rollout,) = env.live_rollouts()
            os.kill(env.server_pids(rollout)["counter"] or 0, signal.SIGKILL)

        script = ScriptedPolicy(
            [
                Message(role="assistant", tool_calls=[call("increment", {"by": 2})]),
                Message(role="assistant", tool_calls=[call("increment", {"by": 3})]),
                Message(role="assistant", content="done"),
            ],
            before_turn={1: kill},
        )
        result = await play(
            client, worker, script, env="counter-replayable", task=Task(id="t", prompt="count", ground_truth="5")
        )
        assert result.recoveries == 1 and result.reward is not None and result.reward.total == 1.0
        await env.warm()
        assert env.pool.ready == 2 and env.live_rollouts() == []
        assert not pooled & {s.pid for sset in env.pool._ready for s in sset.sessions.values()}  # all handed out
