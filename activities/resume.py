"""Resuming a batch: its finished rollouts carried over into a new batch, which runs only the rest.

`gymflow eval ENV --resume BATCH` starts a new `BatchRolloutWorkflow` with `resumed_from=BATCH` and
the same layout (`BatchLayout`: env, tasks, samples), so rollout index i is the same task and sample
in both. Its first activity, `carry_over`, takes the old batch over:

1. the old batch (and any batch it resumed in turn) is terminated if still open, so no two
   batches run the same rollouts; then its children still open are (they would finish into a
   history nobody reads);
2. every child rollout that completed and is not infra-failed is read from its history
   (gymflow.activities.batches.scan_children: the record even of rollouts that never reached a JSONL
   part) and written into the new batch's first parts;
3. the result names those parts, the counters and the index ranges carried, which the new batch
   skips. Infra-failed and missing rollouts run again.

Everything the activity writes is keyed by the new batch's id and the history's order, so a retried
attempt writes the same parts again; terminating what is closed already is a no-op.
"""

from __future__ import annotations

from pydantic import Field
from temporalio import activity

from gymflow.activities import errors
from gymflow.activities.batches import FoundBatch, resume_chain, scan_children, terminate
from gymflow.activities.heartbeat import with_heartbeats
from gymflow.activities.schema import BatchInput
from gymflow.activities.storage import StorageActivities
from gymflow.envs.contract import EnvPackageRef, Trajectory, Wire, json_bytes
from gymflow.envs.datagen.format import to_jsonl
from gymflow.envs.errors import BatchError, StorageError


class BatchLayout(Wire):
    """What makes rollout index i the same task and sample in two batches."""

    env: str
    """The env every task is played in first (`BatchInput.env`)."""
    also_envs: list[str] = Field(default_factory=list)
    """The envs that play every task too, in order (`BatchInput.also_envs`)."""
    samples_per_task: int = 1
    """Samples of each task in each env."""
    dataset: str | None = None
    """The dataset the tasks come from (None: inline tasks)."""
    dataset_options: dict[str, object] = Field(default_factory=dict)
    """The dataset's options (n, seed, ...)."""
    num_tasks: int | None = None
    """Tasks used at most."""
    task_ids: list[str] = Field(default_factory=list)
    """The ids of the inline tasks (empty for a dataset)."""

    @classmethod
    def of(cls, input: BatchInput) -> BatchLayout:
        """The layout of a batch's input."""
        return cls(
            env=input.env,
            also_envs=list(input.also_envs),
            samples_per_task=input.samples_per_task,
            dataset=input.dataset,
            dataset_options=dict(input.dataset_options),
            num_tasks=input.num_tasks,
            task_ids=[task.id for task in input.tasks],
        )


def check_resumable(found: FoundBatch, layout: BatchLayout) -> None:
    """Refuse to resume `found` as a batch of `layout` unless both run the same rollouts.

    Raises:
        BatchError: Another env, other tasks or samples, or a rescored batch; the message names them.
    """
    if found.result is not None and found.result.rescored_from is not None:
        raise BatchError(f"batch {found.batch_id} is rescored from {found.result.rescored_from}, not run: "
                         "nothing of it can be resumed")  # fmt: skip
    theirs = BatchLayout.of(found.input)
    if theirs.env != layout.env:
        raise BatchError(f"batch {found.batch_id} is of env {theirs.env!r}, not {layout.env!r}: resume it as "
                         f"`gymflow eval {theirs.env} --resume {found.batch_id}`")  # fmt: skip
    differ = [name for name in BatchLayout.model_fields if getattr(theirs, name) != getattr(layout, name)]
    if differ:
        raise BatchError(f"batch {found.batch_id} ran other rollouts ({', '.join(differ)} differ): a batch "
                         "resumes one of the same tasks, samples and envs")  # fmt: skip


class CarryOverInput(Wire):
    """Input of `carry_over`."""

    batch_id: str
    """The resuming batch: the parts are written under its id."""
    source: str
    """The batch it resumes."""
    layout: BatchLayout
    """The resuming batch's layout, which the source's must equal."""
    destination: str | None = None
    """Storage base URI of the resuming batch's parts (None: the worker's default store)."""
    flush_bytes: int = Field(default=400_000, ge=1024)
    """Bytes of trajectories per part, at most (one trajectory larger than this is a part alone)."""


class CarryOverResult(Wire):
    """What was carried over."""

    parts: list[str]
    """URIs of the parts written (`<batch id>/trajectories/part-NNNNN.jsonl`, from 0)."""
    carried: int
    """Rollouts carried over (all scored: infra-failed ones run again)."""
    reward_sum: float
    """Sum of their rewards."""
    env_packages: list[EnvPackageRef] = Field(default_factory=list)
    """The env packages their rollouts ran, each once."""
    done: list[tuple[int, int]] = Field(default_factory=list)
    """Their indices, as sorted disjoint ranges [start, end)."""
    terminated: list[str] = Field(default_factory=list)
    """Workflows that were still open and were terminated (the old batch, its open rollouts)."""


def ranges(indices: list[int]) -> list[tuple[int, int]]:
    """Sorted disjoint ranges [start, end) covering exactly `indices`."""
    out: list[tuple[int, int]] = []
    for index in sorted(set(indices)):
        if out and out[-1][1] == index:
            out[-1] = (out[-1][0], index + 1)
        else:
            out.append((index, index + 1))
    return out


class ResumeActivities:
    """Takes a batch over for the batch that resumes it; owns nothing but its storage."""

    def __init__(self, storage: StorageActivities) -> None:
        self.storage = storage

    @activity.defn(name="carry_over")
    async def carry_over(self, input: CarryOverInput) -> CarryOverResult:
        """Terminate the old batch if open, and write its finished rollouts as the new batch's first parts."""
        try:
            return await with_heartbeats(self._carry_over(input))
        except BatchError as exc:
            raise errors.non_retryable(str(exc), type=type(exc).__name__) from exc
        except StorageError as exc:  # a bad destination; a transient write failure is retried instead
            raise errors.non_retryable(str(exc), type=errors.STORAGE_ERROR) from exc

    async def _carry_over(self, input: CarryOverInput) -> CarryOverResult:
        client = activity.client()
        if input.source == input.batch_id:
            raise BatchError(f"batch {input.batch_id} cannot resume itself")
        chain = await resume_chain(client, input.source)
        check_resumable(chain[0], input.layout)
        reason = f"resumed by batch {input.batch_id}"
        terminated = [found.batch_id for found in chain if found.status == "running"]
        for batch_id in terminated:  # first: a batch that is stopped starts no more rollouts
            await terminate(client, batch_id, reason=reason)
        store = self.storage.store(input.destination)
        parts: list[str] = []
        buffer: list[Trajectory] = []
        size = 0
        indices: list[int] = []
        reward_sum = 0.0
        packages: list[EnvPackageRef] = []

        async def flush() -> None:
            nonlocal buffer, size
            if buffer:
                key = f"{input.batch_id}/trajectories/part-{len(parts):05d}.jsonl"
                parts.append(await store.put(key, to_jsonl(buffer)))
                buffer, size = [], 0

        async def keep(index: int, trajectory: Trajectory) -> None:
            nonlocal size, reward_sum
            if trajectory.infra_failed or trajectory.reward is None or index in seen:
                return  # runs again
            seen.add(index)
            indices.append(index)
            reward_sum += trajectory.reward.total
            if trajectory.env_package is not None and trajectory.env_package not in packages:
                packages.append(trajectory.env_package)
            bytes_ = json_bytes(trajectory)
            if buffer and size + bytes_ > input.flush_bytes:
                await flush()
            buffer.append(trajectory)
            size += bytes_

        seen: set[int] = set()
        for found in chain:
            still_open = await scan_children(client, found.batch_id, keep)
            for child in still_open:
                if await terminate(client, child, reason=reason):
                    terminated.append(child)
        await flush()
        activity.logger.info(
            "carried over", extra={"source": input.source, "carried": len(indices), "terminated": len(terminated)}
        )
        return CarryOverResult(
            parts=parts,
            carried=len(indices),
            reward_sum=reward_sum,
            env_packages=packages,
            done=ranges(indices),
            terminated=terminated,
        )
