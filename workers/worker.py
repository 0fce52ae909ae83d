"""The gymflow worker: one process = one node, serving the roles it is given.

A worker is composed of roles (gymflow.workers.roles): `rollout` polls the shared queue (rollout
workflows, model calls, rollout initialisation) and its own node queue (every env activity of the
rollouts it initialised), so a rollout's server processes and workspace stay on the node that holds
them; `judge`, `dataset` and `training` poll queues of their own. The Python SDK has no sessions;
worker-specific task queues are Temporal's documented way to pin activities to a host.

`gymflow worker` serves every role unless told otherwise (`--roles`, `GYMFLOW_WORKER_ROLES`); a
CLI command's in-process worker serves only the roles its command needs, so `gymflow eval` never
builds the dataset or training machinery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from temporalio.client import Client
from temporalio.worker import PollerBehaviorSimpleMaximum, Worker

from gymflow.activities.names import node_queue
from gymflow.envs.errors import WorkerStartError
from gymflow.workers.config import ROLES, Settings, WorkerRole
from gymflow.workers.roles import BUILDERS, Context, Served
from gymflow.workers.sandbox_runner import workflow_runner

if TYPE_CHECKING:
    from gymflow.activities.env import EnvActivities
    from gymflow.activities.model import ModelActivities
    from gymflow.workers.servers.gateway import Gateway

log = logging.getLogger(__name__)


def worker_tuning(settings: Settings, *, workflows: bool) -> dict[str, Any]:
    """`Worker` options of a queue's worker: one that runs workflows (`workflows=True`: the shared,
    dataset and training queues) or activities only (a node queue, the judge queue).

    The benchmark's bare-Temporal ceiling runs with exactly these, so it measures the same worker.
    """
    options: dict[str, Any] = {
        "max_concurrent_activities": settings.max_concurrent_activities,
        "activity_task_poller_behavior": PollerBehaviorSimpleMaximum(settings.activity_task_pollers),
    }
    if workflows:
        threads = settings.workflow_threads
        options |= {
            "workflow_runner": workflow_runner(settings.workflow_runner),
            "max_concurrent_workflow_tasks": settings.workflow_task_slots,
            "max_concurrent_local_activities": settings.max_concurrent_local_activities,
            "max_cached_workflows": settings.max_cached_workflows,
            "workflow_task_poller_behavior": PollerBehaviorSimpleMaximum(settings.workflow_task_pollers),
            "workflow_task_executor": ThreadPoolExecutor(threads, "gymflow-workflow") if threads else None,
        }
    return options


@dataclass(frozen=True)
class Registered:
    """What the worker of one task queue registered."""

    workflows: frozenset[str]
    """The workflow classes' names (`RolloutWorkflow`)."""
    activities: frozenset[str]
    """The activity methods' qualified names (`EnvActivities.call_tool`)."""


@dataclass
class RunningWorker:
    """Handles of a started worker, for tests and the demo."""

    settings: Settings
    node_queue: str
    roles: tuple[WorkerRole, ...]
    queues: dict[str, Registered] = field(default_factory=dict)
    """Per task queue polled, what its worker registered."""
    served: list[Served] = field(default_factory=list, repr=False)

    @property
    def task_queue(self) -> str:
        """The shared queue of the deployment (rollouts run there; the other roles' queues derive from it)."""
        return self.settings.task_queue

    @property
    def env(self) -> EnvActivities:
        """The rollout role's env activities."""
        return self._rollout().env  # type: ignore[return-value]

    @property
    def model(self) -> ModelActivities:
        """The rollout role's model activities."""
        return self._rollout().model  # type: ignore[return-value]

    @property
    def gateway(self) -> Gateway:
        """The rollout role's model gateway."""
        return self._rollout().gateway  # type: ignore[return-value]

    def _rollout(self) -> Served:
        for part in self.served:
            if part.role == "rollout":
                return part
        raise LookupError(f"this worker serves no rollout role (its roles: {', '.join(self.roles)})")


def _registered(worker: Worker) -> Registered:
    config = worker.config()
    return Registered(
        workflows=frozenset(cls.__name__ for cls in config.get("workflows", [])),
        activities=frozenset(fn.__qualname__ for fn in config.get("activities", [])),
    )


@contextlib.asynccontextmanager
async def running_worker(
    client: Client,
    settings: Settings,
    *,
    roles: Collection[WorkerRole] | None = None,
    env_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> AsyncIterator[RunningWorker]:
    """Run a worker until the block exits; frees every rollout on exit.

    Args:
        client: Temporal client (with gymflow's data converter).
        settings: The worker's settings.
        roles: The roles to serve (gymflow.workers.roles); None: `settings.worker_roles`.
        env_kwargs: Per env name, keyword arguments for the env class (the rollout role's envs).
    """
    chosen = tuple(role for role in ROLES if role in (settings.worker_roles if roles is None else roles))
    if not chosen:
        raise ValueError(f"a worker serves at least one role of {', '.join(ROLES)}")
    context = Context(client, settings, env_kwargs)
    # Every line the worker's tasks log (activities, the SDK's own) names this node: the context is
    # copied into each task the worker starts from here on.
    with structlog.contextvars.bound_contextvars(node=settings.node_id):
        async with contextlib.AsyncExitStack() as stack:
            served: list[Served] = []
            for role in chosen:  # what is built is closed on the way out, whatever fails after it
                part = BUILDERS[role](context)
                served.append(part)
                for close in reversed(part.close):
                    stack.push_async_callback(close)
            for part in served:
                for run in part.background:
                    stack.push_async_callback(_cancel, asyncio.create_task(run()))
            for part in served:  # up before any activity that needs one runs, down after the workers stop
                for server in part.servers:
                    await stack.enter_async_context(server)
            workers = [
                Worker(
                    client,
                    task_queue=queue.task_queue,
                    workflows=queue.workflows,
                    activities=queue.activities,
                    interceptors=queue.interceptors,
                    **(worker_tuning(settings, workflows=bool(queue.workflows)) | queue.options),
                )
                for part in served
                for queue in part.queues
            ]
            for worker in workers:  # the workers stop (draining their tasks) before anything above closes
                await stack.enter_async_context(worker)
            running = RunningWorker(
                settings,
                node_queue(settings.task_queue, settings.node_id),
                chosen,
                queues={worker.task_queue: _registered(worker) for worker in workers},
                served=served,
            )
            log.info(
                "worker polling",
                extra={"task_queue": settings.task_queue, "roles": ",".join(chosen), "queues": sorted(running.queues)},
            )
            yield running


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def run_worker(settings: Settings) -> None:
    """Run a worker with the roles of `settings.worker_roles` until SIGINT/SIGTERM (the `gymflow worker` command).

    It dials the cluster as every gymflow process does (gymflow.workers.connection: flags, GYMFLOW_*,
    TEMPORAL_* and temporal.toml profiles, mTLS and API keys), checks a cluster's search attributes,
    serves Prometheus metrics with `metrics_port` and traces with an OTLP endpoint.
    """
    from gymflow.envs.errors import ConnectionFailed
    from gymflow.workers import tracing
    from gymflow.workers.client import connect, data_converter
    from gymflow.workers.metrics import metrics_runtime

    # Every line of the process names its node (one of several worker processes of a host: gymflow.workers.processes).
    with structlog.contextvars.bound_contextvars(node=settings.node_id):
        connection = settings.temporal_connection()
        runtime = None
        if settings.metrics_port is not None:
            runtime = metrics_runtime(host=settings.metrics_host, port=settings.metrics_port, node=settings.node_id)
            log.info("metrics at http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
        try:
            client = await connect(
                connection=connection,
                # Encryption and external payload storage, as configured (gymflow.workers.sdk.client).
                data_converter=data_converter(settings),
                interceptors=tracing.client_interceptors(settings, service_name="gymflow-worker"),
                runtime=runtime,  # a cluster's search attributes are checked: they must exist before any rollout
            )
        except ConnectionFailed as exc:
            raise WorkerStartError(str(exc)) from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            async with running_worker(client, settings):
                await stop.wait()
        finally:
            await asyncio.to_thread(tracing.shutdown)
