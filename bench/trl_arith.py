"""bench/trl_gpu.py's env: tagged two-operand arithmetic, as a Python env with no tool server.

Stateless, no tools, one model turn: what a TRL-alone run does too, so the two are timed on the same
work. Reward 1 for the right number inside <answer></answer>, 0.1 for the tags around anything else,
0 without them.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gymflow.envs.contract import BaseEnv, Message, Reward, Task, ToolSpec
from gymflow.envs.errors import ToolError

PROMPT = "What is {a} {op} {b}? Reply with only the result inside <answer></answer>."
ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")
NAME = "arith-tagged"


def tagged(text: str, truth: int) -> float:
    found = ANSWER.search(text)
    if found is None:
        return 0.0
    return 1.0 if int(found.group(1)) == truth else 0.1


def make_tasks(n: int, seed: int) -> list[Task]:
    """`n` seeded two-operand tasks (a, b in 1..99; +, - or *)."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        a, b, op = rng.randint(1, 99), rng.randint(1, 99), rng.choice("+-*")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        tasks.append(Task(id=f"arith-{seed}-{i}", prompt=PROMPT.format(a=a, op=op, b=b), ground_truth=value))
    return tasks


class TaggedArithmetic(BaseEnv):
    name = NAME
    system_prompt = ""
    stateless = True
    fused_turns = True

    async def list_tools(self) -> list[ToolSpec]:
        return []

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> str:
        raise ToolError(f"{tool_name}: this env has no tools")

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        text = completion[-1].content if completion else ""
        return Reward(total=tagged(text, int(ground_truth)))

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> Iterable[Task]:
        """`generated` (kwargs n, seed) or a JSONL file of Tasks."""
        if name == "generated":
            return make_tasks(int(kwargs.get("n", 64)), int(kwargs.get("seed", 0)))
        return [Task.model_validate(json.loads(line)) for line in Path(name).read_text().splitlines() if line]
