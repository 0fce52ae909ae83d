"""A node lost mid-rollout is detected by the schedule-to-start timeout on its node queue, and the
rollout is re-initialised on another worker of the same shared queue."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from mcp_support import node_queues_of, wait_until
from temporalio.client import Client

from gymflow.activities.env import state_key
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RetrySettings, RolloutInput
from gymflow.envs.contract import Message, Task, ToolSpec
from gymflow.workers.client import connect
from gymflow.workers.reaper import moved
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import running_worker
from support import ScriptedPolicy, call, make_settings


class StallWhileNodeUp(ScriptedPolicy):
    """Fails turn 1 (an HTTP 500 the model activity retries) until the test has stopped node A."""

    def __init__(self, turns: Sequence[Message]) -> None:
        super().__init__(turns)
        self.turn1_reached = threading.Event()
        self.node_stopped = threading.Event()

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        if sum(m.role == "assistant" for m in messages) == 1 and not self.node_stopped.is_set():
            self.turn1_reached.set()
            raise RuntimeError("node A is still up")
        return super().respond(messages, tools)


@pytest.mark.parametrize("fused", [False, True], ids=["classic", "fused-turns"])
@pytest.mark.heavy
async def test_lost_node_is_detected_and_the_rollout_reinitialised_elsewhere(
    client: Client, temporal_address: str, tmp_path: Path, fused: bool
) -> None:
    # A second connection: the SDK refuses two workers of one queue on one client (one process).
    client_b = await connect(temporal_address)
    settings_a = make_settings(tmp_path, node_id="node-a")
    settings_b = make_settings(tmp_path, node_id="node-b", task_queue=settings_a.task_queue)
    policy = StallWhileNodeUp(
        [
            Message(role="assistant", tool_calls=[call("multiply", {"a": 6, "b": 7})]),
            Message(role="assistant", tool_calls=[call("add", {"a": 42, "b": 0})]),
            Message(role="assistant", content="<answer>42</answer>"),
        ]
    )
    task = Task(id="six-sevens", prompt="What is 6 * 7?", ground_truth="42")
    async with PolicyServer(policy) as server, contextlib.AsyncExitStack() as node_a:
        a = await node_a.enter_async_context(running_worker(client, settings_a))
        handle = await start_rollout(
            client,
            RolloutInput(
                env="math",
                task=task,
                model=ModelConfig(base_url=server.url),
                retry=RetrySettings(node_timeout_s=3, model_attempts=10),
                fuse_turns=fused,
            ),
            task_queue=settings_a.task_queue,
        )
        await wait_until(policy.turn1_reached.is_set, timeout_s=30, what="the rollout to reach turn 1 on node A")
        assert a.env.env("math").live_rollouts()  # type: ignore[attr-defined]
        async with running_worker(client_b, settings_b) as b:
            await node_a.aclose()  # node A is gone, with the rollout's calculator server
            policy.node_stopped.set()
            result = await asyncio.wait_for(handle.result(), timeout=60)
            assert b.env.env("math").live_rollouts() == []  # type: ignore[attr-defined]
    assert not result.infra_failed and result.recoveries == 1
    assert result.reward is not None and result.reward.total == 1.0
    assert [m.content for m in result.messages if m.role == "tool"] == ["42", "42"]
    if fused:  # turn 0 on A, turn 1 lost with A and played again on B, the final turn on B
        queues = await node_queues_of(client, handle.id, "play_turn")
        assert queues == [a.node_queue, a.node_queue, b.node_queue, b.node_queue]
    else:
        queues = await node_queues_of(client, handle.id)
        assert queues == [a.node_queue, a.node_queue, b.node_queue]  # the lost call, then the rerun on B
    # What a node cut off meanwhile learns once it reaches the server again (gymflow.workers.reaper):
    # the state it held (incarnation 0) moved; the one B holds now is the current one.
    assert await moved(client, handle.id, state_key(handle.id, 0)) is True
    assert await moved(client, handle.id, state_key(handle.id, 1)) is False
    # Told its own queue, a node learns whether the latest init completed on it (an init cut off on A
    # and retried on B keeps its state key): incarnation 1 is B's, so A holding it would be moved.
    assert await moved(client, handle.id, state_key(handle.id, 1), b.node_queue) is False
    assert await moved(client, handle.id, state_key(handle.id, 1), a.node_queue) is True
