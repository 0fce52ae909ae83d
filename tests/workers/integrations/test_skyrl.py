"""The skyrl-gym adapter: real episodes of math and sheets through `skyrl_gym.make`, as SkyRL runs them.

SkyRL's generator calls the env from worker threads; here a policy plays the model, reading the
conversation the env hands out (hermes tools in the system prompt, tool responses as user
messages) and answering in text, exactly what a model behind SkyRL would see and write. Correct
play must score 1.0 and wrong play 0.0 on both envs: benchmax's SkyRL adapter handed its reward a
string where it expected messages, so every reward was 0 and every run learned nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import skyrl_gym
from omegaconf import OmegaConf
from pydantic import ValidationError

from gymflow.activities.env_schema import ComputeRewardInput
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.envs.builtin.sheets.env import SheetsEnv
from gymflow.envs.builtin.sheets.generate import CACHE_ENV
from gymflow.envs.builtin.sheets.isolation import choose
from gymflow.envs.builtin.sheets.policy import ReferencePolicy
from gymflow.envs.contract import Message, Task, ToolCall, ToolSpec
from gymflow.envs.policy import Policy
from gymflow.envs.wire import chat
from gymflow.workers.trainers.integrations.skyrl import GymflowTextEnv, dataset_row
from gymflow.workers.worker import RunningWorker

NO_OP_SHEET = "import openpyxl\nwb = openpyxl.load_workbook('input.xlsx')\nwb.save('output.xlsx')\n"


class Wrong(Policy):
    """Plays like `inner` but gets the answer wrong: a wrong number, or a workbook left unsolved."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        reply = self.inner.respond(messages, tools)
        if any(call.name == "run_python" for call in reply.tool_calls):
            return reply.model_copy(
                update={"tool_calls": [ToolCall(id="w", name="run_python", arguments={"code": NO_OP_SHEET})]}
            )
        if not reply.tool_calls and "<answer>" in reply.content:
            return Message(role="assistant", content="<answer>-987654321</answer>")
        return reply


@pytest.fixture(autouse=True)
def sheets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "sheets-cache"))
    yield


def play(
    env_class: str, config: dict[str, Any], row: dict[str, Any], policy: Policy
) -> tuple[list[dict[str, Any]], GymflowTextEnv]:
    """One SkyRL episode (synchronous, as SkyRL's generator thread runs it); the last step output."""
    env = skyrl_gym.make(env_class, env_config=OmegaConf.create(config), extras=row)
    assert isinstance(env, GymflowTextEnv)
    conversation, _ = env.init(row["prompt"])
    outputs = []
    for _ in range(20):
        request = chat.read_request(conversation)  # the model's view: hermes tools, text history
        action = chat.hermes_content(policy.respond(request.messages, request.tools))
        output = env.step(action)
        outputs.append(output)
        conversation += [{"role": "assistant", "content": action}, *output["observations"]]
        if output["done"]:
            break
    env.close()
    return outputs, env


def config_for(worker: RunningWorker, temporal_address: str) -> dict[str, Any]:
    return {"temporal_address": temporal_address, "task_queue": worker.task_queue, "limits": {"max_turns": 12}}


def math_task() -> Task:
    return generate_tasks(1, seed=5, difficulty=3)[0]


def sheets_task() -> Task:
    return next(iter(SheetsEnv.load_dataset("generated", n=1, seed=0)))


@pytest.mark.parametrize(
    ("env", "make_task", "policy"),
    [("math", math_task, CalculatorPolicy()), ("sheets", sheets_task, ReferencePolicy())],
    ids=["math", "sheets"],
)
@pytest.mark.heavy
async def test_correct_play_scores_one_and_wrong_play_zero(
    worker: RunningWorker, temporal_address: str, env: str, make_task: Any, policy: Policy
) -> None:
    if env == "sheets" and choose().refuse_code:
        pytest.skip("sheets' run_python refuses without bubblewrap here: needs bubblewrap: apt-get install bubblewrap")
    task = make_task()
    row = dataset_row(env, task)
    assert row["env_class"] == f"gymflow-{env}"
    config = config_for(worker, temporal_address)
    right, right_env = await asyncio.to_thread(play, row["env_class"], config, row, policy)
    wrong, wrong_env = await asyncio.to_thread(play, row["env_class"], config, row, Wrong(policy))
    assert [o["reward"] for o in right] == [0.0] * (len(right) - 1) + [1.0]
    assert right[-1]["done"] and right[-1]["metadata"]["termination"] == "final_answer"
    assert wrong[-1]["done"] and wrong[-1]["reward"] == 0.0 and not wrong[-1]["metadata"]["infra_failed"]
    assert len(right) >= 2 and len(wrong) >= 2  # real multi-turn episodes: tool calls, then an answer
    for played in (right_env, wrong_env):
        trajectory = played.trajectory
        assert trajectory is not None and trajectory.tool_calls >= 1
        # What the reward saw: typed messages, the model's text as assistant messages, never a string.
        assert trajectory.messages[-1].role == "assistant" and trajectory.messages[0].role == "system"
    assert right_env.trajectory and right_env.trajectory.reward and right_env.trajectory.reward.total == 1.0


async def test_a_row_without_a_gymflow_task_is_built_from_prompt_and_reward_spec(
    worker: RunningWorker, temporal_address: str
) -> None:
    task = math_task()
    row = {
        "prompt": [{"role": "user", "content": task.opening_messages()[0].content}],
        "reward_spec": {"method": "rule", "ground_truth": task.ground_truth},
        "extra_info": {"task_id": task.id},
    }
    config = {**config_for(worker, temporal_address), "env": "math"}
    outputs, _ = await asyncio.to_thread(play, "gymflow", config, row, CalculatorPolicy())
    assert outputs[-1]["reward"] == 1.0


def test_a_reward_input_cannot_carry_a_string_for_the_conversation() -> None:
    task = Task(id="t", prompt="p", ground_truth="1")
    with pytest.raises(ValidationError, match="messages"):
        ComputeRewardInput(env="math", state_key="k", messages="<answer>1</answer>", task=task)  # type: ignore[arg-type]
