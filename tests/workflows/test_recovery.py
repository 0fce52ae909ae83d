"""A rollout whose MCP server dies mid-rollout: rebuilt when it can be, typed infra failure when
not — never a silent reward of 0."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.logging import RichHandler
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import CancelledError

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import SA_STATUS
from gymflow.activities.schema import RolloutInput
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.envs.contract import Message, Task, TerminationReason
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.registry import register
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from support import CounterEnv, ScriptedPolicy, call, play


@pytest.fixture
def rich_root_logging() -> Iterator[None]:
    handler = RichHandler()
    logging.getLogger().addHandler(handler)
    yield
    logging.getLogger().removeHandler(handler)


async def process_gone(pid: int, *, timeout_s: float) -> bool:
    """Whether `pid` exits (or is a zombie awaiting its reaper) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        await asyncio.sleep(0.05)
    return False


def kill_servers(worker: RunningWorker, env_name: str) -> None:
    env = worker.env.env(env_name)
    assert isinstance(env, McpEnv)
    for rollout_id in env.live_rollouts():
        for pid in env.server_pids(rollout_id).values():
            assert pid is not None
            os.kill(pid, signal.SIGKILL)


def counter_script(worker: RunningWorker, env_name: str) -> ScriptedPolicy:
    """increment 2, (server killed), increment 3, answer — the counter should end at 5."""
    return ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("increment", {"by": 2})]),
            Message(role="assistant", tool_calls=[call("increment", {"by": 3})]),
            Message(role="assistant", content="done"),
        ],
        before_turn={1: lambda: kill_servers(worker, env_name)},
    )


async def test_replayable_env_rebuilds_state_on_a_fresh_server(client: Client, worker: RunningWorker) -> None:
    env_name = "counter-replayable"
    task = Task(id="count-to-5", prompt="count", ground_truth="5")
    result = await play(client, worker, counter_script(worker, env_name), env=env_name, task=task)
    assert result.termination == TerminationReason.FINAL_ANSWER and not result.infra_failed
    assert result.recoveries == 1
    assert result.reward is not None and result.reward.total == 1.0, result.reward
    observations = [m.content for m in result.messages if m.role == "tool"]
    assert observations == ["2", "5"]


async def test_stateful_env_that_cannot_replay_ends_as_infra_failure(client: Client, worker: RunningWorker) -> None:
    env_name = "counter"
    task = Task(id="count-to-5", prompt="count", ground_truth="5")
    result = await play(client, worker, counter_script(worker, env_name), env=env_name, task=task)
    assert result.termination == TerminationReason.ENV_ERROR
    assert result.infra_failed and result.reward is None
    assert result.error and "exited" in result.error
    assert worker.env.env(env_name).live_rollouts() == []  # type: ignore[attr-defined]


async def test_stateless_env_continues_after_its_server_dies(
    client: Client, worker: RunningWorker, rich_root_logging: None
) -> None:
    """Also a regression test: the recovery logs a warning from workflow code while the host has
    a rich log handler installed (mcp servers install one); the sandbox must let it import."""
    task = generate_tasks(1, seed=2, difficulty=3)[0]
    policy = CalculatorPolicy()

    class KillingPolicy(CalculatorPolicy):
        killed = False

        def respond(self, messages, tools):  # type: ignore[no-untyped-def]
            # Once: a fused turn (math's plan) asks the model again when it is played again.
            if sum(m.role == "assistant" for m in messages) == 1 and not self.killed:
                self.killed = True
                kill_servers(worker, "math")
            return policy.respond(messages, tools)

    result = await play(client, worker, KillingPolicy(), env="math", task=task)
    assert result.recoveries == 1 and not result.infra_failed
    assert result.reward is not None and result.reward.total == 1.0


async def test_executions_are_not_repeated_without_a_failure(client: Client, worker: RunningWorker) -> None:
    """Completed tool calls run exactly once (counted on the server side)."""
    task = Task(id="count-to-5", prompt="count", ground_truth="5")
    script = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("increment", {"by": 2}), call("increment", {"by": 3})]),
            Message(role="assistant", content="done"),
        ]
    )
    seen: list[str] = []
    env = worker.env.env("counter")
    assert isinstance(env, McpEnv)
    original = env.compute_reward

    async def spy(rollout_id, completion, ground_truth, **kwargs):  # type: ignore[no-untyped-def]
        seen.extend(Path(env.workspace(rollout_id), "executions.log").read_text().splitlines())
        return await original(rollout_id, completion, ground_truth, **kwargs)

    env.compute_reward = spy  # type: ignore[method-assign]
    result = await play(client, worker, script, env="counter", task=task)
    assert result.reward is not None and result.reward.total == 1.0
    assert seen == ["increment 2", "increment 3"]


async def test_hung_tool_times_out_and_the_rollout_goes_on(client: Client, worker: RunningWorker) -> None:
    """A tool that hangs: error observation within its timeout, server killed, state rebuilt."""
    task = Task(id="count-to-5", prompt="count", ground_truth="5")
    script = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("increment", {"by": 2})]),
            Message(role="assistant", tool_calls=[call("sleep", {"seconds": 3600})]),
            Message(role="assistant", tool_calls=[call("increment", {"by": 3})]),
            Message(role="assistant", content="done"),
        ]
    )
    result = await play(client, worker, script, env="counter-replayable", task=task)
    observations = [m for m in result.messages if m.role == "tool"]
    assert observations[1].is_error and "timed out after 1s" in observations[1].content
    assert result.recoveries == 1 and not result.infra_failed
    assert result.reward is not None and result.reward.total == 1.0


async def test_cancelled_rollout_releases_its_server(client: Client, worker: RunningWorker) -> None:
    env = worker.env.env("counter-slow")
    assert isinstance(env, McpEnv)
    script = ScriptedPolicy([Message(role="assistant", tool_calls=[call("sleep", {"seconds": 600})])])
    async with PolicyServer(script) as server:
        handle = await start_rollout(
            client,
            RolloutInput(env="counter-slow", task=Task(id="t", prompt="p"), model=ModelConfig(base_url=server.url)),
            task_queue=worker.task_queue,
        )
        deadline = time.monotonic() + 30
        while not any(env.server_pids(r) for r in env.live_rollouts()):
            assert time.monotonic() < deadline, "the rollout's server never started"
            await asyncio.sleep(0.05)
        (rollout,) = env.live_rollouts()
        pid = env.server_pids(rollout)["counter"]
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as info:
            await handle.result()
    assert isinstance(info.value.cause, CancelledError)
    assert env.live_rollouts() == []
    assert pid is not None and await process_gone(pid, timeout_s=10)
    described = await handle.describe()
    assert described.typed_search_attributes.get(SA_STATUS) == "cancelled"


CANCEL_REQUESTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED
WFT_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


class GatedInitCounterEnv(CounterEnv):
    """The counter whose init holds its server, then waits for the test to let it finish."""

    name = "counter-gated-init"
    started = asyncio.Event()
    gate = asyncio.Event()

    async def init_rollout(self, rollout_id: str, **init_args: Any) -> None:
        await super().init_rollout(rollout_id, **init_args)
        type(self).started.set()
        await type(self).gate.wait()


register(GatedInitCounterEnv.name, GatedInitCounterEnv)


async def test_rollout_cancelled_during_init_releases_what_the_init_started(
    client: Client, worker: RunningWorker
) -> None:
    """Cancelling the init activity does not undo it: the servers it started must still be released."""
    GatedInitCounterEnv.started, GatedInitCounterEnv.gate = asyncio.Event(), asyncio.Event()
    env = worker.env.env("counter-gated-init")
    assert isinstance(env, McpEnv)
    handle = await start_rollout(
        client,
        RolloutInput(
            env="counter-gated-init", task=Task(id="t", prompt="p"), model=ModelConfig(base_url="http://127.0.0.1:9/v1")
        ),
        task_queue=worker.task_queue,
    )
    await asyncio.wait_for(GatedInitCounterEnv.started.wait(), timeout=30)
    (rollout,) = env.live_rollouts()
    pid = env.server_pids(rollout)["counter"]
    await handle.cancel()
    await cancel_seen(handle)  # the workflow has handled the cancel while the init is still running
    GatedInitCounterEnv.gate.set()
    with pytest.raises(WorkflowFailureError) as info:
        await handle.result()
    assert isinstance(info.value.cause, CancelledError)
    assert env.live_rollouts() == []
    assert pid is not None and await process_gone(pid, timeout_s=10)


async def cancel_seen(handle: WorkflowHandle[Any, Any], timeout_s: float = 30) -> None:
    """Until a workflow task has completed after the cancel request (the workflow acted on it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        types = [e.event_type for e in (await handle.fetch_history()).events]
        if CANCEL_REQUESTED in types and WFT_COMPLETED in types[types.index(CANCEL_REQUESTED) :]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the workflow never handled the cancel request")
