"""What the rescore and resume tests share: cheap envs whose reward machinery fails on chosen tasks, and
a policy that answers in one turn (importable by a worker subprocess too: PYTHONPATH=tests)."""

from __future__ import annotations

import hashlib
import operator
import os
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, ClassVar

from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.contract import Message, Reward, Task, ToolSpec
from gymflow.envs.errors import RewardError
from gymflow.envs.policy import Policy
from gymflow.envs.registry import register
from support import InProcessMathEnv

FAILING_TASKS = "GYMFLOW_TEST_FAILING_TASKS"
"""Comma-separated task ids whose reward `TransientMathEnv` fails in this process (a broken verifier)."""


def flaky(task_id: str) -> bool:
    """About one task in eight: its reward machinery fails (deterministically, by its id)."""
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 8 == 0


class OneStepMathEnv(InProcessMathEnv):
    """The in-process math env with one operation per task."""

    name = "math-onestep"

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> list[Task]:
        return generate_tasks(int(kwargs.get("n", 16)), seed=int(kwargs.get("seed", 0)), difficulty=1)


class FlakyMathEnv(OneStepMathEnv):
    """Its verifier crashes on the `flaky` tasks: their rollouts are infra-failed (`reward_error`)."""

    name = "math-inproc-flaky"
    offline_reward = False

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        if flaky(str(kwargs.get("task_id"))):
            raise RewardError("the verifier crashed")
        return await super().compute_reward(rollout_id, completion, ground_truth, **kwargs)


class TransientMathEnv(OneStepMathEnv):
    """Its verifier crashes on the tasks `GYMFLOW_TEST_FAILING_TASKS` names, in the process that sets it."""

    name = "math-transient"

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        if str(kwargs.get("task_id")) in os.environ.get(FAILING_TASKS, "").split(","):
            raise RewardError("the verifier crashed")
        return await super().compute_reward(rollout_id, completion, ground_truth, **kwargs)


for _env in (OneStepMathEnv, FlakyMathEnv, TransientMathEnv):
    register(_env.name, _env)


class MentalMathPolicy(Policy):
    """Answers in one turn, without tools: right, except that it adds where it should subtract."""

    name = "mental"
    OPS: ClassVar[dict[str, Callable[[Fraction, Fraction], Fraction]]] = {
        "+": operator.add,
        "-": operator.add,  # the mistake: some rewards are 0
        "*": operator.mul,
        "/": operator.truediv,
    }

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        prompt = next(m.content for m in messages if m.role == "user")
        match = re.search(r"expression: (\d+) ([-+*/]) (\d+)", prompt)
        if match is None:
            return Message(role="assistant", content="<answer>0</answer>")
        value = self.OPS[match[2]](Fraction(match[1]), Fraction(match[3]))
        shown = str(value.numerator) if value.denominator == 1 else str(float(value))
        return Message(role="assistant", content=f"The result is <answer>{shown}</answer>.")
