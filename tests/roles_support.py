"""A solver and its critic: an env of two roles, its task and the scripted models that play it
(tests/workflows/test_rollout_roles.py; shown in docs/guides/rollout-roles.md)."""

from __future__ import annotations

from typing import Any

from gymflow.envs.contract import BaseEnv, Message, Reward, Task, ToolSpec
from gymflow.envs.registry import register

ADD = ToolSpec(
    name="add",
    description="a + b",
    input_schema={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
)


# --8<-- [start:env]
class SolverCritic(BaseEnv):
    """The solver answers (with a calculator at hand), the critic reviews, the solver revises."""

    name = "solver-critic"
    system_prompt = "Solve the task. A critic reviews the answer."
    roles = ("solver", "critic")  # the solver opens
    stateless = True

    async def list_tools(self) -> list[ToolSpec]:
        return [ADD]

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> str:
        return str(tool_args["a"] + tool_args["b"])

    async def next_role(self, rollout_id: str, messages: list[Message]) -> str | None:
        answers = sum(1 for m in messages if m.role == "assistant" and not m.tool_calls)
        return {1: "critic", 2: "solver"}.get(answers)  # one review, one revision, then done

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        return Reward.of({"correct": float(str(ground_truth) in completion[-1].content)})


register(SolverCritic.name, SolverCritic)
# --8<-- [end:env]


class Impostor(SolverCritic):
    """Hands the turn to a role it never declared."""

    name = "solver-critic-impostor"

    async def next_role(self, rollout_id: str, messages: list[Message]) -> str | None:
        return "judge"


register(Impostor.name, Impostor)


class HostedSolverCritic(SolverCritic):
    """The same, with a host who hands the turn over in words (`env_turns`: after `next_role`)."""

    name = "solver-critic-hosted"
    env_turns = True

    async def env_response(self, rollout_id: str, messages: list[Message]) -> list[Message] | None:
        return [Message(role="user", content="Over to the next speaker.")]


register(HostedSolverCritic.name, HostedSolverCritic)


class SoloEnv(BaseEnv):
    """An env of one unnamed policy."""

    name = "solver-alone"

    async def list_tools(self) -> list[ToolSpec]:
        return [ADD]

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> str:
        return str(tool_args["a"] + tool_args["b"])

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        return Reward.of(0.0)


register(SoloEnv.name, SoloEnv)


def task() -> Task:
    return Task(id="two-plus-two", prompt="What is 2 + 2?", ground_truth=4)
