"""Rescoring: a finished batch's stored trajectories scored with another reward, no model or tool call.

`RescoreBatchWorkflow` (gymflow.workflows.rescore) runs these:

* `prepare_rescore` finds the source batch (it must have completed), checks that every one of its
  JSONL parts is still in storage and that the reward loads and can score a stored trajectory
  (gymflow.envs.rescore). Each refusal is the user's to fix: a non-retryable failure typed by its
  `UserError` class, which the CLI prints as one line (exit 2). Nothing is written before it passes.
* `rescore_part` reads one part, scores every trajectory that is not infra-failed with the reward,
  and writes the result as the new batch's part of the same number. Infra-failed trajectories stay
  as they are: never scored, never a 0. The ground truth comes from the source batch's tasks, found
  by the rollout's index (`<batch id>/r<index>`: index // rollouts per task) and checked by task
  id. A reward that raises on a trajectory makes it infra-failed (`reward_error`, with the error),
  as it would have in the rollout. The part's key is fixed by the new batch's id and the part's
  number, so a retried attempt writes the same object.
"""

from __future__ import annotations

from pydantic import Field
from temporalio import activity

from gymflow.activities import errors
from gymflow.activities.batches import FoundBatch, find_batch, rollout_index
from gymflow.activities.env import EnvActivities
from gymflow.activities.heartbeat import with_heartbeats
from gymflow.activities.schema import MAX_NAME_CHARS, BatchInput
from gymflow.activities.storage import LoadTasksInput, StorageActivities, base_of, open_store, trajectories_from_jsonl
from gymflow.envs.contract import EnvPackageRef, Task, TerminationReason, Trajectory, Wire
from gymflow.envs.datagen.format import to_jsonl
from gymflow.envs.errors import BatchError, StorageError, UserError
from gymflow.envs.rescore import OfflineReward, RewardSpec

TASK_PAGE = 256
"""Tasks of a dataset loaded at once to find ground truths."""


class TaskSource(Wire):
    """Where a batch's tasks come from, and how rollout indices map onto them."""

    env: str
    """The env whose `load_dataset` gives the tasks."""
    tasks: list[Task] = Field(default_factory=list)
    """Inline tasks; empty when the tasks are a dataset's."""
    dataset: str | None = None
    """The dataset's name or URI."""
    dataset_options: dict[str, object] = Field(default_factory=dict)
    """The dataset's options (n, seed, ...)."""
    rollouts_per_task: int = Field(default=1, ge=1)
    """Samples per task times envs: rollout index // this is the task's index."""

    @classmethod
    def of(cls, input: BatchInput) -> TaskSource:
        """The task source of a batch's input."""
        return cls(
            env=input.env,
            tasks=list(input.tasks),
            dataset=input.dataset,
            dataset_options=dict(input.dataset_options),
            rollouts_per_task=input.samples_per_task * (1 + len(input.also_envs)),
        )


class PrepareRescoreInput(Wire):
    """Input of `prepare_rescore`."""

    source: str
    """The batch to rescore."""
    reward: RewardSpec
    """The reward to score its trajectories with (gymflow.envs.rescore)."""


class PreparedRescore(Wire):
    """The source batch, checked, and the reward as text."""

    source: FoundBatch
    """The source batch: its input (the tasks) and its result (the parts)."""
    reward: str
    """The reward spec as text (memo, report, result)."""


class RescorePartInput(Wire):
    """Input of `rescore_part`."""

    batch_id: str
    """The new batch: the part is written under its id."""
    part: int = Field(ge=0)
    """The part's number (its key: `<batch id>/trajectories/part-NNNNN.jsonl`)."""
    source_part: str
    """URI of the source batch's part."""
    reward: RewardSpec
    """The reward to score with (gymflow.envs.rescore)."""
    tasks: TaskSource
    """Where the ground truths come from."""
    destination: str | None = None
    """Storage base URI of the new part (None: the worker's default store)."""


class RescorePartResult(Wire):
    """One rescored part and its counters."""

    uri: str
    """URI of the part written."""
    total: int
    """Trajectories in the part."""
    scored: int
    """Trajectories with a reward."""
    infra_failed: int
    """Trajectories infra-failed (before, or because the reward raised on them)."""
    reward_sum: float
    """Sum of the new rewards."""
    reward_errors: int = 0
    """Trajectories the reward raised on (counted in `infra_failed`, with the error on each)."""
    env_packages: list[EnvPackageRef] = Field(default_factory=list)
    """The env packages the part's rollouts ran, each once."""


class RescoreState(Wire):
    """Progress of a rescore, carried across continue-as-new."""

    prepared: PreparedRescore | None = None
    """The source batch, once found and checked."""
    next_part: int = 0
    """Index of the next source part to rescore."""
    parts: list[str] = Field(default_factory=list)
    """URIs of the parts written, in the source's order."""
    total: int = 0
    """Trajectories rescored so far."""
    scored: int = 0
    """Of those, with a reward."""
    infra_failed: int = 0
    """Of those, infra-failed."""
    reward_sum: float = 0.0
    """Sum of their new rewards, in part order."""
    reward_errors: int = 0
    """Trajectories the reward raised on."""
    env_packages: list[EnvPackageRef] = Field(default_factory=list)
    """The env packages of the rollouts, each once."""
    runs: int = 0
    """How many times the rescore continued as new."""


class RescoreInput(Wire):
    """Input of RescoreBatchWorkflow: which batch, and the reward to score it with."""

    source: str = Field(max_length=MAX_NAME_CHARS)
    """The finished batch whose stored trajectories are scored again (it is left as it is)."""
    reward: RewardSpec
    """An env file's `reward:` value (`file.py:fn`, `module:fn`, `{fn: ..., extract: ...}`, a list of
    them) or the name of an env whose reward scores from the conversation alone (gymflow.envs.rescore).
    Paths must be absolute: the workers that score may run anywhere."""
    label: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """The title of the new batch's report; None: the source's label and the reward."""
    window: int = Field(default=4, ge=1, le=64)
    """Parts rescored at once."""
    max_parts_per_run: int = Field(default=500, ge=1)
    """Continue as new after this many parts in one run (bounds history size)."""
    state: RescoreState = Field(default_factory=RescoreState)
    """Internal: progress carried across continue-as-new. Leave empty."""


def user_failure(exc: UserError) -> Exception:
    """A user's error as the non-retryable failure the CLI reports in one line (exit 2)."""
    return errors.non_retryable(str(exc), type=type(exc).__name__)


class RescoreActivities:
    """Rescores stored trajectories; the env activities give an env's instance when an env scores."""

    def __init__(self, storage: StorageActivities, env: EnvActivities) -> None:
        self.storage = storage
        self.env = env

    @activity.defn(name="prepare_rescore")
    async def prepare_rescore(self, input: PrepareRescoreInput) -> PreparedRescore:
        """Find the source batch and check that its parts are in storage and that the reward can rescore."""
        try:
            reward = OfflineReward.load(input.reward)
            found = await find_batch(activity.client(), input.source, completed=True)
            await check_parts(found, s3_endpoint_url=self.storage.s3_endpoint_url)
        except UserError as exc:
            raise user_failure(exc) from exc
        return PreparedRescore(source=found, reward=reward.description)

    @activity.defn(name="rescore_part")
    async def rescore_part(self, input: RescorePartInput) -> RescorePartResult:
        """Score one part's trajectories with the reward and write them as the new batch's part."""
        try:
            return await with_heartbeats(self._rescore_part(input))
        except UserError as exc:
            raise user_failure(exc) from exc

    async def _rescore_part(self, input: RescorePartInput) -> RescorePartResult:
        reward = OfflineReward.load(input.reward)
        instance = self.env.env(reward.env) if reward.env is not None else None
        try:
            data = await open_store(base_of(input.source_part), s3_endpoint_url=self.storage.s3_endpoint_url).get(
                input.source_part
            )
        except StorageError as exc:
            raise BatchError(f"cannot read {input.source_part}: {exc}") from exc
        tasks = TaskLookup(input.tasks, self.storage)
        out: list[Trajectory] = []
        result = RescorePartResult(uri="", total=0, scored=0, infra_failed=0, reward_sum=0.0)
        for stored in trajectories_from_jsonl(data, source=input.source_part):
            trajectory = stored
            if not stored.infra_failed:
                task = await tasks.task(stored)
                try:
                    new = await reward.score(
                        stored.messages,
                        task.ground_truth,
                        rollout_id=stored.rollout_id,
                        task_id=task.id,
                        metadata=task.metadata,
                        instance=instance,
                    )
                # User code: whatever it raises is this trajectory's reward error (infra-failed, with
                # the error), as in a live rollout, never a 0 and never the whole batch's failure.
                except Exception as exc:
                    result.reward_errors += 1
                    trajectory = stored.model_copy(
                        update={
                            "reward": None,
                            "infra_failed": True,
                            "termination": TerminationReason.REWARD_ERROR,
                            "error": f"rescore with {reward.description}: {type(exc).__name__}: {exc}",
                        }
                    )
                else:
                    trajectory = stored.model_copy(update={"reward": new})
            result.total += 1
            if trajectory.reward is not None:
                result.scored += 1
                result.reward_sum += trajectory.reward.total
            result.infra_failed += trajectory.infra_failed
            if trajectory.env_package is not None and trajectory.env_package not in result.env_packages:
                result.env_packages.append(trajectory.env_package)
            out.append(trajectory)
        key = f"{input.batch_id}/trajectories/part-{input.part:05d}.jsonl"
        try:
            result.uri = await self.storage.store(input.destination).put(key, to_jsonl(out))
        except StorageError as exc:
            raise errors.non_retryable(str(exc), type=errors.STORAGE_ERROR) from exc
        return result


async def check_parts(found: FoundBatch, *, s3_endpoint_url: str | None) -> None:
    """Refuse a batch whose JSONL parts are not all in storage.

    Raises:
        BatchError: A part is missing (or its store cannot be read); the message names it.
    """
    parts = found.result.parts if found.result else []
    if not parts:
        raise BatchError(f"batch {found.batch_id} has no stored trajectories (it ran no rollouts)")
    for uri in parts:
        try:
            present = await open_store(base_of(uri), s3_endpoint_url=s3_endpoint_url).exists(uri)
        except StorageError as exc:
            raise BatchError(f"batch {found.batch_id}'s trajectories cannot be read at {uri}: {exc}") from exc
        if not present:
            raise BatchError(
                f"batch {found.batch_id}'s stored trajectories are gone: no {uri} "
                f"({len(parts)} part(s)); nothing can be rescored without them"
            )


class TaskLookup:
    """The task of a batch's trajectory, by its rollout index, a page of the dataset at a time."""

    def __init__(self, source: TaskSource, storage: StorageActivities) -> None:
        self.source = source
        self.storage = storage
        self._pages: dict[int, list[Task]] = {}

    async def task(self, trajectory: Trajectory) -> Task:
        """The task `trajectory` played.

        Raises:
            BatchError: Its rollout id has no index, or the tasks no longer give its task there.
        """
        index = rollout_index(trajectory)
        if index is None:
            raise BatchError(f"rollout {trajectory.rollout_id} is not a batch's (<batch id>/r<index>)")
        task_index = index // self.source.rollouts_per_task
        if self.source.tasks:
            found = self.source.tasks[task_index] if task_index < len(self.source.tasks) else None
        else:
            page, offset = divmod(task_index, TASK_PAGE)
            if page not in self._pages:
                load = LoadTasksInput(
                    env=self.source.env,
                    dataset=self.source.dataset or "",
                    options=dict(self.source.dataset_options),
                    offset=page * TASK_PAGE,
                    limit=TASK_PAGE,
                )
                self._pages = {page: await self.storage.load_tasks(load)}
            tasks = self._pages[page]
            found = tasks[offset] if offset < len(tasks) else None
        if found is None or found.id != trajectory.task_id:
            raise BatchError(
                f"rollout {trajectory.rollout_id} played task {trajectory.task_id!r}, but the batch's tasks now give "
                f"{found.id if found else 'nothing'!r} at its index {task_index}: its dataset changed, so its ground "
                "truths are unknown"
            )
        return found
