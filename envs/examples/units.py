"""Unit conversion with a calculator MCP server: an environment in 30 lines."""

from typing import Any

from gymflow.envs.builtin.math.rewards import extract_answer, math_equivalent
from gymflow.envs.contract import Message, Reward, Task
from gymflow.envs.mcp.env import McpEnv

MILES = [3, 7, 12.5, 26.2, 42, 100]


class UnitsEnv(McpEnv):
    name = "units"
    system_prompt = "Convert units with the calculator tools. End with <answer>NUMBER</answer>."
    stateless = True  # the calculator keeps no state: a lost rollout just gets a fresh server
    fused_turns = True  # tool calls may re-run: one activity per turn (gymflow.activities.turn)
    # Any MCP server works here, by config alone (the `mcpServers` format of Claude Desktop).
    mcp_servers = {"calculator": {"command": "python", "args": ["-m", "gymflow.envs.builtin.math.servers.calculator"]}}
    policies = {"reference": "gymflow.envs.examples.units_policy:ConvertPolicy"}  # `gymflow eval units`, no model

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        answer = extract_answer(completion[-1].content) if completion else None
        correct = answer is not None and math_equivalent(answer, str(ground_truth), rel_tol=1e-3)
        return Reward(total=float(correct), components={"correct": float(correct)}, info={"answer": answer})

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> list[Task]:
        return [Task(id=f"miles-{m}", prompt=f"How many km is {m} miles?", ground_truth=m * 1.609344) for m in MILES]
