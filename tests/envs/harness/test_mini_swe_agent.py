"""mini-swe-agent from PyPI, unmodified, plays rollouts through the gateway: its litellm model classes
talk to the rollout's upstream, every model call is an activity of the rollout, token data is kept."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
import third_party_agents
from container_support import base_image, leftovers
from harness_support import BashFilePolicy, file_task
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.envs.builtin.harbor.harness import SolutionPolicy
from gymflow.envs.builtin.harbor.task import load_dataset
from gymflow.envs.contract import Task, TerminationReason, Trajectory
from gymflow.envs.registry import env_class
from gymflow.envs.runtime.engine import Engine
from gymflow.workers.cli.inspect import inspect_workflow, render
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker

LOCAL = Path(__file__).parent / "mini_swe_agent_local.yaml"
__all__ = ["base_image"]  # the fixture (tests/container_support.py): a real podman and the base image


def mini_or_skip() -> None:
    if not third_party_agents.executable("mini-swe-agent").exists():
        pytest.skip(f"mini-swe-agent is not installed: {third_party_agents.install_command('mini-swe-agent')}")


async def model_calls(client: Client, workflow_id: str) -> list[str]:
    """The summaries of the rollout's model_call activities, from its history."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    summaries = []
    for event in history.events:
        scheduled = event.activity_task_scheduled_event_attributes
        if event.HasField("activity_task_scheduled_event_attributes") and scheduled.activity_type.name == "model_call":
            summaries.append(await client.data_converter.decode([event.user_metadata.summary]))
    return [s[0] for s in summaries]


async def test_mini_swe_agent_writes_files_in_its_workspace(client: Client, worker: RunningWorker) -> None:
    mini_or_skip()
    async with PolicyServer(BashFilePolicy(), record_requests=True) as upstream:
        tasks = [file_task(i, prefix="mini", files=2) for i in range(2)]
        ids = [f"mini-local-{uuid.uuid4().hex[:6]}" for _ in tasks]
        results = await asyncio.gather(
            *(
                run_rollout(
                    client,
                    RolloutInput(env=str(LOCAL), task=task, model=ModelConfig(base_url=upstream.url, tokens="vllm")),
                    task_queue=worker.task_queue,
                    workflow_id=workflow_id,
                )
                for task, workflow_id in zip(tasks, ids, strict=True)
            )
        )
        for result, workflow_id in zip(results, ids, strict=True):
            assert result.termination is TerminationReason.AGENT_EXIT, result
            assert result.reward is not None and result.reward.total == 1.0, result.program
            assert result.program is not None and result.program.exit_code == 0
            assert result.turns == 3  # two files, then the submit command
            assert len(result.tokens) == 3 and result.token_sequence().loss_mask.count(1) > 0
            calls = await model_calls(client, workflow_id)
            assert [c.split(" (")[0] for c in calls] == ["model call 1", "model call 2", "model call 3"], calls
        assert len(upstream.requests) == 6 and len(set(upstream.requests)) == 6


HARBOR = Path(__file__).parent / "mini_swe_agent_harbor.yaml"
HARBOR_TASKS = Path(__file__).parents[1] / "harbor" / "tasks"
MULTI_FILE_TASKS = Path(__file__).parent / "harbor_tasks"
"""Tasks of this test's own: a solution/ of several files (a helper run directly, binary data)."""


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_mini_swe_agent_solves_harbor_tasks_in_their_containers(
    client: Client, worker: RunningWorker, base_image: str
) -> None:
    """Every solvable test task, and one whose solution has several files: mini-swe-agent runs the scripted
    model's commands in the task's container through the engine shim, and the task's verifier gives 1.0;
    each model call is an activity of the rollout, as `gymflow inspect` shows it."""
    del base_image
    mini_or_skip()
    env = env_class(str(HARBOR))
    rows = [
        row
        for row in [*env.load_dataset("default"), *env.load_dataset(str(MULTI_FILE_TASKS))]
        if row.metadata.get("expect") == "solvable"
    ]
    assert len(rows) >= 5
    policy = SolutionPolicy([*load_dataset(HARBOR_TASKS), *load_dataset(MULTI_FILE_TASKS)])
    async with PolicyServer(policy, record_requests=True) as upstream:
        ids = {row.id: f"mini-harbor-{row.id}-{uuid.uuid4().hex[:6]}" for row in rows}
        # A few at a time: each mini-swe-agent start imports litellm (seconds of CPU), and every program
        # must finish within its task's agent time (60 s) on a 2-core box other suites share.
        gate = asyncio.Semaphore(3)

        async def play(row: Task) -> Trajectory:
            async with gate:
                model = ModelConfig(base_url=upstream.url, tokens="vllm")
                return await run_rollout(
                    client,
                    RolloutInput(env=str(HARBOR), task=row, model=model),
                    task_queue=worker.task_queue,
                    workflow_id=ids[row.id],
                )

        results = await asyncio.gather(*(play(row) for row in rows))
        ended = {row.id: (result.termination.value, result.error) for row, result in zip(rows, results, strict=True)}
        assert all(result.termination is TerminationReason.AGENT_EXIT for result in results), ended
        for row, result in zip(rows, results, strict=True):
            assert result.reward is not None and result.reward.total == 1.0, (row.id, result.reward, result.program)
            assert result.turns == 2 and len(result.tokens) == 2, row.id  # the solution, then the finish command
            calls = await model_calls(client, ids[row.id])
            assert [c.split(" (")[0] for c in calls] == ["model call 1", "model call 2"], calls
            shown = render(await inspect_workflow(client, ids[row.id], run_id=None, ui_url="http://ui"), width=None)
            assert "model call 1 (" in shown and "model call 2 (" in shown and "exit 0 after" in shown, shown
        assert len(upstream.requests) == 2 * len(rows) == len(set(upstream.requests))
    assert await leftovers(Engine.detect(), worker.settings.node_id) == []
