"""Helpers shared by tests (importable because pytest puts tests/ on sys.path)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from temporalio.client import Client

from activities.model import ModelConfig
from envs.contract import Message, Reward, Task, ToolCall, ToolSpec
from envs.mcp.env import McpEnv
from envs.policy import Policy
from envs.registry import register
from workers.client import run_rollout
from workers.config import Settings
from workers.policy_server import PolicyServer
from workers.worker import RunningWorker
from workflows.rollout import RolloutInput, RolloutResult


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    """Settings for a test worker: private queue, private workspace root."""
    values: dict[str, object] = {
        "task_queue": f"test-{uuid.uuid4().hex[:10]}",
        "node_id": f"node-{uuid.uuid4().hex[:6]}",
        "workspace_root": tmp_path / "workspaces",
        "data_dir": tmp_path / "data",
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


COUNTER_SERVER = Path(__file__).parent / "envs" / "mcp" / "counter_server.py"


class CounterEnv(McpEnv):
    """A stateful env (a counter server) that can NOT be rebuilt after losing its server."""

    name = "counter"
    mcp_servers = {
        "counter": {
            "command": "python",
            "args": [str(COUNTER_SERVER)],
            "tool_timeout_s": 10,
            "tool_timeouts": {"sleep": 1.0},
        }
    }

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        """1 when the live counter equals the ground truth: the reward reads tool state."""
        value = await self.run_tool(rollout_id, "get")
        return Reward(total=float(value.text == str(ground_truth)), info={"counter": value.text})


class ReplayableCounterEnv(CounterEnv):
    """The same counter, declared replayable: re-running its increments rebuilds its state."""

    name = "counter-replayable"
    replayable = True


class SlowCounterEnv(CounterEnv):
    """The counter with a `sleep` tool allowed to run for ten minutes (a long tool call)."""

    name = "counter-slow"
    mcp_servers = {"counter": {"command": "python", "args": [str(COUNTER_SERVER)], "tool_timeout_s": 600}}


register(CounterEnv.name, CounterEnv)
register(SlowCounterEnv.name, SlowCounterEnv)
register(ReplayableCounterEnv.name, ReplayableCounterEnv)


class ScriptedPolicy(Policy):
    """Plays a fixed list of assistant turns; `before_turn[i]` runs before turn i is answered."""

    name = "scripted"

    def __init__(self, turns: Sequence[Message], before_turn: dict[int, Callable[[], None]] | None = None) -> None:
        self.turns = list(turns)
        self.before_turn = before_turn or {}

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        done = sum(m.role == "assistant" for m in messages)
        if done in self.before_turn:
            self.before_turn.pop(done)()
        return self.turns[min(done, len(self.turns) - 1)]


def call(name: str, arguments: dict[str, Any] | None = None, *, raw: str | None = None) -> ToolCall:
    """A tool call with a fresh id."""
    return ToolCall(id=f"c{uuid.uuid4().hex[:6]}", name=name, arguments=arguments or {}, raw_arguments=raw)


async def play(
    client: Client, worker: RunningWorker, policy: Policy, *, env: str, task: Task, **fields: Any
) -> RolloutResult:
    """Serve `policy` over real HTTP and run one rollout of `task` on `worker` against it."""
    async with PolicyServer(policy) as server:
        return await run_rollout(
            client,
            RolloutInput(env=env, task=task, model=ModelConfig(base_url=server.url), **fields),
            task_queue=worker.task_queue,
        )
