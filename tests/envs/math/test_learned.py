"""The learnable math policy: its sampled choices are recoverable from the conversation alone, its
gradient is right, it starts weak, and parameters that prefer the right choices solve the tasks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mcp import Client

from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.env import MathEnv
from gymflow.envs.builtin.math.learned import TOOLS, Decision, SoftmaxParams, SoftmaxPolicy, decisions
from gymflow.envs.builtin.math.policy import play
from gymflow.envs.builtin.math.rewards import answer_reward
from gymflow.envs.builtin.math.servers.calculator import server


def expert() -> SoftmaxParams:
    params = SoftmaxParams.zeros()
    params.turn[0] = 8.0
    params.tool += 12.0 * np.eye(len(TOOLS))
    params.swap -= 12.0
    return params


class Recording(SoftmaxPolicy):
    """Keeps the decisions it sampled, to compare with what `decisions` recovers."""

    def __init__(self, params: SoftmaxParams, seed: int) -> None:
        super().__init__(params, seed=seed)
        self.sampled: list[Decision] = []

    def respond(self, messages, tools):  # type: ignore[no-untyped-def]
        message, chosen = self.act(messages, tools)
        self.sampled += chosen
        return message


async def test_decisions_are_recovered_from_the_conversation() -> None:
    rng = np.random.default_rng(0)
    params = SoftmaxParams(rng.normal(size=3), rng.normal(size=(5, 5)), rng.normal(size=5))
    async with Client(server) as client:
        for i, task in enumerate(generate_tasks(20, seed=5, difficulty=(1, 2, 3))):
            policy = Recording(params, seed=i)
            messages = await play(policy, task, client, max_turns=10)
            recovered = decisions(messages)
            assert [(d.kind, d.choice, d.op) for d in recovered] == [(d.kind, d.choice, d.op) for d in policy.sampled]
            assert sum(params.logprob(d) for d in recovered) == pytest.approx(
                sum(params.logprob(d) for d in policy.sampled)
            )


def test_the_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(1)
    params = SoftmaxParams(rng.normal(size=3), rng.normal(size=(5, 5)), rng.normal(size=5))
    chosen = [Decision("turn", 1, features=(1.0, 0.5, 0.0)), Decision("tool", 2, 1), Decision("swap", 0, 3),
              Decision("tool", 0, 1), Decision("turn", 0, features=(1.0, 0.0, 1.0))]  # fmt: skip
    grad = params.grad(chosen)
    eps = 1e-6
    for array, g in zip(params.arrays(), grad.arrays(), strict=True):
        for index in np.ndindex(array.shape):
            array[index] += eps
            up = sum(params.logprob(d) for d in chosen)
            array[index] -= 2 * eps
            down = sum(params.logprob(d) for d in chosen)
            array[index] += eps
            assert g[index] == pytest.approx((up - down) / (2 * eps), abs=1e-5)


async def test_zero_parameters_are_weak_and_the_expert_parameters_solve_the_tasks() -> None:
    tasks = generate_tasks(40, seed=9, difficulty=(1, 2, 3))
    async with Client(server) as client:

        async def mean(policy: SoftmaxPolicy) -> float:
            rewards = [answer_reward(await play(policy, t, client, max_turns=10), t.ground_truth).total for t in tasks]
            return float(np.mean(rewards))

        assert await mean(SoftmaxPolicy(seed=0)) < 0.2
        assert await mean(SoftmaxPolicy(expert(), seed=0)) == 1.0


def test_parameters_are_json_and_checked() -> None:
    params = expert()
    again = SoftmaxParams.from_json(json.loads(json.dumps(params.to_json())))
    assert all(np.array_equal(a, b) for a, b in zip(params.arrays(), again.arrays(), strict=True))
    with pytest.raises(ValueError, match="not gymflow-softmax-policy/1"):
        SoftmaxParams.from_json({"format": "pickle"})
    bad = params.to_json() | {"tool": [[0.0]]}
    with pytest.raises(ValueError, match="shapes"):
        SoftmaxParams.from_json(bad)
    assert isinstance(MathEnv.baseline_policy("softmax"), SoftmaxPolicy)
