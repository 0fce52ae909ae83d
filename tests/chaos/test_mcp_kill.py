"""Kill random rollouts' MCP server processes (SIGKILL) during a batch of three kinds of env.

Stateless (math) rollouts continue on fresh servers, replayable ones (counter-replayable) get
their state rebuilt by replay, and the rest (counter) end as typed infra failures. None may end
with a reward below 1 without being flagged: every policy here is perfect, so a silent 0 would be
the runtime scoring a broken environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import figures
import pytest
from chaos_support import CountingPolicy, counting_tasks
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RetrySettings, RolloutInput, RolloutLimits, RolloutResult
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.contract import TerminationReason
from gymflow.envs.mcp.env import McpEnv
from gymflow.workers.sdk.client import run_rollouts
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import running_worker
from support import make_settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PER_ENV = 30
KILL_EVERY_S = 0.25
MAX_KILLS = 45
ENVS = ("math", "counter-replayable", "counter")


@pytest.mark.parametrize("per_rollout", [1, 3], ids=["once", "up-to-3x"])
async def test_random_mcp_server_kills_during_a_batch(
    client: Client, calculator_policy_url: str, tmp_path: Path, per_rollout: int
) -> None:
    """`per_rollout`: how many times one rollout's server may be killed (3: also while it replays)."""
    settings = make_settings(tmp_path)
    rng = random.Random(7)
    killed: list[tuple[str, str]] = []  # (env, rollout id)
    hits: Counter[str] = Counter()
    async with PolicyServer(CountingPolicy()) as counting, running_worker(client, settings) as worker:
        retry = RetrySettings(max_recoveries=3)
        limits = RolloutLimits(max_turns=8, tool_timeout_s=10)
        inputs = [
            RolloutInput(
                env="math", task=t, model=ModelConfig(base_url=calculator_policy_url), retry=retry, limits=limits
            )
            for t in generate_tasks(PER_ENV, seed=3, difficulty=(3, 4))
        ] + [
            RolloutInput(env=env, task=t, model=ModelConfig(base_url=counting.url), retry=retry, limits=limits)
            for env in ("counter-replayable", "counter")
            for t in counting_tasks(PER_ENV, 4, prefix=env)
        ]
        rng.shuffle(inputs)
        done = asyncio.Event()

        async def killer() -> None:
            while not done.is_set() and len(killed) < MAX_KILLS:
                live = []
                for name in ENVS:
                    env = worker.env.env(name)
                    assert isinstance(env, McpEnv)
                    live += [
                        (name, key.split("#")[0], pid)
                        for key in env.live_rollouts()
                        for pid in env.server_pids(key).values()
                        if pid is not None and running(pid) and hits[key.split("#")[0]] < per_rollout
                    ]
                if live:
                    name, rollout, pid = rng.choice(live)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        killed.append((name, rollout))
                        hits[rollout] += 1
                await asyncio.sleep(KILL_EVERY_S)

        started = time.monotonic()
        kills = asyncio.create_task(killer())
        results: list[RolloutResult] = [
            r async for r in run_rollouts(client, inputs, task_queue=settings.task_queue, concurrency=16)
        ]
        done.set()
        await kills
    elapsed = time.monotonic() - started

    assert len(results) == len(inputs) and len({r.rollout_id for r in results}) == len(inputs)
    hit = {rollout for _, rollout in killed}
    silent = [
        (r.env, r.rollout_id, r.reward)
        for r in results
        if not r.infra_failed and (not r.reward or r.reward.total != 1.0)
    ]
    assert not silent, silent  # never a silent wrong reward

    outcomes: dict[str, Counter[str]] = {name: Counter() for name in ENVS}
    for r in results:
        kind = "infra_failed" if r.infra_failed else ("recovered" if r.recoveries else "scored")
        outcomes[r.env][kind] += 1
        if r.infra_failed:
            assert r.termination in {TerminationReason.ENV_ERROR, TerminationReason.REWARD_ERROR}, r
            assert r.reward is None and r.error
    stateful_failures = [r for r in results if r.env == "counter" and r.infra_failed]
    assert all(r.rollout_id in hit for r in stateful_failures)  # only the rollouts whose server was killed
    if per_rollout == 1:  # one loss each: stateless and replayable rollouts all come back
        assert outcomes["math"]["infra_failed"] == outcomes["counter-replayable"]["infra_failed"] == 0, outcomes
    assert len(killed) >= 20, killed  # the chaos really happened
    for name in ENVS:
        kills = sum(1 for n, _ in killed if n == name)
        figures.record(
            "chaos", f"SIGKILL random MCP servers mid-batch ({per_rollout}x per rollout at most): {name}",
            started=PER_ENV, servers_killed=kills, rollouts_hit=len({r for n, r in killed if n == name}),
            scored_untouched=outcomes[name]["scored"], recovered=outcomes[name]["recovered"],
            infra_failed=outcomes[name]["infra_failed"], silent_zero=0, lost=0, batch_s=round(elapsed, 1),
        )  # fmt: skip


def running(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
