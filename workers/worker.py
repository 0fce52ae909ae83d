"""The gymflow worker: one process = one node.

It polls two queues: the shared queue (workflows, model calls, rollout initialisation) and its
own node queue (every env activity of the rollouts it initialised), so a rollout's server
processes and workspace stay on the node that holds them. The Python SDK has no sessions;
worker-specific task queues are Temporal's documented way to pin activities to a host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog
from temporalio.client import Client
from temporalio.runtime import Runtime
from temporalio.worker import PollerBehaviorSimpleMaximum, Worker
from temporalio.worker.workflow_sandbox import SandboxRestrictions

from gymflow.activities.dataset import DatasetActivities
from gymflow.activities.env import EnvActivities
from gymflow.activities.judge import JudgeActivities
from gymflow.activities.model import ModelActivities
from gymflow.activities.report import ReportActivities
from gymflow.activities.storage import StorageActivities
from gymflow.activities.trainer_jobs import TrainerActivities
from gymflow.activities.training import TrainingActivities
from gymflow.activities.turn import TurnActivities
from gymflow.envs.errors import UserError
from gymflow.envs.mcp.ledger import reap_orphans
from gymflow.workers.admission import Admission
from gymflow.workers.config import Settings
from gymflow.workers.dedup import DedupInterceptor
from gymflow.workers.fencing import StaleTaskGuard
from gymflow.workers.judge_worker import judge_worker
from gymflow.workers.metrics import GymflowMetrics, MetricsInterceptor, NodeSampler, metrics_runtime
from gymflow.workers.reaper import run_reaper
from gymflow.workers.sandbox_runner import FastContextRunner
from gymflow.workflows.dataset import DatasetGenerationWorkflow
from gymflow.workflows.group import BatchRolloutWorkflow, GroupRolloutWorkflow
from gymflow.workflows.names import judge_queue, node_queue
from gymflow.workflows.rollout import RolloutWorkflow
from gymflow.workflows.schema import PAYLOAD_LIMIT_BYTES
from gymflow.workflows.session import RolloutSessionWorkflow
from gymflow.workflows.training import TrainingRunWorkflow

log = logging.getLogger(__name__)

DEDUPLICATED = ("call_tool", "compute_reward")
"""Node activities answered from the node's record when retried after completing (gymflow.workers.dedup)."""

WORKFLOWS: list[type] = [
    RolloutWorkflow,
    GroupRolloutWorkflow,
    BatchRolloutWorkflow,
    DatasetGenerationWorkflow,
    RolloutSessionWorkflow,
    TrainingRunWorkflow,
]

# Modules the workflow sandbox shares with the host instead of re-importing per run: pydantic and
# the wire types (heavy, and pure), the workflows' pure helpers and input/result models (a model
# re-imported per run is rebuilt, type adapter and all, for every rollout), and logging renderers
# that a host may have installed as log handlers (rich imports lazily and touches os.getcwd, which
# the sandbox forbids). Only the workflow classes' own modules are re-imported per run.
SANDBOX_PASSTHROUGH = (
    *("pydantic", "pydantic_core", "annotated_types", "rich", "structlog", "gymflow.envs", "gymflow.activities"),
    *(
        "gymflow.workflows.schema",
        "gymflow.workflows.names",
        "gymflow.workflows.judging",
        "gymflow.workflows.activity_calls",
        "gymflow.workflows.budget",
    ),
    "gymflow.workflows.status",
    *("gymflow.workflows.rollout_env", "gymflow.workflows.session_schema", "gymflow.workflows.spans"),
    "opentelemetry",  # one trace context inside and outside the sandbox (gymflow.workers.tracing)
    "gymflow.workflows.training_schema",
)
SANDBOX_RESTRICTIONS = SandboxRestrictions.default.with_passthrough_modules(*SANDBOX_PASSTHROUGH)
WORKFLOW_RUNNER = FastContextRunner(restrictions=SANDBOX_RESTRICTIONS)
"""The sandbox, without the SDK runner's per-payload entries into it (gymflow.workers.sandbox_runner)."""


def worker_tuning(settings: Settings, *, workflows: bool) -> dict[str, Any]:
    """`Worker` options of the shared queue's worker (`workflows=True`) or a node queue's.

    The benchmark's bare-Temporal ceiling runs with exactly these, so it measures the same worker.
    """
    options: dict[str, Any] = {
        "max_concurrent_activities": settings.max_concurrent_activities,
        "activity_task_poller_behavior": PollerBehaviorSimpleMaximum(settings.activity_task_pollers),
    }
    if workflows:
        threads = settings.workflow_threads
        options |= {
            "workflow_runner": WORKFLOW_RUNNER,
            "max_concurrent_workflow_tasks": settings.workflow_task_slots,
            "max_concurrent_local_activities": settings.max_concurrent_local_activities,
            "max_cached_workflows": settings.max_cached_workflows,
            "workflow_task_poller_behavior": PollerBehaviorSimpleMaximum(settings.workflow_task_pollers),
            "workflow_task_executor": ThreadPoolExecutor(threads, "gymflow-workflow") if threads else None,
        }
    return options


@dataclass
class RunningWorker:
    """Handles of a started worker, for tests and the demo."""

    settings: Settings
    node_queue: str
    env: EnvActivities
    model: ModelActivities

    @property
    def task_queue(self) -> str:
        """The shared queue this worker polls."""
        return self.settings.task_queue


@contextlib.asynccontextmanager
async def running_worker(
    client: Client, settings: Settings, *, env_kwargs: Mapping[str, Mapping[str, Any]] | None = None
) -> AsyncIterator[RunningWorker]:
    """Run a worker (shared + node queue) until the block exits; frees every rollout on exit."""
    queue = node_queue(settings.task_queue, settings.node_id)
    # Servers and workspaces of workers that died on this host (never those of live ones).
    reap_orphans(settings.workspace_root)
    # Without external storage a payload over Temporal's limit would fail workflow tasks forever:
    # rollouts keep their trajectories under it (gymflow.workflows.budget), model replies are refused over it.
    payload_limit = None if client.data_converter.external_storage else PAYLOAD_LIMIT_BYTES
    # One admission control per node, shared by every env and the dataset loader (gymflow.workers.admission).
    admission = Admission(settings.capacity(), nice=settings.env_nice)
    # gymflow's series on the runtime's meter (a no-op without --metrics-port: gymflow.workers.metrics).
    metrics = GymflowMetrics((client.service_client.config.runtime or Runtime.default()).metric_meter)
    log.info("node %s admission: %s", settings.node_id, admission.capacity)
    env_activities = EnvActivities(
        node_id=settings.node_id,
        node_queue=queue,
        workspace_root=settings.workspace_root / settings.node_id,
        env_kwargs=env_kwargs,
        common_env_kwargs={
            "pool_size": settings.mcp_pool_size,
            "default_workspace_quota_mb": settings.workspace_quota_mb,
        },
        payload_limit_bytes=payload_limit,
        admission=admission,
    )
    api_key = settings.model_api_key.get_secret_value() if settings.model_api_key else None
    model_activities = ModelActivities(
        default_base_url=settings.model_url,
        default_model=settings.model_name,
        api_key=api_key,
        payload_limit_bytes=payload_limit,
    )
    storage = StorageActivities(
        default_uri=settings.results_uri, s3_endpoint_url=settings.s3_endpoint_url, admission=admission
    )
    reports = ReportActivities(storage, ui_base=settings.ui_url)
    training = TrainingActivities(
        data_dir=settings.data_dir, default_storage=settings.results_uri, s3_endpoint_url=settings.s3_endpoint_url
    )
    trainer = TrainerActivities(
        data_dir=settings.data_dir,
        temporal_address=client.service_client.config.target_host,  # what trainers dial back
        namespace=client.namespace,
        s3_endpoint_url=settings.s3_endpoint_url,
    )
    judge_key = settings.judge_api_key.get_secret_value() if settings.judge_api_key else None
    judge_activities = JudgeActivities(
        default_base_url=settings.judge_url, default_model=settings.judge_model, api_key=judge_key
    )
    datasets = DatasetActivities(
        default_uri=settings.results_uri,
        s3_endpoint_url=settings.s3_endpoint_url,
        default_model_url=settings.model_url,
        default_judge_url=settings.judge_url,
        model_api_key=api_key,
        judge_api_key=judge_key,
    )
    judge = judge_worker(
        client,
        activities=judge_activities,
        rate_per_second=settings.judge_rate_per_second,
        task_queue=judge_queue(settings.task_queue),
    )
    shared = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=WORKFLOWS,
        activities=[
            model_activities.generate,
            env_activities.init_rollout,
            env_activities.compute_group_reward,
            storage.write_jsonl,
            storage.load_tasks,
            datasets.scan_dataset_source,
            datasets.generate_dataset_batch,
            datasets.merge_dataset_batch,
            datasets.finalize_dataset,
            reports.render_batch_report,
            *training.activities(),
            *trainer.activities(),
        ],
        interceptors=[MetricsInterceptor(metrics)],
        **worker_tuning(settings, workflows=True),
    )
    node = Worker(
        client,
        task_queue=queue,
        activities=[
            env_activities.call_tool,
            env_activities.compute_reward,
            env_activities.release_rollout,
            TurnActivities(model_activities, env_activities).play_turn,
        ],
        # A retried attempt whose first attempt completed here (its report was lost) must not re-run the tool.
        # Fused turns are left out: only stateless envs fuse, so running one again is harmless, and
        # remembering them would keep every turn's reply (token ids and logprobs included) in memory.
        # A task reaching this node after the server timed it out (a partition) is not run (workers.fencing).
        interceptors=[StaleTaskGuard(), DedupInterceptor(activity_types=DEDUPLICATED), MetricsInterceptor(metrics)],
        **worker_tuning(settings, workflows=False),
    )
    # Every line the worker's tasks log (activities, the SDK's own) names this node: the context is
    # copied into each task the worker starts from here on.
    with structlog.contextvars.bound_contextvars(node=settings.node_id):
        reaper = asyncio.create_task(
            run_reaper(
                client,
                env_activities,
                workspace_root=settings.workspace_root,
                interval_s=settings.reap_interval_s,
                fence_after_s=settings.fence_after_s,
            )
        )
        sampler = NodeSampler(
            metrics, admission, env_activities.held, settings.workspace_root / settings.node_id, settings.node_id
        )
        try:
            async with shared, node, judge, sampler.running():
                log.info("worker polling", extra={"task_queue": settings.task_queue, "node_queue": queue})
                yield RunningWorker(settings, queue, env_activities, model_activities)
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await env_activities.shutdown()
            await model_activities.aclose()
            await judge_activities.aclose()
            await datasets.aclose()


class WorkerStartError(UserError, RuntimeError):
    """The worker cannot start (its Temporal server is unreachable)."""


async def run_worker(settings: Settings) -> None:
    """Run a worker until SIGINT/SIGTERM (the `gymflow worker` command).

    It dials the cluster as every gymflow process does (gymflow.workers.connection: flags, GYMFLOW_*,
    TEMPORAL_* and temporal.toml profiles, mTLS and API keys), checks a cluster's search attributes,
    serves Prometheus metrics with `metrics_port` and traces with an OTLP endpoint.
    """
    from gymflow.workers import tracing
    from gymflow.workers.connection import ConnectionFailed
    from gymflow.workers.sdk.client import connect, data_converter

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
