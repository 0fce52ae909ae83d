"""Sums with a calculator that reports which six it runs on (an env package of plain Python).

A class of benchmax's shape that imports nothing of anyone's: `list_tools`, `run_tool`,
`compute_reward` and a dataset. Its twin package (pinned_a) is the same env pinning another six.
"""

from __future__ import annotations

import re
from typing import Any

import six


class SumsEnv:
    """Add two numbers with the `add` tool; `dependency` says which six this venv has."""

    system_prompt = "Use the add tool, then answer with the sum inside <answer></answer>."

    async def list_tools(self) -> list[dict[str, Any]]:
        number = {"type": "number"}
        return [
            {
                "name": "add",
                "description": "a + b",
                "input_schema": {"type": "object", "properties": {"a": number, "b": number}, "required": ["a", "b"]},
            },
            {
                "name": "dependency",
                "description": "The version of six this env runs on",
                "input_schema": {"type": "object", "properties": {}},
            },
        ]

    async def run_tool(self, rollout_id: str, tool_name: str, **tool_args: Any) -> str:
        if tool_name == "add":
            return repr(tool_args["a"] + tool_args["b"])
        if tool_name == "dependency":
            return f"six {six.__version__}"
        raise ValueError(f"no tool {tool_name}")

    async def compute_reward(
        self, rollout_id: str, completion: str, ground_truth: Any, **kwargs: Any
    ) -> dict[str, float]:
        found = re.search(r"<answer>(.*?)</answer>", completion, re.S)
        try:
            correct = found is not None and abs(float(found.group(1)) - float(ground_truth)) < 1e-9
        except ValueError:
            correct = False
        return {"correct": float(correct)}

    @classmethod
    def load_dataset(cls, name: str, n: int = 4, **kwargs: Any) -> list[dict[str, Any]]:
        return [
            {"id": f"{name}-{i}", "prompt": f"What is {i} + {i * 10}?", "ground_truth": i + i * 10}
            for i in range(1, n + 1)
        ]
