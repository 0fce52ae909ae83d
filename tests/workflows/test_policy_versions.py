"""Policy versions across a weight update: 64 rollouts in flight, each mode (gymflow.workers.sdk.policy).

Eight groups of eight rollouts of a 3-turn task (the calculator policy on the in-process math env)
are held in their first model turn by a gated endpoint that logs the model name of every request. The
trainer then announces version 1, served under another model name:

* `continue`: the announcement is live at once; every rollout finishes its first turn on version 0
  and plays the rest on version 1;
* `drain`: the announcement is pending first; every rollout finishes the turn it is in and waits at
  the next boundary (no request reaches the endpoint meanwhile), then plays on once version 1 is live.

Either way each trajectory's per-turn versions are what the endpoint saw: as many requests as turns,
none lost, none repeated.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from mcp_support import eventually, wait_until
from starlette.types import Receive, Scope, Send
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import GroupResult, RolloutLimits, RolloutOptions
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.workers.sdk.groups import group_id, group_lag, rollout_groups
from gymflow.workers.sdk.policy import PolicyChannel
from gymflow.workers.servers.policy import AppServer, build_app
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.rollout import RolloutWorkflow
from support import InProcessMathEnv


class GatedModel:
    """The calculator policy behind a gate; logs each request's model name."""

    def __init__(self) -> None:
        self.app = build_app(CalculatorPolicy())
        self.names: list[str] = []
        self.waiting = 0
        self.open = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            body = b""
            while True:  # read the body to log the model name, then hand it on unchanged
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            self.names.append(json.loads(body)["model"])
            self.waiting += 1
            await self.open.wait()
            sent = False

            async def replay() -> dict[str, Any]:
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)


@pytest.mark.parametrize("mode", ["continue", "drain"])
@pytest.mark.heavy
async def test_a_weight_update_during_64_rollouts_in_flight(client: Client, worker: RunningWorker, mode: str) -> None:
    model = GatedModel()
    tasks = generate_tasks(8, seed=5, difficulty=2)  # two tool calls and an answer: 3 turns each
    async with AppServer(model) as server:
        policy = PolicyChannel(client, ModelConfig(base_url=server.url, model="v0"))
        options = RolloutOptions(limits=RolloutLimits(max_turns=6), policy_mode=mode)  # type: ignore[arg-type]
        groups: list[GroupResult] = []

        async def stream() -> None:
            async for group in rollout_groups(
                client, tasks, env=InProcessMathEnv.name, n=8, options=options, policy=policy,
                batch_id=f"versions-{mode}", max_in_flight=8, task_queue=worker.task_queue,
            ):  # fmt: skip
                groups.append(group)

        streaming = asyncio.create_task(stream())
        await wait_until(lambda: model.waiting >= 64, timeout_s=90, what="64 rollouts in their first turn")
        rollouts = [
            client.get_workflow_handle(f"{group_id(f'versions-{mode}', i, t)}/s{s}")
            for i, t in enumerate(tasks)
            for s in range(8)
        ]

        async def all_report(field: str, value: int) -> None:
            async def states() -> list[dict[str, int]]:
                return list(await asyncio.gather(*(r.query(RolloutWorkflow.progress) for r in rollouts)))

            found = await eventually(states, lambda got: all(state[field] == value for state in got), timeout_s=60)
            assert all(state[field] == value for state in found), f"not every rollout reports {field}={value}"

        v1 = ModelConfig(base_url=server.url, model="v1")
        if mode == "drain":
            assert await policy.announce(1, live=False) == 8  # each group told once, passing it on
            await all_report("announced", 1)
            model.open.set()
            await all_report("draining", 1)
            assert len(model.names) == 64, "a rollout played on while the new weights were pending"
            await policy.announce(1, model=v1)
        else:
            await policy.announce(1, model=v1)
            await all_report("announced", 1)
            model.open.set()
        await asyncio.wait_for(streaming, 120)

    trajectories = [t for g in groups for t in g.trajectories]
    assert len(trajectories) == 64 and not any(t.infra_failed for t in trajectories)
    for t in trajectories:  # the first turn was in flight on version 0; the rest played version 1
        assert t.turns == 3 and t.versions == [0, 1, 1], (t.rollout_id, t.versions)
        assert t.version_span() == (0, 1)
    seen = Counter(model.names)
    assert seen == {"v0": 64, "v1": 128}, seen  # one request per turn: none lost, none repeated
    assert sum(t.turns for t in trajectories) == len(model.names)


@pytest.mark.parametrize("stale", ["rerun", "keep", "drop"])
async def test_a_group_played_on_old_weights_is_never_yielded_as_fresh(
    client: Client, worker: RunningWorker, stale: str
) -> None:
    model = GatedModel()
    tasks = generate_tasks(2, seed=6, difficulty=2)
    async with AppServer(model) as server:
        policy = PolicyChannel(client, ModelConfig(base_url=server.url, model="v0"))
        groups: list[GroupResult] = []
        played = rollout_groups(
            client, tasks, env=InProcessMathEnv.name, n=2, policy=policy, max_staleness=0,
            stale=stale, task_queue=worker.task_queue,  # type: ignore[arg-type]
        )  # fmt: skip
        stats = played.stats

        async def stream() -> None:
            async for group in played:
                groups.append(group)

        streaming = asyncio.create_task(stream())
        await wait_until(lambda: model.waiting >= 4, timeout_s=60, what="4 rollouts in their first turn")
        await policy.announce(1, model=ModelConfig(base_url=server.url, model="v1"))
        model.open.set()
        await asyncio.wait_for(streaming, 90)
    lags = [group_lag(g, policy.version) for g in groups]
    if stale == "rerun":  # played again, on version 1 from the start
        assert stats.stale_rerun == 2 and lags == [0, 0] and stats.lags == {0: 2}
        assert all(g.group_id.endswith("~1") for g in groups)
        assert all(t.versions == [1, 1, 1] for g in groups for t in g.trajectories)
    elif stale == "keep":  # yielded for off-policy use, and counted
        assert stats.stale_kept == 2 and lags == [1, 1] and stats.lags == {1: 2}
    else:
        assert stats.stale_dropped == 2 and groups == []


async def test_staleness_needs_a_policy(client: Client) -> None:
    with pytest.raises(ValueError, match="max_staleness needs a policy"):
        rollout_groups(client, [], env="math", max_staleness=1)
    policy = PolicyChannel(client, ModelConfig(model="v3", version=3))
    with pytest.raises(ValueError, match="not newer than the live version 3"):
        await policy.announce(2)
    with pytest.raises(ValueError, match="stale must be"):
        rollout_groups(client, [], env="math", policy=policy, stale="later")  # type: ignore[arg-type]
