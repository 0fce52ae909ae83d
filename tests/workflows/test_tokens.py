"""Token-level trajectories of real multi-turn rollouts against the baseline policy server.

The server tokenises every prompt and completion itself (gymflow.workers.servers.byte_tokens) and keeps a record;
the trajectory's concatenated ids must equal that record exactly, and the loss mask must cover
exactly the completions.
"""

from __future__ import annotations

from typing import Literal

import pytest
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.envs.contract import Message, TerminationReason
from gymflow.envs.errors import TokenMismatch
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers import byte_tokens
from gymflow.workers.servers.policy import PolicyServer, TokenRecord
from gymflow.workers.worker import RunningWorker
from support import ScriptedPolicy, call


def assert_exact(sequence_ids: list[int], mask: list[int], records: list[TokenRecord]) -> None:
    """`sequence_ids` is what the server saw, turn after turn; `mask` is 1 exactly on its completions."""
    expected_mask = [0] * len(sequence_ids)
    for record in records:
        start = len(record.prompt_ids)
        assert sequence_ids[:start] == record.prompt_ids
        assert sequence_ids[start : start + len(record.completion_ids)] == record.completion_ids
        expected_mask[start : start + len(record.completion_ids)] = [1] * len(record.completion_ids)
    last = records[-1]
    assert sequence_ids == last.prompt_ids + last.completion_ids
    assert mask == expected_mask


@pytest.mark.parametrize("style", ["vllm", "sglang"])
@pytest.mark.parametrize("tool_format", ["native", "hermes"])
async def test_multi_turn_token_sequence_equals_the_servers_record(
    client: Client, worker: RunningWorker, style: Literal["vllm", "sglang"], tool_format: Literal["native", "hermes"]
) -> None:
    task = generate_tasks(1, seed=3, difficulty=3)[0]
    async with PolicyServer(CalculatorPolicy(), record_tokens=True) as server:
        model = ModelConfig(base_url=server.url, tokens=style, tool_format=tool_format)
        result = await run_rollout(
            client, RolloutInput(env="math", task=task, model=model), task_queue=worker.task_queue
        )
    assert result.termination == TerminationReason.FINAL_ANSWER and result.reward and result.reward.total == 1.0
    assert result.turns >= 3 and len(server.records) == result.turns
    assert [t.extends for t in result.tokens] == [None] + [True] * (result.turns - 1)
    sequence = result.token_sequence()
    assert_exact(sequence.ids, sequence.loss_mask, server.records)
    assert sequence.logprobs is not None and len(sequence.logprobs) == len(sequence.ids)
    # The decoded sequence is the conversation in the documented template, ending with the answer.
    text = byte_tokens.decode(sequence.ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith(result.messages[-1].content + "<|im_end|>")
    # History holds only each turn's new tokens: the stored prompt ids add up to the sequence's prompt part.
    assert sum(len(t.prompt_ids) + len(t.completion_ids) for t in result.tokens) == len(sequence.ids)


async def test_token_data_off_by_default(client: Client, worker: RunningWorker, calculator_policy_url: str) -> None:
    task = generate_tasks(1, seed=3)[0]
    model = ModelConfig(base_url=calculator_policy_url)
    result = await run_rollout(client, RolloutInput(env="math", task=task, model=model), task_queue=worker.task_queue)
    assert result.reward and result.tokens == []


async def test_a_history_the_template_renders_differently_is_reported_not_glued(
    client: Client, worker: RunningWorker
) -> None:
    # A malformed native call: the model wrote `{"a": 1,` but history must send valid JSON, so the
    # next prompt renders the call differently from what was generated.
    policy = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("add", raw='{"a": 1,')]),
            Message(role="assistant", content="<answer>1</answer>"),
        ]
    )
    async with PolicyServer(policy, record_tokens=True) as server:
        model = ModelConfig(base_url=server.url, tokens="vllm")
        task = generate_tasks(1, seed=0)[0]
        result = await run_rollout(
            client, RolloutInput(env="math", task=task, model=model), task_queue=worker.task_queue
        )
    assert [t.extends for t in result.tokens] == [None, False]
    assert result.tokens[1].prompt_ids == server.records[1].prompt_ids  # recorded whole, nothing lost
    with pytest.raises(TokenMismatch, match="turn 1's prompt does not extend"):
        result.token_sequence()
