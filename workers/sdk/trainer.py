"""The trainer SDK: what a trainer launched by a TrainingRunWorkflow uses to speak the contract.

A trainer is started with these environment variables (and nothing else it must know):

* ``GYMFLOW_RUN_ID`` — the run (the TrainingRunWorkflow's id);
* ``GYMFLOW_RUN_SPEC`` — URI of ``run.json`` (`TrainerSpec`): env, config, the dataset splits
  (Task JSONL), the env bundle (an sdist + pinned requirements), where to write checkpoints;
* ``GYMFLOW_TEMPORAL_ADDRESS``, ``GYMFLOW_NAMESPACE``, ``GYMFLOW_TASK_QUEUE`` (and, for S3
  storage, ``GYMFLOW_S3_ENDPOINT_URL`` plus the usual ``AWS_*`` credentials).

Then::

    session = await TrainerSession.connect()
    tasks = await session.train_tasks()
    async for group in session.groups(tasks[:8], n=8, model=ModelConfig(base_url=..., model=...)):
        ...                                    # GRPO groups: trajectories, rewards, advantages
    await session.report(step, {"reward": 0.5}, checkpoint=CheckpointReport(...))
    await session.finish()                     # returns once every checkpoint is evaluated

Reports are updates of the run workflow with an update id per step, so a report retried after a
lost connection is applied once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair
from temporalio.service import RPCError, RPCStatusCode

from gymflow.activities import names
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import PolicyMode
from gymflow.activities.storage import base_of, open_store
from gymflow.activities.training_schema import CheckpointReport, EvalSummary, FinishReport, StepReport, TrainerSpec
from gymflow.envs.contract import Task
from gymflow.envs.datagen.format import tasks_from_jsonl
from gymflow.workers.client import connect, data_converter
from gymflow.workers.config import Settings
from gymflow.workers.sdk.curriculum import DifficultyFilter, TaskPool
from gymflow.workers.sdk.groups import GroupStream, rollout_groups
from gymflow.workers.sdk.policy import PolicyChannel
from gymflow.workflows.training import TrainingRunWorkflow

UPDATE_ATTEMPTS = 30
"""Tries of a report before the trainer gives up (about 12 minutes with the backoff's 30 s cap)."""
PERMANENT_RPC_ERRORS = frozenset(
    {RPCStatusCode.INVALID_ARGUMENT, RPCStatusCode.NOT_FOUND, RPCStatusCode.PERMISSION_DENIED,
     RPCStatusCode.UNAUTHENTICATED, RPCStatusCode.UNIMPLEMENTED, RPCStatusCode.ALREADY_EXISTS}
)  # fmt: skip
log = logging.getLogger(__name__)


class TrainerSession:
    """A trainer's connection to its run: the spec, data, rollout groups, and reports back."""

    retry_delay_s = 0.5
    """First wait before a report the server could not take is sent again (doubling, capped at 30 s)."""

    def __init__(self, client: Client, spec: TrainerSpec, *, s3_endpoint_url: str | None = None) -> None:
        self.client = client
        self.spec = spec
        self.s3_endpoint_url = s3_endpoint_url
        self.handle: WorkflowHandle[Any, Any] = client.get_workflow_handle(spec.run_id)

    @classmethod
    async def connect(cls, environ: Mapping[str, str] | None = None) -> TrainerSession:
        """The session of the run named by the environment (see the module docstring).

        Raises:
            KeyError: GYMFLOW_RUN_ID or GYMFLOW_RUN_SPEC is not set.
        """
        environ = os.environ if environ is None else environ
        for name in ("GYMFLOW_RUN_ID", "GYMFLOW_RUN_SPEC"):
            if name not in environ:
                raise KeyError(f"{name} is not set: a trainer is started by `gymflow train launch`")
        settings = Settings()
        # GYMFLOW_TEMPORAL_ADDRESS / GYMFLOW_NAMESPACE from the launcher; TLS and API keys as every
        # Temporal client finds them (TEMPORAL_*, temporal.toml: gymflow.workers.connection).
        client = await connect(connection=settings.temporal_connection(), data_converter=data_converter(settings))
        uri = environ["GYMFLOW_RUN_SPEC"]
        raw = await open_store(base_of(uri), s3_endpoint_url=settings.s3_endpoint_url).get(uri)
        return cls(client, TrainerSpec.model_validate_json(raw), s3_endpoint_url=settings.s3_endpoint_url)

    async def read(self, uri: str) -> bytes:
        """An object from the run's storage (a split, a checkpoint)."""
        return await open_store(base_of(uri), s3_endpoint_url=self.s3_endpoint_url).get(uri)

    async def write_checkpoint(self, name: str, data: bytes) -> str:
        """Store a checkpoint file under the run's checkpoint prefix; returns its URI."""
        store = open_store(self.spec.checkpoints, s3_endpoint_url=self.s3_endpoint_url)
        return await store.put(name, data)

    async def train_tasks(self) -> list[Task]:
        return tasks_from_jsonl(await self.read(self.spec.train_uri), source=self.spec.train_uri)

    async def eval_tasks(self) -> list[Task]:
        return tasks_from_jsonl(await self.read(self.spec.eval_uri), source=self.spec.eval_uri)

    def groups(
        self,
        tasks: Iterable[Task],
        *,
        n: int | None = None,
        model: ModelConfig | None = None,
        concurrency: int = 8,
        batch_id: str | None = None,
        skip: Collection[str] = (),
        want: int | None = None,
        filter: DifficultyFilter | None = None,
        max_replacements: int | None = None,
        pool: TaskPool | None = None,
        policy: PolicyChannel | None = None,
        max_staleness: int | None = None,
        policy_mode: PolicyMode = "continue",
    ) -> GroupStream:
        """GRPO groups of `tasks` (n samples each, default the config's group size), as they finish.

        `gymflow.workers.sdk.groups.rollout_groups` (back-pressure: at most `concurrency` groups started and not
        yet consumed; the same `batch_id` resumes a step after a trainer crash, running nothing
        twice; `want`, `filter`, `max_replacements` and `pool` as there: `want` groups with signal
        from a task stream, the call's counts in the returned stream's `stats`), with each group
        carrying the run (GymflowRun=<run>, ids under `<run>/`): the Web UI lists it with the run,
        and cancelling the run cancels it. With `policy` (gymflow.workers.sdk.policy) the groups play the
        trainer's versioned policy, `max_staleness` bounds how stale a yielded group may be, and
        `policy_mode` says what running rollouts do when a new version is announced.
        """
        config, run_id = self.spec.config, self.spec.run_id
        return rollout_groups(
            self.client,
            tasks,
            env=self.spec.env,
            n=n or config.algorithm.group_size,
            options=config.rollout_options(model).model_copy(update={"policy_mode": policy_mode}),
            batch_id=f"{run_id}/{batch_id or 'groups-' + uuid.uuid4().hex[:8]}",
            max_in_flight=concurrency,
            skip=skip,
            task_queue=self.spec.task_queue,
            scale_by_std=config.algorithm.scale_by_std,
            search_attributes=[SearchAttributePair(names.SA_RUN, run_id)],
            want=want,
            filter=filter,
            max_replacements=max_replacements,
            pool=pool,
            policy=policy,
            max_staleness=max_staleness,
        )

    async def report(
        self, step: int, scalars: Mapping[str, float] | None = None, *, checkpoint: CheckpointReport | None = None
    ) -> dict[str, Any]:
        """Report a finished step (and a checkpoint); applied once even if retried."""
        report = StepReport(step=step, scalars=dict(scalars or {}), checkpoint=checkpoint)
        suffix = f"-{checkpoint.name}" if checkpoint else ""
        return await self._update(TrainingRunWorkflow.report, report, id=f"report-{step}{suffix}")

    async def finish(self, status: str = "succeeded", message: str = "") -> list[EvalSummary]:
        """Tell the run the trainer is done; returns once every reported checkpoint is evaluated."""
        report = FinishReport.model_validate({"status": status, "message": message})
        return await self._update(TrainingRunWorkflow.finish, report, id="finish")

    async def _update(self, update: Any, arg: Any, *, id: str) -> Any:
        """Send an update, retrying while the server cannot take it yet (unavailable, overloaded, the
        run's workflow task failing and being retried); the update id makes a retry apply once."""
        delay = self.retry_delay_s
        for attempt in range(1, UPDATE_ATTEMPTS + 1):
            try:
                return await self.handle.execute_update(update, arg, id=id)
            except RPCError as exc:
                if exc.status in PERMANENT_RPC_ERRORS or attempt >= UPDATE_ATTEMPTS:
                    raise
                log.warning(
                    "report not taken yet; retrying",
                    extra={"update_id": id, "status": exc.status.name, "error": str(exc), "retry_in_s": delay},
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
        raise AssertionError("the last attempt returns or raises")
