"""A worker's Prometheus metrics: the SDK's runtime metrics and gymflow's own, on one endpoint.

`gymflow worker --metrics-port P` (`GYMFLOW_METRICS_PORT`) builds the process's Temporal runtime
with the core's Prometheus exporter (`PrometheusConfig`) on `<metrics_host>:P/metrics`. The SDK
then exports its own series there (`temporal_workflow_task_schedule_to_start_latency`,
`temporal_activity_execution_latency`, `temporal_worker_task_slots_available`, request counts
and failures, ...) and gymflow's series are instruments of that same runtime's meter
(`Runtime.metric_meter`): one endpoint, no second HTTP server, no extra dependency, and nothing
recorded at all when no port is set (the meter is then a no-op). Every series carries the
worker's `node` label (a global tag).

Where each series comes from, without touching the code it measures:

* rollouts by env and status, rewards, infra failures by reason, rollout durations: a workflow
  interceptor around `RolloutWorkflow.run` reads its result (or its failure) and records it unless
  the workflow is replaying (as `workflow.metric_meter()` does, without that meter's task queue
  label: commands run on queues of their own), so a rollout counts once however often its history
  is replayed;
* model-call latency and tokens, tool calls by outcome: an activity interceptor around
  `generate`, `play_turn` (a fused turn's model call) and `call_tool`;
* the admission queue: its depth sampled, each wait observed as it ends (`Admission.on_admitted`);
* live rollouts, MCP server processes (from the node's ledger, gymflow.envs.mcp.ledger) and
  containers (the engine's, by the node's label): sampled every `SAMPLE_S` (containers every
  `CONTAINER_SAMPLE_S`: one engine command each).

`METRICS` lists every gymflow series; deploy/grafana-dashboard.json queries only those and the
SDK's (tests/workers/test_metrics.py checks both against a live worker's /metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import temporalio.activity
import temporalio.workflow
from temporalio.common import MetricMeter
from temporalio.runtime import PrometheusConfig, Runtime
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from gymflow.envs.errors import MetricsPortError
from gymflow.envs.mcp.ledger import live_processes
from gymflow.envs.runtime.admission import Admission, Step
from gymflow.workers import logs

log = logging.getLogger(__name__)

SAMPLE_S = 2.0
"""How often the gauges (live rollouts and servers, admission queue) are sampled."""
CONTAINER_SAMPLE_S = 15.0
"""How often the node's containers are counted (one engine command)."""

REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

ROLLOUTS = "gymflow_rollouts"
REWARD = "gymflow_rollout_reward"
ROLLOUT_SECONDS = "gymflow_rollout_duration_seconds"
INFRA_FAILURES = "gymflow_infra_failures"
MODEL_SECONDS = "gymflow_model_call_seconds"
MODEL_TOKENS = "gymflow_model_tokens"
TOOL_CALLS = "gymflow_tool_calls"
ADMISSION_WAITING = "gymflow_admission_waiting"
ADMISSION_BUSY = "gymflow_admission_busy"
ADMISSION_WAIT = "gymflow_admission_wait_seconds"
LIVE_ROLLOUTS = "gymflow_live_rollouts"
LIVE_SERVERS = "gymflow_live_mcp_servers"
LIVE_CONTAINERS = "gymflow_live_containers"

METRICS: Mapping[str, str] = {
    f"{ROLLOUTS}_total": "counter {env, status}: rollouts finished (completed, infra_failed, failed, cancelled)",
    REWARD: "histogram {env}: rewards of scored rollouts",
    ROLLOUT_SECONDS: "histogram {env}: wall time of finished rollouts",
    f"{INFRA_FAILURES}_total": "counter {env, reason}: infra-failed rollouts by termination reason",
    MODEL_SECONDS: "histogram {model, activity}: model-call latency (generate, or a fused play_turn)",
    f"{MODEL_TOKENS}_total": "counter {model, kind}: prompt and completion tokens",
    f"{TOOL_CALLS}_total": "counter {outcome}: tool calls run on this node (ok, error), fused turns' included",
    ADMISSION_WAITING: "gauge {step}: env steps queued for an admission slot",
    ADMISSION_BUSY: "gauge {step}: admission slots in use",
    ADMISSION_WAIT: "histogram {step}: seconds a step waited for its slot",
    LIVE_ROLLOUTS: "gauge: rollout states this node holds",
    LIVE_SERVERS: "gauge: MCP server processes this worker runs (warm pool included)",
    LIVE_CONTAINERS: "gauge: containers of this node",
}
"""Every gymflow series a worker exports (Prometheus names, counters with `_total`)."""


_RUNTIMES: dict[tuple[str, int], Runtime] = {}


def metrics_runtime(*, host: str, port: int, node: str) -> Runtime:
    """The process's Temporal runtime serving Prometheus metrics on host:port (one per endpoint).

    Raises:
        MetricsPortError: The port is taken or the host is not an address of this machine.
    """
    key = (host, port)
    if key not in _RUNTIMES:
        prometheus = PrometheusConfig(
            bind_address=f"{host}:{port}",
            counters_total_suffix=True,
            durations_as_seconds=True,
            histogram_bucket_overrides={REWARD: REWARD_BUCKETS, **dict.fromkeys(_SECONDS, SECONDS_BUCKETS)},
        )
        telemetry = dataclasses.replace(logs.core_telemetry(), metrics=prometheus, global_tags={"node": node})
        try:
            _RUNTIMES[key] = Runtime(telemetry=telemetry)
        except Exception as exc:  # the core reports a failed bind as a plain exception
            raise MetricsPortError(f"cannot serve metrics on {host}:{port}: {exc}") from None
    return _RUNTIMES[key]


_SECONDS = (ROLLOUT_SECONDS, MODEL_SECONDS, ADMISSION_WAIT)


@dataclasses.dataclass
class GymflowMetrics:
    """gymflow's instruments on one runtime's meter (a no-op meter records nothing)."""

    meter: MetricMeter

    def __post_init__(self) -> None:
        m = self.meter
        self.rollouts = m.create_counter(ROLLOUTS, "Rollouts finished")
        self.rollout_seconds = m.create_histogram_timedelta(ROLLOUT_SECONDS, "Rollout wall time", "s")
        self.reward = m.create_histogram_float(REWARD, "Rollout rewards")
        self.infra_failures = m.create_counter(INFRA_FAILURES, "Infra-failed rollouts")
        self.model_seconds = m.create_histogram_timedelta(MODEL_SECONDS, "Model-call latency", "s")
        self.model_tokens = m.create_counter(MODEL_TOKENS, "Model tokens", "tokens")
        self.tool_calls = m.create_counter(TOOL_CALLS, "Tool calls run on this node")
        self.admission_waiting = m.create_gauge(ADMISSION_WAITING, "Env steps waiting for admission")
        self.admission_busy = m.create_gauge(ADMISSION_BUSY, "Admission slots in use")
        self.admission_wait = m.create_histogram_timedelta(ADMISSION_WAIT, "Wait for an admission slot", "s")
        self.live_rollouts = m.create_gauge(LIVE_ROLLOUTS, "Rollout states held")
        self.live_servers = m.create_gauge(LIVE_SERVERS, "MCP server processes")
        self.live_containers = m.create_gauge(LIVE_CONTAINERS, "Containers of this node")

    def admitted(self, step: Step, waited_s: float) -> None:
        """`Admission.on_admitted`: one observed wait."""
        self.admission_wait.record(timedelta(seconds=waited_s), {"step": step})

    def rollout_ended(self, result: Any | None, *, env: str, status: str, seconds: float) -> None:
        """One finished rollout: its status, its reward, why it infra-failed, how long it took."""
        labels = {"env": env}
        self.rollouts.add(1, {**labels, "status": status})
        self.rollout_seconds.record(timedelta(seconds=max(seconds, 0.0)), labels)
        if result is None:
            return
        if result.infra_failed:
            self.infra_failures.add(1, {**labels, "reason": str(result.termination)})
        elif result.reward is not None:
            self.reward.record(float(result.reward.total), labels)


def env_label(env: str) -> str:
    """An env's metric label: its name, or an env file's name without its directory."""
    return Path(env).name if "/" in env else env


class MetricsInterceptor(Interceptor):
    """Records gymflow's rollout, model and tool series from the worker's workflows and activities."""

    def __init__(self, metrics: GymflowMetrics) -> None:
        self.metrics = metrics

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityMetrics(next, self.metrics)

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        metrics = self.metrics

        class RolloutMetrics(_RolloutMetrics):
            pass

        RolloutMetrics.metrics = metrics
        return RolloutMetrics


class _ActivityMetrics(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, metrics: GymflowMetrics) -> None:
        super().__init__(next)
        self.metrics = metrics

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        kind = temporalio.activity.info().activity_type
        if kind not in {"generate", "play_turn", "call_tool"}:
            return await self.next.execute_activity(input)
        started = time.monotonic()
        result = await self.next.execute_activity(input)
        if kind == "call_tool":
            self.metrics.tool_calls.add(1, {"outcome": "error" if getattr(result, "is_error", False) else "ok"})
            return result
        for ran in getattr(result, "results", ()):  # a fused turn runs its tool calls itself
            self.metrics.tool_calls.add(1, {"outcome": "error" if ran.is_error else "ok"})
        generated = getattr(result, "generated", result)  # a fused turn's reply, or generate's own
        usage = getattr(generated, "usage", None)
        model = str(getattr(generated, "model", "") or "")
        labels = {"model": model, "activity": kind}
        self.metrics.model_seconds.record(timedelta(seconds=time.monotonic() - started), labels)
        if usage is not None:
            self.metrics.model_tokens.add(int(usage.prompt_tokens), {"model": model, "kind": "prompt"})
            self.metrics.model_tokens.add(int(usage.completion_tokens), {"model": model, "kind": "completion"})
        return result


class _RolloutMetrics(WorkflowInboundInterceptor):
    """Counts each RolloutWorkflow once, when it ends live (never while its history replays)."""

    metrics: GymflowMetrics

    def _ended(self, result: Any | None, *, env: str, status: str) -> None:
        if temporalio.workflow.unsafe.is_replaying():
            return
        seconds = (temporalio.workflow.now() - temporalio.workflow.info().start_time).total_seconds()
        self.metrics.rollout_ended(result, env=env, status=status, seconds=seconds)

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        info = temporalio.workflow.info()
        if info.workflow_type != "RolloutWorkflow":
            return await self.next.execute_workflow(input)
        env = env_label(str(getattr(input.args[0], "env", "")) if input.args else "")
        try:
            result = await self.next.execute_workflow(input)
        except asyncio.CancelledError:
            self._ended(None, env=env, status="cancelled")
            raise
        except Exception as exc:
            if temporalio.workflow.is_failure_exception(exc):  # the workflow fails (else: a task failure, retried)
                self._ended(None, env=env, status="failed")
            raise
        self._ended(result, env=env, status="infra_failed" if getattr(result, "infra_failed", False) else "completed")
        return result


@dataclasses.dataclass
class NodeSampler:
    """Samples a node's gauges while the worker runs."""

    metrics: GymflowMetrics
    admission: Admission
    held: Any
    """`EnvActivities.held` (a callable): the rollout states this node holds."""
    workspace_root: Path
    """This node's workspace directory, where its env ledgers live."""
    node_id: str

    def sample(self) -> None:
        """Set the admission, rollout and server gauges now."""
        for step, numbers in self.admission.stats().items():
            self.metrics.admission_waiting.set(numbers["waiting"], {"step": step})
            self.metrics.admission_busy.set(numbers["busy"], {"step": step})
        self.metrics.live_rollouts.set(len(self.held()))
        self.metrics.live_servers.set(live_processes(self.workspace_root))

    async def count_containers(self) -> int | None:
        """Containers labelled with this node (None: no engine on this node)."""
        from gymflow.envs.runtime.engine import LABEL_MARKER, LABEL_NODE, Engine, EngineUnavailable

        try:
            engine = Engine.detect()
        except EngineUnavailable:
            return None
        return len(await engine.containers({LABEL_MARKER: "1", LABEL_NODE: self.node_id}))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Sample every SAMPLE_S while the block runs."""
        self.admission.on_admitted = self.metrics.admitted
        task = asyncio.create_task(self._loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.admission.on_admitted = None

    async def _loop(self) -> None:
        containers_at = 0.0
        engine = True
        while True:
            try:
                await asyncio.to_thread(self.sample)
                if engine and time.monotonic() >= containers_at:
                    containers_at = time.monotonic() + CONTAINER_SAMPLE_S
                    count = await self.count_containers()
                    engine = count is not None  # no engine now: none later either
                    self.metrics.live_containers.set(count or 0)
            except Exception:  # a bad sample must not end the sampling
                log.debug("metrics sample failed", exc_info=True)
            await asyncio.sleep(SAMPLE_S)
