"""Harness rollouts end to end: unmodified programs written with the official openai and anthropic
clients play file tasks through the node's gateway, against a scripted upstream over real HTTP."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from harness_support import AGENTS, FileTaskPolicy, agent_python, file_task, harness_env_file, replays
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.envs.contract import TerminationReason
from gymflow.envs.wire.tokens import TokenMismatch
from gymflow.workers.cli.inspect import inspect_workflow, render
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker

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


async def test_programs_play_tasks_through_the_gateway_in_every_api(
    client: Client, worker: RunningWorker, upstream: PolicyServer, tmp_path: Path
) -> None:
    """One rollout per API and client, at once (each program's interpreter start is most of its time)."""
    answered = len(upstream.requests)

    async def play(api: str) -> None:
        script, *args = PROGRAMS[api]
        directory = tmp_path / api
        directory.mkdir()
        env = harness_env_file(directory, [str(agent_python()), str(AGENTS / script), *args])
        task = file_task(0, prefix=api)
        result = await run_rollout(
            client,
            RolloutInput(env=str(env), task=task, model=ModelConfig(base_url=upstream.url, tokens="vllm")),
            task_queue=worker.task_queue,
            workflow_id=f"harness-{api}-{uuid.uuid4().hex[:6]}",
        )
        assert result.termination is TerminationReason.AGENT_EXIT, (api, result)
        assert result.reward is not None and result.reward.total == 1.0, (api, result)
        assert result.turns == 2, (api, result.turns)
        assert result.program is not None and result.program.exit_code == 0, (api, result.program)
        assert "answer: done" in result.program.output, api
        assert result.messages[-1].content == f"done: {next(iter(task.ground_truth))}", api
        sequence = result.token_sequence()  # the second prompt extends the first prompt + completion
        segments = result.token_segments()
        assert len(segments) == 1 and sequence.ids == segments[0].ids, api

    await asyncio.gather(*(play(api) for api in PROGRAMS))
    assert len(upstream.requests) - answered == 2 * len(PROGRAMS)  # two model calls per rollout, no more


async def test_a_program_that_rewrites_its_history_gets_token_segments(
    client: Client, worker: RunningWorker, upstream: PolicyServer, tmp_path: Path
) -> None:
    """Its second prompt does not extend the first: two segments, each exactly what the server saw."""
    env = harness_env_file(tmp_path, [str(agent_python()), str(AGENTS / "openai_agent.py"), "--rewrite"])
    served = len(upstream.records)
    workflow_id = f"harness-rewrite-{uuid.uuid4().hex[:6]}"
    result = await run_rollout(
        client,
        RolloutInput(
            env=str(env), task=file_task(0, prefix="rewrite"), model=ModelConfig(base_url=upstream.url, tokens="sglang")
        ),
        task_queue=worker.task_queue,
        workflow_id=workflow_id,
    )
    assert result.reward is not None and result.reward.total == 1.0 and result.turns == 2
    with pytest.raises(TokenMismatch):
        result.token_sequence()
    segments = result.token_segments()
    records = upstream.records[served:]
    assert [s.ids for s in segments] == [r.prompt_ids + r.completion_ids for r in records]
    assert [sum(s.loss_mask) for s in segments] == [len(r.completion_ids) for r in records]

    # Every model call is an activity of the rollout, with its summary, as `gymflow inspect` shows it.
    shown = render(await inspect_workflow(client, workflow_id, run_id=None, ui_url="http://ui"), width=None)
    assert "model call 1 (chat: 2 messages, 1 tools)" in shown and "model call 2 (chat: 4 messages, 1 tools)" in shown
    assert "calls write_file(" in shown and "says 'done: rewrite-0-0.txt'" in shown
    assert "exit 0 after" in shown and "answer: done" in shown
    await replays(client, workflow_id)  # the history, updates and all, replays deterministically
