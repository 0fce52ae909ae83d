"""Harness rollouts end to end: unmodified programs written with the official openai and anthropic
clients play file tasks through the node's gateway, against a scripted upstream over real HTTP."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from harness_support import AGENTS, FileTaskPolicy, agent_python, file_task, harness_env_file
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.envs.contract import TerminationReason
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.schema import RolloutInput

PROGRAMS = {
    "chat": ["openai_agent.py", "--api", "chat"],
    "chat-stream": ["openai_agent.py", "--api", "chat-stream"],
    "responses": ["openai_agent.py", "--api", "responses"],
    "responses-stream": ["openai_agent.py", "--api", "responses-stream"],
    "responses-chain": ["openai_agent.py", "--api", "responses-chain"],
    "messages": ["anthropic_agent.py"],
    "messages-stream": ["anthropic_agent.py", "--stream"],
}


@pytest.fixture(scope="module")
async def upstream() -> PolicyServer:
    async with PolicyServer(FileTaskPolicy(), record_requests=True, record_tokens=True) as server:
        yield server


@pytest.mark.parametrize("api", list(PROGRAMS))
async def test_program_plays_a_task_through_the_gateway(
    api: str, client: Client, worker: RunningWorker, upstream: PolicyServer, tmp_path: Path
) -> None:
    script, *args = PROGRAMS[api]
    env = harness_env_file(tmp_path, [str(agent_python()), str(AGENTS / script), *args])
    task = file_task(0, prefix=api)
    answered = len(upstream.requests)
    result = await run_rollout(
        client,
        RolloutInput(env=str(env), task=task, model=ModelConfig(base_url=upstream.url, tokens="vllm")),
        task_queue=worker.task_queue,
        workflow_id=f"harness-{api}-{uuid.uuid4().hex[:6]}",
    )
    assert result.termination is TerminationReason.AGENT_EXIT, result
    assert result.reward is not None and result.reward.total == 1.0, result
    assert result.turns == 2 and len(upstream.requests) - answered == 2
    assert result.program is not None and result.program.exit_code == 0, result.program
    assert "answer: done" in result.program.output
    assert result.messages[-1].content == f"done: {next(iter(task.ground_truth))}"
    sequence = result.token_sequence()  # the second prompt extends the first prompt + completion
    assert len(result.token_segments()) == 1 and sequence.ids == result.token_segments()[0].ids
