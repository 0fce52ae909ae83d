"""GroupRolloutWorkflow and BatchRolloutWorkflow on the real dev server."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import BatchInput, GroupInput, RetrySettings, RolloutInput, RolloutOptions
from gymflow.activities.storage import read_trajectories
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.envs.contract import Message, ToolSpec
from gymflow.workers.sdk.groups import iterate_groups
from gymflow.workers.servers.policy import AppServer, PolicyServer, build_app
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.group import BatchRolloutWorkflow, GroupRolloutWorkflow
from support import ScriptedPolicy


class EveryOtherWrong(CalculatorPolicy):
    """Solves with the tools, but every second final answer it gives is wrong."""

    answers = 0

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        reply = super().respond(messages, tools)
        if reply.tool_calls:
            return reply
        type(self).answers += 1
        return reply if self.answers % 2 else Message(role="assistant", content="<answer>-1</answer>")


async def test_group_rewards_and_advantages(client: Client, worker: RunningWorker) -> None:
    task = generate_tasks(1, seed=4, difficulty=2)[0]
    async with PolicyServer(EveryOtherWrong()) as server:
        template = RolloutInput(env="math-inproc", task=task, model=ModelConfig(base_url=server.url))
        result = await client.execute_workflow(
            GroupRolloutWorkflow.run,
            GroupInput(rollout=template, n=4),
            id=f"group-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
    assert sorted(r for r in result.rewards if r is not None) == [0.0, 0.0, 1.0, 1.0]
    assert result.mean_reward == 0.5 and result.infra_failed == 0
    for reward, advantage in zip(result.rewards, result.advantages, strict=True):
        assert advantage is not None and reward is not None
        assert advantage == pytest.approx(1.0 if reward == 1.0 else -1.0, abs=1e-4)
    assert len({t.rollout_id for t in result.trajectories}) == 4


class FirstRequestRejected:
    """Answers 400 to the very first chat request: exactly one sample fails for infra reasons."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.rejected = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions") and not self.rejected:
            self.rejected = True
            await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"rejected for the test"})
            return
        await self.app(scope, receive, send)


async def test_infra_failed_samples_are_excluded_from_group_statistics(client: Client, worker: RunningWorker) -> None:
    task = generate_tasks(1, seed=5)[0]
    async with AppServer(FirstRequestRejected(build_app(CalculatorPolicy()))) as server:
        template = RolloutInput(
            env="math-inproc", task=task, model=ModelConfig(base_url=server.url), retry=RetrySettings(model_attempts=1)
        )
        result = await client.execute_workflow(
            GroupRolloutWorkflow.run,
            GroupInput(rollout=template, n=3),
            id=f"group-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
    assert result.infra_failed == 1
    failed = [i for i, t in enumerate(result.trajectories) if t.infra_failed]
    assert len(failed) == 1
    assert result.rewards[failed[0]] is None and result.advantages[failed[0]] is None
    assert result.mean_reward == 1.0
    assert [a for a in result.advantages if a is not None] == [0.0, 0.0]


@pytest.mark.heavy
async def test_batch_continues_as_new_and_writes_jsonl(client: Client, worker: RunningWorker) -> None:
    batch_id = f"batch-{uuid.uuid4().hex[:8]}"
    async with PolicyServer(CalculatorPolicy()) as server:
        result = await client.execute_workflow(
            BatchRolloutWorkflow.run,
            BatchInput(
                env="math-inproc",
                dataset="generated",
                dataset_options={"n": 10, "seed": 3},
                samples_per_task=2,
                options=RolloutOptions(model=ModelConfig(base_url=server.url)),
                window=4,
                max_children_per_run=6,
                flush_bytes=4096,
            ),
            id=batch_id,
            task_queue=worker.task_queue,
        )
    assert result.total == 20 and result.completed == 20 and result.infra_failed == 0
    assert result.mean_reward == 1.0
    assert result.runs >= 3  # 20 children at 6 per run: continue-as-new happened
    trajectories = await read_trajectories(result.parts)
    assert len({t.rollout_id for t in trajectories}) == 20
    assert len(result.parts) > 1
    assert all(t.messages and t.reward is not None for t in trajectories)
    history = await client.get_workflow_handle(batch_id).fetch_history()
    assert history.events[-1].HasField("workflow_execution_completed_event_attributes")


async def test_batch_scripted_policy_counts_each_task(client: Client, worker: RunningWorker) -> None:
    tasks = generate_tasks(3, seed=8)
    script = ScriptedPolicy([Message(role="assistant", content="<answer>0</answer>")])
    async with PolicyServer(script) as server:
        result = await client.execute_workflow(
            BatchRolloutWorkflow.run,
            BatchInput(env="math-inproc", tasks=tasks, options=RolloutOptions(model=ModelConfig(base_url=server.url))),
            id=f"batch-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
    assert result.total == 3 and result.mean_reward == 0.0
    stored = await read_trajectories(result.parts)
    assert sorted(t.task_id for t in stored) == sorted(t.id for t in tasks)


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (BatchInput(env="math-inproc"), "needs `tasks` or a `dataset`"),
        (BatchInput(env="no-such-env", dataset="generated"), "no-such-env"),
        (BatchInput(env="math", dataset="/no/such/file.jsonl"), "file.jsonl"),
    ],
)
async def test_invalid_batch_fails_at_once(
    client: Client, worker: RunningWorker, batch: BatchInput, message: str
) -> None:
    with pytest.raises(WorkflowFailureError) as info:
        await client.execute_workflow(
            BatchRolloutWorkflow.run, batch, id=f"batch-{uuid.uuid4().hex[:8]}", task_queue=worker.task_queue
        )
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput"
    assert message in cause.message


async def test_trainer_iterates_groups_as_they_finish(client: Client, worker: RunningWorker) -> None:
    tasks = generate_tasks(3, seed=12)
    async with PolicyServer(CalculatorPolicy()) as server:
        options = RolloutOptions(model=ModelConfig(base_url=server.url))
        groups = [
            group
            async for group in iterate_groups(
                client, "math-inproc", tasks, n=2, options=options, task_queue=worker.task_queue
            )
        ]
    assert sorted(g.task_id for g in groups) == sorted(t.id for t in tasks)
    for group in groups:
        assert group.rewards == [1.0, 1.0] and group.advantages == [0.0, 0.0]
        assert all(t.messages for t in group.trajectories)
