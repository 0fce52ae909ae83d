"""Fused turns (activities.turn) are for stateless envs only, and what a rollout asks is honoured
only where it is sound; the classic and fused plans give the same trajectory (test_rollout.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp_support import activity_types
from temporalio.client import Client

from envs.contract import BaseEnv, Message, Reward, Task, ToolResult, ToolSpec
from envs.mcp.envfile import EnvFileError, env_class_from_file
from support import ScriptedPolicy, call, play
from workers.worker import RunningWorker
from workflows.schema import RolloutLimits


def test_only_a_stateless_env_may_fuse_its_turns(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="stateless"):

        class Stateful(BaseEnv):  # a counter would count twice on a retried turn
            fused_turns = True

            async def list_tools(self) -> list[ToolSpec]:
                return []

            async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
                return ToolResult(text="")

            async def compute_reward(
                self, rollout_id: str, completion: list[Message], ground_truth: Any, **_: Any
            ) -> Reward:
                return Reward(total=0.0)

    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump({"mcpServers": {"c": {"command": "true"}}, "fused_turns": True}))
    with pytest.raises(EnvFileError, match=r"fused_turns.*stateless: true"):
        env_class_from_file(path)
    path.write_text(yaml.safe_dump({"mcpServers": {"c": {"command": "true"}}, "fused_turns": True, "stateless": True}))
    assert env_class_from_file(path).fused_turns


async def test_a_stateful_env_keeps_one_activity_per_tool_call_when_a_rollout_asks_for_fused_turns(
    client: Client, worker: RunningWorker
) -> None:
    script = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("increment", {"by": 2}), call("increment", {"by": 3})]),
            Message(role="assistant", content="done"),
        ]
    )
    task = Task(id="count-to-5", prompt="count", ground_truth="5")
    result = await play(client, worker, script, env="counter", task=task, fuse_turns=True)
    assert result.reward is not None and result.reward.total == 1.0
    assert await activity_types(client, result.rollout_id) == [
        "init_rollout", "generate", "call_tool", "call_tool", "generate", "compute_reward",
    ]  # fmt: skip


async def test_fused_turns_keep_the_tool_budget_and_its_refusals(client: Client, worker: RunningWorker) -> None:
    script = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("add", {"a": 1, "b": 1}), call("add", {"a": 2, "b": 2})]),
            Message(role="assistant", tool_calls=[call("add", {"a": 3, "b": 3})]),
            Message(role="assistant", content="<answer>2</answer>"),
        ]
    )
    task = Task(id="budget", prompt="p", ground_truth="2")
    result = await play(client, worker, script, env="math", task=task, limits=RolloutLimits(max_tool_calls=2))
    observations = [m.content for m in result.messages if m.role == "tool"]
    assert observations[:2] == ["2", "4"] and "budget exhausted" in observations[2]
    assert result.tool_calls == 2 and result.termination.value == "tool_budget"
    assert result.reward is not None  # scored classically: the rollout stopped on its budget, not an answer
    assert await activity_types(client, result.rollout_id) == [
        "init_rollout",
        "play_turn",
        "play_turn",
        "compute_reward",
    ]
