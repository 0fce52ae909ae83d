"""Streaming GRPO groups to a trainer: bounded in-flight work, groups as they finish, resumable by batch.

    client = await GymflowClient.connect("localhost:7233", env="math")
    async for group in client.rollout_groups(tasks, n=8, model=ModelConfig(tokens="vllm"), batch_id="step-12"):
        for trajectory, advantage in zip(group.trajectories, group.advantages):
            if advantage is None:   # infra-failed sample: drop it, never train on it as reward 0
                continue
            sequence = trajectory.token_sequence()   # ids, loss mask, logprobs

Each group is a `GroupRolloutWorkflow` whose id is derived from the batch id and the task's index
(`group_id`), so:

* back-pressure: at most `max_in_flight` groups are started and not yet consumed; the next group
  starts only when the trainer has taken one, so a slow trainer never has an unbounded backlog
  of rollouts running for an old policy;
* resumable: calling again with the same `batch_id` (after a trainer crash) attaches to the groups
  still running and reads the results of those that finished, running nothing twice (a group that
  failed outright is run again); `skip` leaves out the group ids the trainer already consumed;
* groups are yielded in the order they finish, each with its `group_id`; infra-failed samples keep
  their trajectory (`infra_failed=True`) and get advantage None; with `ModelConfig.tokens` on, every
  trajectory carries its token data (read back from the rollouts when a group was too large to
  return it inline).

A step that wants K groups with signal (`gymflow.workers.sdk.curriculum`):

    stream = client.rollout_groups(task_stream, n=8, batch_id="step-12", want=8, filter=DifficultyFilter(),
                                   pool=pool)
    groups = [group async for group in stream]   # 8 groups whose rewards differ (or fewer: stream.stats.ended)
    log(stream.stats.scalars())                  # groups/dropped_solved, groups/dropped_failed, ...

* a dropped group (zero variance, or no scored sample) is consumed like a yielded one: its id is in
  the batch and in `stats.dropped_ids`, so resuming the batch reads it back and drops it again;
* which tasks a call starts does not depend on the order groups finish in: with `want`, no more
  than `want - yielded` groups are in flight, so a call takes the shortest prefix of the task stream
  holding `want` groups with signal (bounded by `max_replacements`), and resuming it starts the same ones.

Asynchronous RL (`policy`, gymflow.workers.sdk.policy): every group starts on the trainer's current
policy version and is told of each later one; with `max_staleness`, a group whose oldest turn was
played more than that many versions behind the live policy is never yielded as fresh: its task is
played again (`stale="rerun"`, at most `MAX_RERUNS` times), yielded for off-policy use (`keep`) or
dropped (`drop`), each counted in `stats`, with the lag of every group yielded.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, Literal

from temporalio.client import Client, WorkflowHandle
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError

from gymflow.activities import names
from gymflow.activities.judge import GroupJudgeConfig
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import GroupInput, GroupResult, RolloutOptions, group_search_attributes
from gymflow.envs.contract import Task
from gymflow.workers.client import connect
from gymflow.workers.sdk.client import with_messages
from gymflow.workers.sdk.curriculum import DifficultyFilter, GroupStats, TaskPool
from gymflow.workers.sdk.policy import PolicyChannel
from gymflow.workflows.group import GroupRolloutWorkflow

Stale = Literal["rerun", "keep", "drop"]
MAX_RERUNS = 3
"""A stale group's task is played again at most this many times, then its group is dropped."""


def group_lag(group: GroupResult, version: int) -> int:
    """How many versions behind `version` the oldest turn of `group` was played (0 if unversioned)."""
    spans = [t.version_span() for t in group.trajectories]
    oldest = min((span[0] for span in spans if span is not None), default=version)
    return max(0, version - oldest)


def group_id(batch_id: str, index: int, task: Task) -> str:
    """The workflow id of the group of the `index`-th task of a batch."""
    return f"{batch_id}/g{index:06d}-{task.id}"


async def _group(
    client: Client,
    workflow_id: str,
    input: GroupInput,
    task_queue: str,
    extra: Sequence[SearchAttributePair[Any]],
    *,
    policy: PolicyChannel | None = None,
    since: int = 0,
) -> GroupResult:
    """Start the group (or attach to it, or read its finished result) and wait for it."""
    rollout = input.rollout
    try:
        handle: WorkflowHandle[Any, GroupResult] = await client.start_workflow(
            GroupRolloutWorkflow.run,
            input,
            id=workflow_id,
            task_queue=task_queue,
            # Resuming a batch: a running group is attached to, a finished one is read, a failed one re-run.
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            search_attributes=TypedSearchAttributes(
                [*group_search_attributes(input), SearchAttributePair(names.SA_TASK, rollout.task.id), *extra]
            ),
            memo={"task_id": rollout.task.id},
            static_summary=f"{rollout.env} group of {input.n} for task {rollout.task.id}",
        )
    except WorkflowAlreadyStartedError:  # it completed in an earlier run of this batch
        handle = client.get_workflow_handle(workflow_id, result_type=GroupResult)
    if policy is None:
        result = await handle.result()
    else:  # it is told of every announcement from now on, and of one made while it was starting
        policy.started(workflow_id, since)
        try:
            await policy.caught_up(workflow_id, since)
            result = await handle.result()
        finally:
            policy.finished(workflow_id)
    group = await with_messages(client, result)
    return group.model_copy(update={"group_id": workflow_id})


def rollout_groups(
    client: Client,
    tasks: Iterable[Task],
    *,
    env: str,
    n: int = 8,
    model: ModelConfig | None = None,
    options: RolloutOptions | None = None,
    batch_id: str | None = None,
    max_in_flight: int = 8,
    skip: Collection[str] = (),
    task_queue: str = names.TASK_QUEUE,
    scale_by_std: bool = True,
    search_attributes: Sequence[SearchAttributePair[Any]] = (),
    want: int | None = None,
    filter: DifficultyFilter | None = None,
    max_replacements: int | None = None,
    pool: TaskPool | None = None,
    policy: PolicyChannel | None = None,
    max_staleness: int | None = None,
    stale: Stale = "rerun",
    group_judge: GroupJudgeConfig | None = None,
) -> GroupStream:
    """`n` samples of every task as GRPO groups, yielded as each finishes (see the module docstring).

    Args:
        client: A Temporal client with gymflow's data converter.
        tasks: The tasks, read lazily (a generator works; it is only advanced to start a group).
        env: The env to run them in.
        n: Samples per task.
        model: The model settings (overrides `options.model`).
        options: Budgets, retries, judge (and the model when `model` is not given).
        batch_id: Names the batch (GymflowBatch) and derives the group ids; the same id resumes it.
        max_in_flight: Groups started and not yet yielded, at most.
        skip: Group ids already consumed: not started, not yielded.
        task_queue: The workers' shared queue.
        scale_by_std: GRPO advantages (r - mean) / std; False: r - mean.
        search_attributes: Set on every group besides gymflow's own (e.g. GymflowRun for a training run).
        want: Stop after yielding this many groups, taking no more tasks than that needs (never
            more than `want - yielded` groups in flight); None: a group for every task.
        filter: Drop the groups it names uninformative (zero variance by default) instead of
            yielding them; with `want`, the next task is started in a dropped group's place.
        max_replacements: With `want`: at most `want + max_replacements` tasks are taken to start
            a group or passed over as retired; then the call yields what it has and `stats.ended`
            says `max_replacements`. None: 3 x `want`.
        pool: Passes over the tasks it retired, and observes every group the call receives.
        policy: The trainer's versioned policy (gymflow.workers.sdk.policy): each group starts on its
            current model (instead of `model`), and is told of every later announcement.
        max_staleness: With `policy`: a group whose oldest turn was played more than this many versions
            behind the live one is never yielded as fresh; `stale` says what happens to it instead.
        stale: ``rerun`` (its task is played again as a new group, at most `MAX_RERUNS` times, then
            dropped), ``keep`` (yielded anyway, for off-policy use) or ``drop``.
        group_judge: Judge each group's samples against each other in one call per order (shuffled,
            then reversed, to cancel position bias) and add the normalised score to each sample's
            reward as `group/judge` (gymflow.workflows.judging.judge_group); the group's
            `judgement` says the scores and how well the orders agreed.

    Returns:
        The groups as an async iterator whose `stats` (`GroupStats`) count what the call did.

    Raises:
        ValueError: A bound is out of range (`max_in_flight` or `want` under 1, a negative
            `max_replacements`, `max_replacements` without `want`), or `filter` drops every
            group of one sample.
    """
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
    if want is not None and want < 1:
        raise ValueError(f"want must be at least 1 (or None: every task), got {want}")
    if max_replacements is not None and (want is None or max_replacements < 0):
        raise ValueError(f"max_replacements bounds the tasks taken beyond `want`: give want and a count >= 0, "
                         f"got want={want}, max_replacements={max_replacements}")  # fmt: skip
    if n < 2 and filter is not None and filter.drops("equal"):
        raise ValueError(f"filter drop={filter.drop!r} drops every group of n={n} sample: use n >= 2")
    if max_staleness is not None and (policy is None or max_staleness < 0):
        raise ValueError("max_staleness needs a policy (PolicyChannel) and a bound >= 0")
    if stale not in ("rerun", "keep", "drop"):
        raise ValueError(f"stale must be 'rerun', 'keep' or 'drop', got {stale!r}")
    opts = options or RolloutOptions()
    batch = batch_id or f"groups-{uuid.uuid4().hex[:8]}"
    stats = GroupStats(wanted=want)

    def start(task: Task, workflow_id: str) -> asyncio.Task[GroupResult]:
        since = policy.stamp() if policy is not None else 0
        rollout = opts.rollout(env, task, batch_id=batch, model=policy.model if policy else model or opts.model)
        if policy is not None:
            rollout = rollout.model_copy(update={"policy": policy.latest()})
        input = GroupInput(rollout=rollout, n=n, scale_by_std=scale_by_std, group_judge=group_judge)
        group = _group(client, workflow_id, input, task_queue, search_attributes, policy=policy, since=since)
        return asyncio.ensure_future(group)

    def lag(group: GroupResult) -> int | None:
        """How stale `group` is, where staleness counts (a `policy`); None otherwise."""
        return group_lag(group, policy.version) if policy is not None else None

    limit = None if want is None else want + (3 * want if max_replacements is None else max_replacements)
    plan = _Plan(start, batch=batch, max_in_flight=max_in_flight, skip=skip, want=want, limit=limit,
                 filter=filter, pool=pool, stats=stats, lag=lag, max_staleness=max_staleness,
                 stale=stale)  # fmt: skip
    return GroupStream(plan.run(enumerate(tasks)), stats)


class _Plan:
    """One call's streaming: which task starts next, what is yielded, and why the call ended."""

    def __init__(
        self,
        start: Callable[[Task, str], asyncio.Task[GroupResult]],
        *,
        batch: str,
        max_in_flight: int,
        skip: Collection[str],
        want: int | None,
        limit: int | None,
        filter: DifficultyFilter | None,
        pool: TaskPool | None,
        stats: GroupStats,
        lag: Callable[[GroupResult], int | None],
        max_staleness: int | None,
        stale: Stale,
    ) -> None:
        self.start, self.batch, self.max_in_flight, self.skip = start, batch, max_in_flight, skip
        self.want, self.limit, self.filter, self.pool, self.stats = want, limit, filter, pool, stats
        self.lag, self.max_staleness, self.stale = lag, max_staleness, stale
        self.limit_reached = False
        self.running: dict[asyncio.Task[GroupResult], tuple[int, Task, int]] = {}
        """A group in flight -> (its task's index, the task, how many times it was played again)."""

    def fill(self, pending: Iterator[tuple[int, Task]]) -> None:
        """Start groups until `max_in_flight` (or, with `want`, as many as are still wanted) run."""
        stats = self.stats
        needed = self.max_in_flight if self.want is None else min(self.max_in_flight, self.want - stats.yielded)
        while len(self.running) < needed:
            if self.limit is not None and stats.started + stats.passed_over_retired >= self.limit:
                self.limit_reached = True
                return
            item = next(pending, None)
            if item is None:
                return
            index, task = item
            stats.tasks_taken += 1
            workflow_id = group_id(self.batch, index, task)
            if workflow_id in self.skip:
                stats.skipped += 1
            elif self.pool is not None and self.pool.is_retired(task.id):
                stats.passed_over_retired += 1
            else:
                self.running[self.start(task, workflow_id)] = (index, task, 0)
                stats.started += 1

    def fresh(self, group: GroupResult, index: int, task: Task, rerun: int) -> bool:
        """Whether `group` may be yielded as played by the live policy; a stale one is played again
        in its place (`rerun`), or dropped, or yielded anyway (`keep`), and counted."""
        lag = self.lag(group)
        stats = self.stats
        if lag is None:
            return True
        if self.max_staleness is not None and lag > self.max_staleness:
            if self.stale == "rerun" and rerun < MAX_RERUNS:
                stats.stale_rerun += 1
                workflow_id = f"{group_id(self.batch, index, task)}~{rerun + 1}"
                self.running[self.start(task, workflow_id)] = (index, task, rerun + 1)
                return False
            if self.stale != "keep":
                stats.stale_dropped += 1
                return False
            stats.stale_kept += 1
        stats.lags[lag] = stats.lags.get(lag, 0) + 1
        return True

    def keep(self, group: GroupResult) -> bool:
        """Count a finished group (and show it to the pool); False when the filter drops it."""
        stats = self.stats
        stats.infra_failed_samples += group.infra_failed
        if self.pool is not None and self.pool.observe(group, self.filter) is not None:
            stats.retired.append(group.task_id)
        outcome = (self.filter or DifficultyFilter()).outcome(group.rewards)
        if self.filter is not None and self.filter.drops(outcome):
            stats.count(outcome)
            stats.dropped_ids.append(group.group_id)
            return False
        stats.yielded += 1
        return True

    async def run(self, pending: Iterator[tuple[int, Task]]) -> AsyncGenerator[GroupResult, None]:
        running = self.running
        try:
            self.fill(pending)
            while running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for finished in sorted(done, key=lambda f: running[f][0]):
                    index, task, rerun = running.pop(finished)
                    group = finished.result()  # raises if the group failed outright (e.g. invalid input)
                    if self.fresh(group, index, task, rerun) and self.keep(group):
                        yield group
                    self.fill(pending)  # only once the trainer took one: the in-flight bound holds while it trains
            wanted = self.want is not None and self.stats.yielded >= self.want
            self.stats.ended = "want" if wanted else "max_replacements" if self.limit_reached else "tasks"
        finally:
            for waiting in running:  # stop waiting; the workflows run on, and the batch id resumes them
                waiting.cancel()


class GroupStream(AsyncIterator[GroupResult]):
    """What `rollout_groups` returns: the groups, as they finish, and `stats`, what the call did so far."""

    def __init__(self, groups: AsyncGenerator[GroupResult, None], stats: GroupStats) -> None:
        self._groups = groups
        self.stats = stats

    def __aiter__(self) -> GroupStream:
        return self

    async def __anext__(self) -> GroupResult:
        return await anext(self._groups)

    async def aclose(self) -> None:
        """Stop: groups still running are no longer waited for (they run on; the batch id resumes them)."""
        await self._groups.aclose()


class GymflowClient:
    """The trainer's handle on gymflow: a Temporal client plus defaults (env, queue).

    Args:
        client: A Temporal client with gymflow's data converter (`gymflow.workers.client.connect`).
        env: The default env of `rollout_groups`.
        task_queue: The workers' shared queue.
    """

    def __init__(self, client: Client, *, env: str | None = None, task_queue: str = names.TASK_QUEUE) -> None:
        self.client = client
        self.env = env
        self.task_queue = task_queue

    @classmethod
    async def connect(
        cls, address: str | None = None, *, namespace: str | None = None, env: str | None = None,
        task_queue: str = names.TASK_QUEUE,
    ) -> GymflowClient:  # fmt: skip
        """Connect with gymflow's data converter; the cluster as `gymflow.connect` finds it (address and
        namespace given here, else GYMFLOW_* / TEMPORAL_* variables and the temporal.toml profile)."""
        return cls(await connect(address, namespace=namespace), env=env, task_queue=task_queue)

    def rollout_groups(
        self, tasks: Iterable[Task], *, n: int = 8, env: str | None = None, **options: Any
    ) -> GroupStream:
        """`rollout_groups` with this client's env and queue (keyword options as there)."""
        name = env or self.env
        if not name:
            raise ValueError("name the env: GymflowClient(env=...) or rollout_groups(env=...)")
        return rollout_groups(self.client, tasks, env=name, n=n, task_queue=self.task_queue, **options)


async def iterate_groups(
    client: Client,
    env: str,
    tasks: Iterable[Task],
    *,
    n: int,
    options: RolloutOptions | None = None,
    task_queue: str = names.TASK_QUEUE,
    concurrency: int = 8,
    scale_by_std: bool = True,
) -> AsyncIterator[GroupResult]:
    """`n` samples of every task as GRPO groups, yielded as each group finishes (a fresh batch).

    The trainer entry with resumable batches and back-pressure is `rollout_groups`, which this calls.

        async for group in iterate_groups(client, "math", tasks, n=8, options=opts):
            for trajectory, advantage in zip(group.trajectories, group.advantages):
                ...
    """
    async for group in rollout_groups(
        client,
        tasks,
        env=env,
        n=n,
        options=options,
        task_queue=task_queue,
        max_in_flight=concurrency,
        scale_by_std=scale_by_std,
    ):
        yield group
