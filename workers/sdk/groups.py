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
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Collection, Iterable, Sequence
from dataclasses import dataclass, field
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
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import GroupInput, GroupResult, RolloutOptions, group_search_attributes
from gymflow.envs.contract import Task
from gymflow.workers.client import connect
from gymflow.workers.sdk.client import with_messages
from gymflow.workers.sdk.policy import PolicyChannel
from gymflow.workflows.group import GroupRolloutWorkflow

Stale = Literal["rerun", "keep", "drop"]
MAX_RERUNS = 3
"""A stale group's task is played again at most this many times, then its group is dropped."""


@dataclass
class StreamStats:
    """What a group stream did with staleness (`rollout_groups(..., stats=...)`)."""

    stale_rerun: int = 0
    """Groups too stale to yield, whose task was played again."""
    stale_kept: int = 0
    """Groups yielded although stale (`stale="keep"`)."""
    stale_dropped: int = 0
    """Groups dropped as stale (`stale="drop"`, or after `MAX_RERUNS`)."""
    lags: dict[int, int] = field(default_factory=dict)
    """Groups yielded, by lag: versions between the oldest turn and the live policy when yielded."""


def group_lag(group: GroupResult, version: int) -> int:
    """How many versions behind `version` the oldest turn of `group` was played (0 if unversioned)."""
    spans = [t.version_span() for t in group.trajectories]
    oldest = min((span[0] for span in spans if span is not None), default=version)
    return max(0, version - oldest)


def _check(max_in_flight: int, policy: PolicyChannel | None, max_staleness: int | None, stale: str) -> None:
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
    if max_staleness is not None and (policy is None or max_staleness < 0):
        raise ValueError("max_staleness needs a policy (PolicyChannel) and a bound >= 0")
    if stale not in ("rerun", "keep", "drop"):
        raise ValueError(f"stale must be 'rerun', 'keep' or 'drop', got {stale!r}")


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


async def rollout_groups(
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
    policy: PolicyChannel | None = None,
    max_staleness: int | None = None,
    stale: Stale = "rerun",
    stats: StreamStats | None = None,
) -> AsyncIterator[GroupResult]:
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
        policy: The trainer's versioned policy (gymflow.workers.sdk.policy): each group starts on its
            current model (overriding `model`), and is told of every later announcement.
        max_staleness: With `policy`: a group whose oldest turn was played more than this many versions
            behind the live one is never yielded as fresh; `stale` says what happens to it instead.
        stale: ``rerun`` (the task is played again as a new group, at most `MAX_RERUNS` times, then
            dropped), ``keep`` (yielded anyway, for off-policy use) or ``drop``.
        stats: Counts of what happened (stale groups rerun, kept, dropped; the lag of every group yielded).
    """
    _check(max_in_flight, policy, max_staleness, stale)
    counts = stats if stats is not None else StreamStats()
    opts = options or RolloutOptions()
    config = model or opts.model
    batch = batch_id or f"groups-{uuid.uuid4().hex[:8]}"
    pending = iter(enumerate(tasks))
    running: dict[asyncio.Task[GroupResult], tuple[int, Task, int]] = {}
    """A group in flight -> (its task's index, the task, reruns of it so far)."""

    def start(index: int, task: Task, rerun: int) -> None:
        workflow_id = group_id(batch, index, task) + (f"~{rerun}" if rerun else "")
        since = policy.stamp() if policy is not None else 0
        rollout = opts.rollout(env, task, batch_id=batch, model=policy.model if policy is not None else config)
        if policy is not None:
            rollout = rollout.model_copy(update={"policy": policy.latest()})
        input = GroupInput(rollout=rollout, n=n, scale_by_std=scale_by_std)
        started = _group(client, workflow_id, input, task_queue, search_attributes, policy=policy, since=since)
        running[asyncio.ensure_future(started)] = (index, task, rerun)

    def fill() -> None:
        while len(running) < max_in_flight:
            item = next(pending, None)
            if item is None:
                return
            index, task = item
            if group_id(batch, index, task) not in skip:
                start(index, task, 0)

    try:
        fill()
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for finished in sorted(done, key=lambda f: running[f][0]):
                index, task, rerun = running.pop(finished)
                group = finished.result()  # raises if the group failed outright (e.g. invalid input)
                lag = group_lag(group, policy.version) if policy is not None else 0
                if max_staleness is not None and lag > max_staleness:
                    if stale == "rerun" and rerun < MAX_RERUNS:
                        counts.stale_rerun += 1
                        start(index, task, rerun + 1)  # in place of this one: the in-flight bound holds
                        continue
                    if stale != "keep":
                        counts.stale_dropped += 1
                        fill()
                        continue
                    counts.stale_kept += 1
                counts.lags[lag] = counts.lags.get(lag, 0) + 1
                yield group
                fill()  # only once the trainer took one: the in-flight bound holds while it trains
    finally:
        for waiting in running:  # stop waiting; the workflows run on, and the batch id resumes them
            waiting.cancel()


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
    ) -> AsyncIterator[GroupResult]:
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
