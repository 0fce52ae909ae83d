"""One settings tree for every gymflow process, read from GYMFLOW_* environment variables.

Parsed only in entry points (CLI, worker, server); library code takes keyword arguments.
Secrets (the model API key) live here and nowhere else: they are read by the worker that calls
the model and never enter workflow input or history.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import quote

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gymflow.activities.names import TASK_QUEUE, command_queue
from gymflow.envs.runtime.admission import Capacity, usable_cpus
from gymflow.workers.connection import Connection, ConnectionOptions, resolve

WorkerRole = Literal["rollout", "judge", "dataset", "training"]
"""What a worker can serve (gymflow.workers.roles): rollouts (workflows, model turns, env activities
on its node queue), the LLM judge, dataset generation, training runs."""
ROLES: tuple[WorkerRole, ...] = ("rollout", "judge", "dataset", "training")

SERVER_RECORD = "server.json"
"""Written in the data dir by `gymflow server` (and the demo): the frontend and Web UI ports it serves,
so every command that prints a link or serves the codec knows the UI's port."""


def _default_node_id() -> str:
    # Unique per process: a rollout's servers die with the process that started them, so a
    # restarted worker is a new node, never a namesake that lacks the rollout's state.
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Settings(BaseSettings):
    """gymflow configuration (env prefix GYMFLOW_, e.g. GYMFLOW_TEMPORAL_ADDRESS)."""

    model_config = SettingsConfigDict(env_prefix="GYMFLOW_", extra="ignore")

    temporal_address: str = "localhost:7233"
    """host:port of the Temporal frontend. When GYMFLOW_TEMPORAL_ADDRESS is unset, TEMPORAL_ADDRESS or the
    temporal.toml profile decides, else this default (gymflow.workers.connection; use `temporal_connection()`)."""
    namespace: str = "default"
    """Temporal namespace; when GYMFLOW_NAMESPACE is unset, TEMPORAL_NAMESPACE or the profile decides."""
    connection: ConnectionOptions = Field(default_factory=ConnectionOptions, exclude=True)
    """Explicit connection options (the CLI's --address, --profile, --api-key, --tls-* flags), over
    every variable and profile. The API key and TLS come from TEMPORAL_* variables and temporal.toml
    profiles, as for every Temporal tool, never from GYMFLOW_* variables."""
    task_queue: str = TASK_QUEUE
    """Shared task queue for workflows, model calls and rollout initialisation. A CLI command that
    runs a worker in its own process (`rollout`, `demo`, `eval`, `dataset generate`, `train launch
    --wait`) uses a queue of its own derived from it (`command_queue`); with `--no-worker` it
    starts its workflows here, for the `gymflow worker` fleet."""
    worker_roles: Annotated[tuple[WorkerRole, ...], NoDecode] = ROLES
    """The roles `gymflow worker` serves, comma-separated (`rollout,judge`); default all of them. Each
    role polls queues of its own (gymflow.workers.roles), so a fleet can give nodes different roles:
    every role must be served by some worker of the deployment for its work to run. A CLI command's
    in-process worker serves the roles its command needs, whatever this says."""
    node_id: str = Field(default_factory=_default_node_id)
    """This worker's node id; its private queue is `<task_queue>@<node_id>`."""
    data_dir: Path = Path(".gymflow")
    """Server database, logs and local results."""
    env_packages_dir: Path | None = None
    """Where env packages live (`gymflow envs install`, gymflow.envs.packages.store; every process of a
    node reads this variable, GYMFLOW_ENV_PACKAGES_DIR). None: `<data_dir>/env-packages`."""
    workspace_root: Path = Field(default_factory=lambda: Path(tempfile.gettempdir()) / "gymflow-workspaces")
    """Parent of per-rollout workspaces on this node."""
    model_url: str | None = None
    """Default OpenAI-compatible endpoint (…/v1) for rollouts whose input names none."""
    model_name: str = ""
    """Default model name sent to that endpoint."""
    model_api_key: SecretStr | None = None
    """API key for the model endpoint. Read by the worker only; never put in workflow input."""
    gateway_host: str = "127.0.0.1"
    """Interface of this node's model gateway, which harness rollouts' agent programs call
    (gymflow.workers.servers.gateway); programs run on the node, so loopback by default."""
    gateway_port: int = Field(default=0, ge=0, le=65535)
    """Port of the model gateway; 0 picks a free one."""
    judge_url: str | None = None
    """Default OpenAI-compatible endpoint (…/v1) of the LLM judge for rubric rewards."""
    judge_model: str = ""
    """Default judge model name."""
    judge_api_key: SecretStr | None = None
    """API key of the judge endpoint (worker config only, never in workflow input)."""
    judge_rate_per_second: float | None = 10.0
    """Judge calls per second across ALL workers of the deployment (server-side queue rate limit);
    every worker must use the same value."""
    storage_uri: str | None = None
    """Where batches write results: file:///dir or s3://bucket/prefix (default: <data_dir>/results)."""
    s3_endpoint_url: str | None = None
    """S3 API endpoint for non-AWS stores (MinIO, moto); credentials come from the usual AWS_* env."""
    mcp_pool_size: int = Field(default=2, ge=0)
    """MCP server sets each env keeps started ahead of demand on this node (0: start per rollout)."""
    workspace_quota_mb: int = Field(default=1024, ge=1)
    """Disk quota of each rollout's workspace, for envs that set none of their own (an env's
    `workspace_quota_mb`, e.g. in its env file): going over is an error observation."""
    reap_interval_s: float = Field(default=30.0, gt=0)
    """How often the worker checks the workflows of the rollouts it holds against the server and
    frees the servers and workspaces of those that closed without releasing them (terminated,
    timed out, reset); each round also reaps what dead workers on this host left behind."""
    runtime_state_dir: Path = Path("/var/tmp/gymflow-runtime")
    """Where rollout containers keep their disks and the host's runtime lock files (shared by every
    worker process of a host, so each one's reaper finds what a killed sibling left)."""
    max_server_starts: int | None = Field(default=None, ge=1)
    """MCP server starts (process + handshake) this node runs at once; more wait, heartbeating, and
    their handshake timeout runs from admission (gymflow.envs.runtime.admission). None: one per core."""
    max_tool_runs: int | None = Field(default=None, ge=1)
    """Tool calls of CPU-bound envs (`BaseEnv.cpu_bound`: sheets' sandboxed code) at once on this
    node; a queued call's tool timeout starts when it is admitted. None: two per core."""
    max_rewards: int | None = Field(default=None, ge=1)
    """Rewards of CPU-bound envs (sandboxed recalculation) at once on this node. None: one per core."""
    cpu_workers: int | None = Field(default=None, ge=1)
    """Processes of the node's pool for CPU-bound env helpers (dataset generation, workbook
    reading), which threads would run under the worker's GIL. None: one per core, at most 4."""
    env_nice: int = Field(default=5, ge=0, le=19)
    """Niceness added to the processes env work starts (MCP servers, sandboxed runs, the pool), so
    the worker's heartbeats and workflow tasks are never starved by the work they schedule."""
    worker_processes: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    """Worker processes `gymflow worker` runs on this node (`auto`: one per usable core). Above 1 it
    supervises that many full workers, each with its own node id `<node_id>-p<i>` and a 1/N share of
    this node's admission slots, warm pool and workflow task slots (gymflow.workers.processes)."""
    max_concurrent_activities: int = 256
    """Activity slots per worker (per queue)."""
    max_concurrent_local_activities: int = 256
    """Local activity slots per worker: model turns run as local activities in the worker that
    runs the rollout's workflow."""
    max_concurrent_workflow_tasks: int | None = Field(default=None, ge=1)
    """Workflow task slots per worker. None: 8 per core. Workflow activations share the worker's
    GIL: with hundreds at once each takes seconds of wall time (the SDK fails one that runs over
    2 s as a deadlock, and a large history replayed after that can keep failing), while the tasks
    beyond the slots wait on the server, where they cost nothing. A workflow task stays open while
    a local-activity model turn (`ModelConfig.local_activity`) runs, so this also bounds how many
    of this worker's rollouts can be generating that way at once: raise it for local turns."""
    workflow_runner: Literal["fast", "stock"] = "fast"
    """How workflow code runs in the sandbox: `fast`, gymflow's runner (the SDK's sandbox without its
    per-payload entries into it), or `stock`, the SDK's own `SandboxedWorkflowRunner`. Both apply the
    same restrictions; `fast` falls back to `stock` by itself, with a warning, on an SDK whose
    internals it does not know (gymflow.workers.sandbox_runner)."""
    workflow_threads: int | None = None
    """Threads that run workflow activations (None: one per workflow task slot, the SDK default)."""
    max_cached_workflows: int = 1000
    """Workflows kept in memory between their tasks (sticky cache); an evicted rollout replays its
    whole history on its next task."""
    workflow_task_pollers: int = 5
    """Concurrent long polls for workflow tasks."""
    activity_task_pollers: int = 5
    """Concurrent long polls for activity tasks, per queue."""
    ui_port: int | None = None
    """Port of the Temporal Web UI. None: the one `gymflow server` recorded in the data dir for the
    server at `temporal_address` (`server.json`), else the frontend port + 1000 (Temporal's default,
    8233 for 7233)."""
    payload_storage_uri: str | None = None
    """s3://bucket/prefix: payloads over `payload_storage_threshold` (huge tool outputs, long
    trajectories) go there and history keeps a reference (temporalio ExternalStorage, S3 driver;
    endpoint `s3_endpoint_url`). Every worker and client of the deployment needs the same setting."""
    payload_storage_threshold: int = Field(default=256 * 1024, ge=0)
    """Payloads of at least this many bytes (after encryption) are stored externally."""
    encryption_key: SecretStr | None = None
    """Payload encryption key, `[id:]base64` of 16/24/32 random bytes (gymflow.workers.servers.codec): every
    payload is AES-GCM encrypted before it reaches the Temporal server. Worker/client config only."""
    decryption_keys: SecretStr | None = None
    """Comma-separated older keys (`[id:]base64`) still accepted for decryption (key rotation)."""
    codec_auth: SecretStr | None = None
    """If set, the codec server requires this exact `Authorization` header value
    (`temporal ... --codec-auth VALUE`); unset, TEMPORAL_CODEC_AUTH, the value the temporal CLI sends."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve Prometheus metrics (the SDK's runtime metrics and gymflow's, gymflow.workers.metrics) at
    http://<metrics_host>:<port>/metrics from `gymflow worker`; with --processes N, child i serves port + i."""
    metrics_host: str = "0.0.0.0"
    """Interface the metrics endpoint listens on."""
    otlp_endpoint: str | None = None
    """OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces): the worker and the CLI trace
    rollouts through the SDK's OpenTelemetry interceptor. Unset: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else
    OTEL_EXPORTER_OTLP_ENDPOINT (+ /v1/traces), else no tracing."""
    fence_after_s: float | None = Field(default=300.0, gt=0)
    """A worker that cannot reach its Temporal server for this long frees every rollout it holds
    (gymflow.workers.reaper): by then the rollouts that needed a step were re-initialised on other
    nodes, and servers nobody will call again must not live on. None: hold them however long the
    outage (a server restart of a few minutes then costs no rollout its state)."""

    def temporal_connection(self) -> Connection:
        """The cluster to dial (gymflow.workers.connection): explicit options, then GYMFLOW_TEMPORAL_ADDRESS /
        GYMFLOW_NAMESPACE when set, then TEMPORAL_* variables and the temporal.toml profile, then localhost:7233.

        Raises:
            gymflow.workers.connection.ConnectionConfigError: A named profile or config file cannot be loaded.
        """
        given = self.model_fields_set
        return resolve(
            self.connection,
            gymflow_address=self.temporal_address if "temporal_address" in given else None,
            gymflow_namespace=self.namespace if "namespace" in given else None,
        )

    @field_validator("worker_roles", mode="before")
    @classmethod
    def _split_roles(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple):
            if not value:
                raise ValueError(f"name at least one role of {', '.join(ROLES)}")
            return tuple(dict.fromkeys(value))  # once each, in the order given
        return value

    def command_queue(self, command: str, key: str | None = None) -> Settings:
        """These settings with a task queue of one CLI command's own (gymflow.activities.names.command_queue).

        `key` names the invocation (default: a fresh one); a command that can re-attach to its
        work (`train launch --wait` by run id) passes a key derived from it, to poll the same queue.
        The node queue and the judge queue derive from the task queue, so they follow.
        """
        queue = command_queue(self.task_queue, command, key or uuid.uuid4().hex[:8])
        return self.model_copy(update={"task_queue": queue})

    def capacity(self) -> Capacity:
        """This node's admission capacity: the machine's (cores, memory), with the settings' overrides."""
        detected = Capacity.detect()
        return Capacity(
            starts=self.max_server_starts or detected.starts,
            runs=self.max_tool_runs or detected.runs,
            rewards=self.max_rewards or detected.rewards,
            cpu_workers=self.cpu_workers or detected.cpu_workers,
            window=detected.window,
        )

    @property
    def process_count(self) -> int:
        """`worker_processes` as a number: `auto` is one per usable core (as `Capacity.detect` counts)."""
        return usable_cpus() if self.worker_processes == "auto" else self.worker_processes

    @property
    def workflow_task_slots(self) -> int:
        """`max_concurrent_workflow_tasks`, or the default for this machine's cores."""
        return self.max_concurrent_workflow_tasks or 8 * usable_cpus()

    @property
    def results_uri(self) -> str:
        """The default store of batch results."""
        return self.storage_uri or (self.data_dir / "results").resolve().as_uri()

    @property
    def frontend_port(self) -> int:
        """The port of the resolved Temporal address (7233 when it names none)."""
        return self.temporal_connection().port

    @property
    def web_ui_port(self) -> int:
        """The Web UI's port: `ui_port`, else what `gymflow server` recorded, else frontend port + 1000."""
        if self.ui_port is not None:
            return self.ui_port
        port = self.frontend_port
        try:
            recorded = json.loads((self.data_dir / SERVER_RECORD).read_text())
        except (OSError, ValueError):
            recorded = None
        if isinstance(recorded, dict) and recorded.get("port") == port and isinstance(recorded.get("ui_port"), int):
            return int(recorded["ui_port"])
        return port + 1000

    @property
    def ui_url(self) -> str:
        """Base URL of the Web UI for this namespace."""
        return f"http://localhost:{self.web_ui_port}/namespaces/{self.temporal_connection().namespace}"

    def ui_workflow_url(self, workflow_id: str, run_id: str | None = None) -> str:
        """The Web UI page of a workflow (its latest run without `run_id`)."""
        path = quote(workflow_id, safe="")
        return f"{self.ui_url}/workflows/{path}" + (f"/{run_id}/history" if run_id else "")
