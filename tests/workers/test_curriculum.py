"""Online difficulty filtering of GRPO groups (gymflow.workers.sdk.curriculum, through `rollout_groups`).

A graded policy behind a real HTTP endpoint answers some tasks always right, some always wrong and
some right for every other sample, so which groups have signal is known in advance; groups run on
the real dev server, in the in-process math env (no tool servers: cheap rollouts).
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Literal

import pytest
from pydantic import ValidationError
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import GroupResult
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.contract import Message, Task, ToolSpec
from gymflow.envs.policy import Policy
from gymflow.workers.sdk.curriculum import DifficultyFilter, TaskPool
from gymflow.workers.sdk.groups import GymflowClient, rollout_groups
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker

Kind = Literal["solved", "failed", "mixed"]


class GradedPolicy(Policy):
    """Answers at once: right for `solved` tasks, wrong for `failed` ones, and right on every other
    sample of a `mixed` task (so a group of two has one of each, whichever sample asks first)."""

    name = "graded"

    def __init__(self, tasks: Sequence[Task], kinds: Sequence[Kind]) -> None:
        self.key = {str(t.prompt): (str(t.ground_truth), kind) for t, kind in zip(tasks, kinds, strict=True)}
        self.asked: Counter[str] = Counter()

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        prompt = next(str(m.content) for m in messages if m.role == "user")
        answer, kind = self.key[prompt]
        self.asked[prompt] += 1
        right = kind == "solved" or (kind == "mixed" and self.asked[prompt] % 2 == 1)
        return Message(role="assistant", content=f"<answer>{answer if right else '-99999'}</answer>")

    def calls(self, tasks: Sequence[Task]) -> int:
        return sum(self.asked[str(t.prompt)] for t in tasks)


def graded(*kinds: Kind, seed: int = 3) -> tuple[list[Task], GradedPolicy]:
    tasks = generate_tasks(len(kinds), seed=seed, difficulty=1)
    return tasks, GradedPolicy(tasks, kinds)


def batch() -> str:
    return f"step-{uuid.uuid4().hex[:8]}"


async def test_a_step_gets_the_groups_it_wants_with_signal_from_the_next_tasks(
    client: Client, worker: RunningWorker
) -> None:
    kinds: list[Kind] = ["solved", "mixed", "failed", "solved", "mixed", "failed", "mixed", "mixed", "solved", "mixed"]
    tasks, policy = graded(*kinds)
    async with PolicyServer(policy) as server:
        sdk = GymflowClient(client, env="math-inproc", task_queue=worker.task_queue)
        model = ModelConfig(base_url=server.url)
        step = batch()
        task_stream = iter(tasks)
        stream = sdk.rollout_groups(task_stream, n=2, model=model, batch_id=step, want=3, filter=DifficultyFilter())
        groups = [g async for g in stream]
        # Three groups with signal: the first three mixed tasks. The solved and failed tasks before them
        # were played and dropped; nothing after the third mixed task was taken from the stream.
        assert sorted(g.task_id for g in groups) == [tasks[i].id for i in (1, 4, 6)]
        assert all(sorted(g.rewards) == [0.0, 1.0] for g in groups)  # type: ignore[type-var]
        stats = stream.stats
        assert (stats.yielded, stats.dropped_solved, stats.dropped_failed, stats.dropped_equal) == (3, 2, 2, 0)
        assert (stats.started, stats.tasks_taken, stats.ended, stats.short) == (7, 7, "want", 0)
        assert policy.calls(tasks[:7]) == 14 and policy.calls(tasks[7:]) == 0
        assert stats.scalars()["groups/dropped_solved"] == 2.0

        # Resuming the step (same batch id, the same tasks): the dropped groups were consumed too, so
        # everything is read back and nothing is played again; the same groups come out.
        again = sdk.rollout_groups(iter(tasks), n=2, model=model, batch_id=step, want=3, filter=DifficultyFilter())
        assert sorted(g.group_id for g in [g async for g in again]) == sorted(g.group_id for g in groups)
        assert sorted(again.stats.dropped_ids) == sorted(stats.dropped_ids)
        assert len(stats.dropped_ids) == 4 and policy.calls(tasks) == 14

        # The next step continues the same task stream where it stopped: tasks 7 (mixed), 8 (solved,
        # dropped), 9 (mixed).
        following = sdk.rollout_groups(
            task_stream, n=2, model=model, batch_id=batch(), want=2, filter=DifficultyFilter()
        )
        assert sorted(g.task_id for g in [g async for g in following]) == [tasks[7].id, tasks[9].id]
        assert (following.stats.dropped_solved, following.stats.tasks_taken) == (1, 3)


async def test_the_replacement_bound_holds_and_says_so(client: Client, worker: RunningWorker) -> None:
    tasks, policy = graded("solved", "solved", "solved", "solved", "mixed", "mixed", "mixed", "failed", "mixed")
    async with PolicyServer(policy) as server:
        sdk = GymflowClient(client, env="math-inproc", task_queue=worker.task_queue)
        model = ModelConfig(base_url=server.url)
        # 2 wanted, 3 replacements allowed: five tasks taken (four solved, one mixed), then it stops short.
        bounded = sdk.rollout_groups(tasks, n=2, model=model, want=2, max_replacements=3, filter=DifficultyFilter())
        assert [g.task_id for g in [g async for g in bounded]] == [tasks[4].id]
        stats = bounded.stats
        assert (stats.started, stats.dropped_solved, stats.yielded, stats.short) == (5, 4, 1, 1)
        assert stats.ended == "max_replacements" and stats.scalars()["groups/replacement_limit_reached"] == 1.0
        assert policy.calls(tasks[5:]) == 0

        # An endless stream of solved tasks ends too: at the default bound, 3 x want replacements.
        endless = sdk.rollout_groups(
            itertools.cycle(tasks[:1]), n=2, model=model, want=1, filter=DifficultyFilter(drop="solved")
        )
        assert [g async for g in endless] == []
        assert (endless.stats.started, endless.stats.dropped_solved, endless.stats.ended) == (4, 4, "max_replacements")

        # A stream with fewer groups with signal than wanted: it runs out, and says so.
        short = sdk.rollout_groups(tasks[6:8], n=2, model=model, want=2, filter=DifficultyFilter())
        assert len([g async for g in short]) == 1
        assert (short.stats.ended, short.stats.short, short.stats.dropped_failed) == ("tasks", 1, 1)


async def test_a_task_always_solved_is_retired_and_never_started_again(client: Client, worker: RunningWorker) -> None:
    tasks, policy = graded("solved", "mixed", "failed")
    solved, mixed, failed = tasks
    pool = TaskPool(retire_solved_after=2)
    async with PolicyServer(policy) as server:
        sdk = GymflowClient(client, env="math-inproc", task_queue=worker.task_queue)
        model = ModelConfig(base_url=server.url)

        async def step(batch_id: str, pool: TaskPool) -> tuple[list[GroupResult], list[str], int]:
            stream = sdk.rollout_groups(
                tasks, n=2, model=model, batch_id=batch_id, filter=DifficultyFilter(), pool=pool
            )
            return [g async for g in stream], stream.stats.retired, stream.stats.passed_over_retired

        first = batch()
        groups, retired, _ = await step(first, pool)
        assert [g.task_id for g in groups] == [mixed.id] and retired == [] and len(pool.history[solved.id]) == 1
        # The same batch read back (a resumed step) is not a second observation.
        await step(first, pool)
        assert len(pool.history[solved.id]) == 1 and policy.calls(tasks) == 6

        _, retired, _ = await step(batch(), pool)
        assert retired == [solved.id] and pool.retired == {solved.id: "solved"}
        assert failed.id not in pool.retired  # failing tasks are not retired unless asked (retire_failed_after)

        # A restarted trainer loads the pool from JSON and still passes the retired task over.
        restored = TaskPool.model_validate_json(pool.model_dump_json())
        assert restored == pool
        played = policy.calls([solved])
        groups, _, passed_over = await step(batch(), restored)
        assert [g.task_id for g in groups] == [mixed.id] and passed_over == 1
        assert policy.calls([solved]) == played


def group(rewards: list[float | None], task_id: str = "t", group_id: str = "") -> GroupResult:
    scored = [r for r in rewards if r is not None]
    return GroupResult(
        task_id=task_id,
        trajectories=[],
        rewards=rewards,
        advantages=[None] * len(rewards),
        mean_reward=sum(scored) / len(scored) if scored else None,
        infra_failed=len(rewards) - len(scored),
        group_id=group_id or uuid.uuid4().hex,
    )


def test_outcomes_ignore_infra_failed_samples_and_respect_the_range_and_tolerance() -> None:
    default = DifficultyFilter()
    assert default.outcome([1.0, None, 1.0]) == "solved" and default.outcome([0.0, 0.0]) == "failed"
    assert default.outcome([0.5, 0.5]) == "equal" and default.outcome([0.0, 1.0]) == "mixed"
    assert default.outcome([None, None]) == "infra_failed" and default.outcome([1.0 - 1e-9, 1.0]) == "solved"
    assert DifficultyFilter(min_reward=-1, max_reward=2, tolerance=0.1).outcome([1.95, 2.05]) == "solved"
    assert [DifficultyFilter(drop=d).drops("equal") for d in ("equal", "extremes", "solved", "failed")] == [
        True, False, False, False,
    ]  # fmt: skip
    assert DifficultyFilter(drop="solved").drops("failed") is False
    assert all(DifficultyFilter(drop=d).drops("infra_failed") for d in ("equal", "solved"))


def test_the_pool_retires_after_r_outcomes_in_a_row_only() -> None:
    pool = TaskPool(retire_failed_after=2)
    outcomes = [pool.observe(group(r)) for r in ([0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [None, None], [0.0, None])]
    assert outcomes == [None, None, None, None, "failed"]  # the mixed group broke the run; infra-failed is no outcome
    assert pool.is_retired("t") and list(pool.active(generate_tasks(1))) == generate_tasks(1)
    assert pool.observe(group([0.0, 1.0])) is None and pool.retired == {"t": "failed"}  # retired stays retired
    same = group([1.0, 1.0], task_id="u", group_id="g1")
    solved = TaskPool(retire_solved_after=2)
    assert [solved.observe(same), solved.observe(same)] == [None, None]  # the same group twice: one outcome


async def test_bad_filter_settings_are_clear_errors(client: Client) -> None:
    for settings, field in [
        ({"tolerance": -0.1}, "tolerance"),
        ({"min_reward": 1.0, "max_reward": 0.0}, "min_reward"),
        ({"tolerance": 0.5}, "tolerance"),
        ({"drop": "all"}, "drop"),
        ({"typo": 1}, "typo"),
    ]:
        with pytest.raises(ValidationError, match=field):
            DifficultyFilter.model_validate(settings)
    for pool_settings, field in [({"retire_solved_after": 0}, "retire_solved_after"), ({}, "retires nothing")]:
        with pytest.raises(ValidationError, match=field):
            TaskPool.model_validate(pool_settings)
    tasks = generate_tasks(1)
    for options, message in [
        ({"want": 0}, "want must be at least 1"),
        ({"want": 2, "max_replacements": -1}, "max_replacements"),
        ({"max_replacements": 3}, "give want"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"n": 1, "filter": DifficultyFilter()}, "n >= 2"),
    ]:
        with pytest.raises(ValueError, match=message):
            rollout_groups(client, tasks, env="math-inproc", **options)  # type: ignore[arg-type]
    rollout_groups(client, tasks, env="math-inproc", n=1, filter=DifficultyFilter(drop="solved"))  # meaningful
