"""What a worker serves, by role: one small builder per role; the worker composes those it is given.

* ``rollout``: the rollout workflows (`RolloutWorkflow`, `GroupRolloutWorkflow`,
  `BatchRolloutWorkflow`, `RolloutSessionWorkflow`, `RescoreBatchWorkflow`) and what they run on the
  shared queue (model turns, rollout initialisation, group rewards, task loading, results, batch
  reports, rescoring and resuming batches); the node
  queue with the env activities of the rollouts this node holds (tools, rewards, release, fused
  turns, harness programs); the node's admission control, the reaper (and its fence for a node cut
  off from its server), the model gateway through which harness rollouts' agent programs call
  models, gymflow's metrics (gymflow.workers.metrics) and the guard against stale tasks
  (gymflow.workers.fencing).
* ``judge``: the LLM-judge activity on the judge queue, under the deployment-wide rate limit.
* ``dataset``: `DatasetGenerationWorkflow` and its activities, on the dataset queue.
* ``training``: `TrainingRunWorkflow` with the training and trainer-job activities, on the training
  queue. Its eval batches and its trainer's rollouts go to the shared queue: some worker of the
  deployment serves the rollout role there.

Each role has task queues of its own (gymflow.activities.names) because Temporal requires every
worker polling a queue to register the same workflows and activities: a task reaching a worker that
lacks its type fails there. So a fleet can split roles across nodes (`gymflow worker --roles`,
`GYMFLOW_WORKER_ROLES`), and a workflow is registered only where the activities it schedules on its
own queue are served. A builder imports its activities and workflows when it is called, so a worker
that does not serve a role never imports (let alone constructs) that role's machinery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr
from temporalio.client import Client
from temporalio.runtime import Runtime
from temporalio.worker import Interceptor

from gymflow.activities import names
from gymflow.workers.config import Settings, WorkerRole

if TYPE_CHECKING:
    from gymflow.activities.env import EnvActivities
    from gymflow.activities.model import ModelActivities
    from gymflow.workers.servers.gateway import Gateway

COMMAND_ROLES: Mapping[str, tuple[WorkerRole, ...]] = {
    "rollout": ("rollout", "judge"),
    "demo": ("rollout", "judge"),
    "eval": ("rollout", "judge"),
    "dataset": ("dataset",),
    "train": ("training", "rollout", "judge"),
}
"""The roles of each CLI command's in-process worker. A rollout may be judged (an env's rubric says
so only once it starts), so rollouts come with the judge; dataset generation calls its model and
judge endpoints itself and runs no rollouts; a training run evaluates its checkpoints in rollouts."""

DEDUPLICATED = ("call_tool", "compute_reward", "env_response")
"""Node activities answered from the node's record when retried after completing (gymflow.workers.dedup)."""


@dataclass
class Queue:
    """One task queue a role serves: what the worker on it registers, and options of its own."""

    task_queue: str
    workflows: list[type] = field(default_factory=list)
    activities: list[Callable[..., Any]] = field(default_factory=list)
    interceptors: list[Interceptor] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    """`Worker` options over the worker's tuning (gymflow.workers.worker.worker_tuning)."""


@dataclass
class Served:
    """A built role: its queues, what runs beside them while the worker runs, and what closes after."""

    role: WorkerRole
    queues: list[Queue]
    background: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
    """Started when the worker starts, cancelled when it stops (before `close`)."""
    servers: list[AbstractAsyncContextManager[Any]] = field(default_factory=list)
    """Entered before the queues' workers start (their activities may need them up), exited after
    those workers stopped."""
    close: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Run after the queues' workers have stopped, in order."""
    env: EnvActivities | None = None
    """The rollout role's env activities (for tests and the demo)."""
    model: ModelActivities | None = None
    """The rollout role's model activities."""
    gateway: Gateway | None = None
    """The rollout role's model gateway."""


@dataclass(frozen=True)
class Context:
    """What every builder is given."""

    client: Client
    settings: Settings
    env_kwargs: Mapping[str, Mapping[str, Any]] | None = None
    """Per env name, keyword arguments for the env class (the rollout role's envs)."""

    @property
    def payload_limit(self) -> int | None:
        """Without external storage a payload over Temporal's limit would fail workflow tasks forever:
        rollouts keep their trajectories under it (gymflow.workflows.budget), model replies are refused over it."""
        from gymflow.activities.schema import PAYLOAD_LIMIT_BYTES

        return None if self.client.data_converter.external_storage else PAYLOAD_LIMIT_BYTES


def secret(value: SecretStr | None) -> str | None:
    """A secret setting's value (`model_api_key`, `judge_api_key`), or None when unset."""
    return value.get_secret_value() if value else None


def rollout_workflows() -> list[type]:
    """The workflows of the rollout role."""
    from gymflow.workflows.group import BatchRolloutWorkflow, GroupRolloutWorkflow
    from gymflow.workflows.rescore import RescoreBatchWorkflow
    from gymflow.workflows.rollout import RolloutWorkflow
    from gymflow.workflows.session import RolloutSessionWorkflow

    return [RolloutWorkflow, GroupRolloutWorkflow, BatchRolloutWorkflow, RolloutSessionWorkflow, RescoreBatchWorkflow]


def dataset_workflows() -> list[type]:
    """The workflows of the dataset role."""
    from gymflow.workflows.dataset import DatasetGenerationWorkflow

    return [DatasetGenerationWorkflow]


def training_workflows() -> list[type]:
    """The workflows of the training role."""
    from gymflow.workflows.training import TrainingRunWorkflow

    return [TrainingRunWorkflow]


def all_workflows() -> list[type]:
    """Every gymflow workflow (for replayers, and for listings that must know each type)."""
    return [*rollout_workflows(), *dataset_workflows(), *training_workflows()]


def rollout(context: Context) -> Served:
    """The shared queue's rollout workflows and activities, this node's queue, admission, the reaper and
    the model gateway."""
    from gymflow.activities.env import EnvActivities
    from gymflow.activities.gateway import GatewayActivities
    from gymflow.activities.harness import HarnessActivities
    from gymflow.activities.model import ModelActivities
    from gymflow.activities.report import ReportActivities
    from gymflow.activities.rescore import RescoreActivities
    from gymflow.activities.resume import ResumeActivities
    from gymflow.activities.storage import StorageActivities
    from gymflow.activities.turn import TurnActivities
    from gymflow.envs.mcp.ledger import reap_orphans
    from gymflow.envs.runtime.admission import Admission
    from gymflow.envs.runtime.node import NodeRuntimes
    from gymflow.workers.dedup import DedupInterceptor
    from gymflow.workers.fencing import StaleTaskGuard
    from gymflow.workers.metrics import GymflowMetrics, MetricsInterceptor, NodeSampler
    from gymflow.workers.reaper import run_reaper
    from gymflow.workers.servers.gateway import Gateway

    settings = context.settings
    queue = names.node_queue(settings.task_queue, settings.node_id)
    # Servers and workspaces of workers that died on this host (never those of live ones).
    reap_orphans(settings.workspace_root)
    # One admission control per node, shared by every env and the task loader (gymflow.envs.runtime.admission).
    admission = Admission(settings.capacity(), nice=settings.env_nice)
    # gymflow's series on the runtime's meter (a no-op without --metrics-port: gymflow.workers.metrics).
    metrics = GymflowMetrics((context.client.service_client.config.runtime or Runtime.default()).metric_meter)
    # The node's runtimes (gymflow.envs.runtime.node): its container runtime is made only when an env
    # first runs a server or task in a container, and closed when the worker stops.
    runtimes = NodeRuntimes(node_id=settings.node_id, state_root=settings.runtime_state_dir)
    env = EnvActivities(
        node_id=settings.node_id,
        node_queue=queue,
        workspace_root=settings.workspace_root / settings.node_id,
        env_kwargs=context.env_kwargs,
        common_env_kwargs={
            "pool_size": settings.mcp_pool_size,
            "default_workspace_quota_mb": settings.workspace_quota_mb,
            "runtimes": runtimes,
        },
        payload_limit_bytes=context.payload_limit,
        admission=admission,
    )
    model = ModelActivities(
        default_base_url=settings.model_url,
        default_model=settings.model_name,
        api_key=secret(settings.model_api_key),
        payload_limit_bytes=context.payload_limit,
    )
    storage = StorageActivities(
        default_uri=settings.results_uri, s3_endpoint_url=settings.s3_endpoint_url, admission=admission
    )
    reports = ReportActivities(storage, ui_base=settings.ui_url)
    rescore = RescoreActivities(storage, env)  # an env that rescores is scored by this node's instance
    resume = ResumeActivities(storage)
    # The node's model gateway: harness rollouts' agent programs call models through it (gymflow.workflows.harness).
    gateway = Gateway(context.client, host=settings.gateway_host, port=settings.gateway_port)
    shared = Queue(
        settings.task_queue,
        workflows=rollout_workflows(),
        activities=[
            model.generate,
            GatewayActivities(model).model_call,
            env.init_rollout,
            env.compute_group_reward,
            storage.write_jsonl,
            storage.load_tasks,
            reports.render_batch_report,
            rescore.prepare_rescore,
            rescore.rescore_part,
            resume.carry_over,
        ],
        interceptors=[MetricsInterceptor(metrics)],
    )
    node = Queue(
        queue,
        activities=[
            env.init_rollout,  # a rollout pinned to this node (an agentic judge, RolloutInput.node_queue)
            env.call_tool,
            env.compute_reward,
            env.release_rollout,
            env.env_response,
            TurnActivities(model, env).play_turn,
            HarnessActivities(env, gateway).run_program,
        ],
        # A retried attempt whose first attempt completed here (its report was lost) must not re-run the tool.
        # Fused turns are left out: only stateless envs fuse, so running one again is harmless, and
        # remembering them would keep every turn's reply (token ids and logprobs included) in memory.
        # A task reaching this node after the server timed it out (a partition) is not run (workers.fencing).
        interceptors=[StaleTaskGuard(), DedupInterceptor(activity_types=DEDUPLICATED), MetricsInterceptor(metrics)],
    )

    async def reaper() -> None:
        await run_reaper(
            context.client,
            env,
            workspace_root=settings.workspace_root,
            interval_s=settings.reap_interval_s,
            fence_after_s=settings.fence_after_s,
            runtimes=runtimes,
        )

    sampler = NodeSampler(metrics, admission, env.held, settings.workspace_root / settings.node_id, settings.node_id)

    async def sampling() -> None:  # the node's gauges: admission, live rollouts, servers, containers
        async with sampler.running():
            await asyncio.Event().wait()  # until cancelled

    return Served(
        "rollout",
        [shared, node],
        background=[reaper, sampling],
        servers=[gateway],
        close=[env.shutdown, runtimes.close, model.aclose],
        env=env,
        model=model,
        gateway=gateway,
    )


def judge(context: Context) -> Served:
    """The judge activity on the judge queue, rate limited for the whole deployment by the server."""
    from gymflow.activities.judge import JudgeActivities
    from gymflow.workers.judge_worker import judge_queue_options

    settings = context.settings
    activities = JudgeActivities(
        default_base_url=settings.judge_url, default_model=settings.judge_model, api_key=secret(settings.judge_api_key)
    )
    queue = Queue(
        names.judge_queue(settings.task_queue),
        activities=[activities.judge, activities.judge_group],
        options=judge_queue_options(rate_per_second=settings.judge_rate_per_second),
    )
    return Served("judge", [queue], close=[activities.aclose])


def dataset(context: Context) -> Served:
    """Dataset generation (workflow and activities) on the dataset queue."""
    from gymflow.activities.dataset import DatasetActivities

    settings = context.settings
    activities = DatasetActivities(
        default_uri=settings.results_uri,
        s3_endpoint_url=settings.s3_endpoint_url,
        default_model_url=settings.model_url,
        default_judge_url=settings.judge_url,
        model_api_key=secret(settings.model_api_key),
        judge_api_key=secret(settings.judge_api_key),
    )
    queue = Queue(
        names.dataset_queue(settings.task_queue),
        workflows=dataset_workflows(),
        activities=[
            activities.scan_dataset_source,
            activities.generate_dataset_batch,
            activities.merge_dataset_batch,
            activities.finalize_dataset,
        ],
    )
    return Served("dataset", [queue], close=[activities.aclose])


def training(context: Context) -> Served:
    """Training runs (workflow, training and trainer-job activities) on the training queue."""
    from gymflow.activities.trainer_jobs import TrainerActivities
    from gymflow.activities.training import TrainingActivities

    settings = context.settings
    runs = TrainingActivities(
        data_dir=settings.data_dir, default_storage=settings.results_uri, s3_endpoint_url=settings.s3_endpoint_url
    )
    trainers = TrainerActivities(
        data_dir=settings.data_dir,
        temporal_address=context.client.service_client.config.target_host,  # what trainers dial back
        namespace=context.client.namespace,
        s3_endpoint_url=settings.s3_endpoint_url,
    )
    queue = Queue(
        names.training_queue(settings.task_queue),
        workflows=training_workflows(),
        activities=[*runs.activities(), *trainers.activities()],
    )
    return Served("training", [queue])


BUILDERS: Mapping[WorkerRole, Callable[[Context], Served]] = {
    "rollout": rollout,
    "judge": judge,
    "dataset": dataset,
    "training": training,
}
"""The builder of each role (one per `ROLES` entry)."""
