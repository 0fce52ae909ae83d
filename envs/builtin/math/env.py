"""The math environment: arithmetic tasks, a calculator MCP server per rollout, an <answer> reward."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gymflow.envs.builtin.math.data import generate_tasks, load_jsonl
from gymflow.envs.builtin.math.rewards import answer_reward
from gymflow.envs.contract import Message, Reward, Task
from gymflow.envs.mcp.env import McpEnv

SYSTEM_PROMPT = (
    "You are a careful math assistant. Use the calculator tools for every arithmetic step; "
    "do not compute in your head. When you are done, write the final answer on the last line "
    "as <answer>NUMBER</answer>."
)


class MathEnv(McpEnv):
    """Arithmetic with a calculator; reward 1 for a correct <answer>."""

    name = "math"
    system_prompt = SYSTEM_PROMPT
    stateless = True  # the calculator keeps no state: a lost rollout just gets a fresh server
    fused_turns = True  # tool calls may re-run: one activity per turn (gymflow.activities.turn)
    offline_reward = True  # the reward reads the final answer alone: stored trajectories can be rescored
    mcp_servers = {"calculator": {"command": "python", "args": ["-m", "gymflow.envs.builtin.math.servers.calculator"]}}
    policies = {
        "calculator": "gymflow.envs.builtin.math.policy:CalculatorPolicy",  # solves generated tasks with the tools
        "reference": "gymflow.envs.builtin.math.policy:CalculatorPolicy",
        # the learnable policy at its start: the trainer's baseline
        "softmax": "gymflow.envs.builtin.math.learned:SoftmaxPolicy",
    }

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        del rollout_id, kwargs
        return answer_reward(completion, ground_truth)

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> Iterable[Task]:
        """`generated` (kwargs n, seed, difficulty: default a mix of 1-4 operations) or a JSONL path."""
        if name == "generated":
            difficulty = kwargs.get("difficulty", (1, 2, 3, 4))
            return generate_tasks(int(kwargs.get("n", 16)), seed=int(kwargs.get("seed", 0)), difficulty=difficulty)
        return load_jsonl(Path(name))

    @classmethod
    def dataset_preprocess(cls, example: Mapping[str, Any], **kwargs: Any) -> Task:
        """benchmax-style rows {"task": ..., "answer": ...} as well as full Task objects."""
        if "task" in example and "prompt" not in example:
            return Task(
                id=str(example.get("id", kwargs.get("index", 0))),
                prompt=str(example["task"]),
                ground_truth=example.get("answer"),
            )
        return super().dataset_preprocess(example, **kwargs)
