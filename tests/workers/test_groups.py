"""`GymflowClient.rollout_groups`: groups stream as they finish, in-flight work is bounded, a batch
resumes by id without running anything twice, token data and infra failures come through."""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Iterator, Sequence

import pytest
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RetrySettings, RolloutOptions
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.envs.contract import Message, Task, ToolSpec
from gymflow.workers.sdk.groups import GymflowClient
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker


class CountingPolicy(CalculatorPolicy):
    """The calculator policy, counting the completions it serves. With `fail_every`, the first turn of
    every `fail_every`-th rollout raises (a 500): exactly that many rollouts fail, whatever the
    interleaving of the others' turns."""

    def __init__(self, fail_every: int = 0) -> None:
        self.calls = 0
        self.first_turns = 0
        self.fail_every = fail_every

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        self.calls += 1
        if self.fail_every and not any(m.role == "assistant" for m in messages):
            self.first_turns += 1
            if self.first_turns % self.fail_every == 0:
                raise RuntimeError("the model server fell over")
        return super().respond(messages, tools)


def counted(tasks: list[Task], pulled: list[int]) -> Iterator[Task]:
    for task in tasks:
        pulled[0] += 1
        yield task


@pytest.mark.heavy
async def test_groups_stream_with_bounded_in_flight_work_and_token_data(client: Client, worker: RunningWorker) -> None:
    tasks = generate_tasks(5, seed=8)
    pulled = [0]
    async with PolicyServer(CountingPolicy()) as server:
        sdk = GymflowClient(client, env="math", task_queue=worker.task_queue)
        stream = sdk.rollout_groups(
            counted(tasks, pulled), n=2, model=ModelConfig(base_url=server.url, tokens="sglang"), max_in_flight=2
        )
        groups = []
        async for group in stream:
            # The trainer holds a group: nothing more was started (two were in flight, one is taken).
            assert pulled[0] <= len(groups) + 2
            groups.append(group)
    assert pulled[0] == 5 and len(groups) == 5
    assert sorted(g.task_id for g in groups) == sorted(t.id for t in tasks)
    assert len({g.group_id for g in groups}) == 5
    for group in groups:
        assert group.advantages == [0.0, 0.0] and group.rewards == [1.0, 1.0]  # all solved: no signal
        for trajectory in group.trajectories:
            sequence = trajectory.token_sequence()
            assert sum(sequence.loss_mask) == sum(len(t.completion_ids) for t in trajectory.tokens) > 0


@pytest.mark.heavy
async def test_infra_failed_samples_are_flagged_not_scored(client: Client, worker: RunningWorker) -> None:
    async with PolicyServer(CountingPolicy(fail_every=3)) as server:
        sdk = GymflowClient(client, env="math", task_queue=worker.task_queue)
        options = RolloutOptions(model=ModelConfig(base_url=server.url), retry=RetrySettings(model_attempts=1))
        groups = [g async for g in sdk.rollout_groups(generate_tasks(2, seed=1), n=4, options=options)]
    samples = [(t, r, a) for g in groups for t, r, a in zip(g.trajectories, g.rewards, g.advantages, strict=True)]
    failed = [(t, r, a) for t, r, a in samples if t.infra_failed]
    assert len(failed) == len(samples) // 3  # 8 rollouts: the 3rd and 6th failed
    assert all(r is None and a is None and t.reward is None for t, r, a in failed)
    assert all(r == 1.0 and a is not None for t, r, a in samples if not t.infra_failed)


@pytest.mark.heavy
async def test_a_batch_resumes_by_id_without_running_anything_twice(client: Client, worker: RunningWorker) -> None:
    tasks = generate_tasks(3, seed=9)
    policy = CountingPolicy()
    async with PolicyServer(policy) as server:
        sdk = GymflowClient(client, env="math", task_queue=worker.task_queue)
        model = ModelConfig(base_url=server.url)
        batch = f"resume-{uuid.uuid4().hex[:8]}"
        stream = sdk.rollout_groups(tasks, n=2, model=model, batch_id=batch, max_in_flight=1)
        async with contextlib.aclosing(stream):
            first = await anext(stream)  # the trainer stops after one group (the next may be running)
        again = [g async for g in sdk.rollout_groups(tasks, n=2, model=model, batch_id=batch)]
        rest = [g async for g in sdk.rollout_groups(tasks, n=2, model=model, batch_id=batch, skip={first.group_id})]
    assert sorted(g.group_id for g in again) == sorted({first.group_id, *(g.group_id for g in rest)})
    assert first.group_id not in {g.group_id for g in rest} and len(rest) == 2
    resumed = next(g for g in again if g.group_id == first.group_id)
    assert [t.rollout_id for t in resumed.trajectories] == [t.rollout_id for t in first.trajectories]
    # Every completion served belongs to exactly one rollout turn: nothing ran twice.
    assert policy.calls == sum(t.turns for g in again for t in g.trajectories)
    assert len(list(itertools.chain.from_iterable(g.trajectories for g in again))) == 6
