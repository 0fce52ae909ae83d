"""Envs that answer the model's final answers (`BaseEnv.env_turns`): the rollout goes on with the
env's user message until the env says the episode is over; the same in a trainer-driven session."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.activities.session_schema import SessionInput
from gymflow.envs.contract import BaseEnv, Message, Reward, Task, TerminationReason, ToolResult, ToolSpec
from gymflow.envs.policy import Policy
from gymflow.envs.registry import register
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.sdk.sessions import start_session
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker


class HigherLowerEnv(BaseEnv):
    """Guess the number: the env answers each wrong guess "higher" or "lower"."""

    name = "higher-lower"
    env_turns = True

    async def list_tools(self) -> list[ToolSpec]:
        return []

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
        raise NotImplementedError

    async def env_response(self, rollout_id: str, messages: list[Message]) -> list[Message] | None:
        prompt = next(m.content for m in messages if m.role == "user")
        secret = int(prompt.rsplit(" ", 1)[-1])  # the prompt names it (the test's is no secret)
        guess = int(messages[-1].content)
        if guess == secret:
            return None
        return [Message(role="user", content="higher" if guess < secret else "lower")]

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        return Reward.of({"found": float(completion[-1].content == str(ground_truth))})


register(HigherLowerEnv.name, HigherLowerEnv)


class Bisect(Policy):
    name = "bisect"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        low, high, guess = 1, 100, None
        for message in messages[[m.role for m in messages].index("user") + 1 :]:
            if message.role == "assistant":
                guess = int(message.content)
            elif guess is not None:
                low, high = (guess + 1, high) if message.content == "higher" else (low, guess - 1)
        return Message(role="assistant", content=str((low + high) // 2))


def task(secret: int) -> Task:
    return Task(id=f"guess-{secret}", prompt=f"Guess my number; it is {secret}", ground_truth=secret)


async def test_a_rollout_goes_on_with_the_envs_answers(client: Client, worker: RunningWorker) -> None:
    async with PolicyServer(Bisect()) as server:
        handle = await start_rollout(
            client,
            RolloutInput(env="higher-lower", task=task(81), model=ModelConfig(base_url=server.url)),
            task_queue=worker.task_queue,
        )
        trajectory = await handle.result()
    said = [m.content for m in trajectory.messages if m.role == "user"][1:]
    assert said == ["higher", "higher", "lower"]  # to 50, 75 and 88; then 81
    assert trajectory.termination == TerminationReason.FINAL_ANSWER and trajectory.messages[-1].content == "81"
    assert trajectory.reward is not None and trajectory.reward.total == 1.0 and trajectory.turns == len(said) + 1


async def test_a_session_answers_a_final_answer_with_the_envs_message(client: Client, worker: RunningWorker) -> None:
    session = await start_session(
        client, SessionInput(env="higher-lower", task=task(30)), task_queue=worker.task_queue,
        workflow_id=f"session-{uuid.uuid4().hex[:8]}",
    )  # fmt: skip
    await session.reset()
    first = await session.step(Message(role="assistant", content="50"))
    assert not first.done and [m.content for m in first.observations] == ["lower"]
    assert first.observations[0].role == "user"
    done = await session.step(text="30")
    assert done.done and done.observations == [] and done.reward is not None and done.reward.total == 1.0
    assert (await session.close()).turns == 2
