"""The training run's config, input, result and the reports a trainer sends back.

`RunConfig` is what a user writes (YAML, `gymflow train launch CONFIG`); `TrainingRunInput` wraps
it with the run id and the workflow's internal state (carried across continue-as-new). Reports
(`StepReport`, `FinishReport`) are the trainer contract's way back: updates to the run workflow.
Pure and passed through the workflow sandbox (like gymflow.activities.schema): no I/O here; YAML parsing
lives in gymflow.workers.sdk.training.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import MAX_NAME_CHARS, RetrySettings, RolloutLimits, RolloutOptions
from gymflow.envs.contract import Wire

RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
"""Run ids become workflow ids, cluster names, storage keys and directory names."""
_ACCELERATOR_RE = re.compile(r"[A-Za-z0-9_-]+(:\d+(\.\d+)?)?")
_SIZE_RE = re.compile(r"\d+(\.\d+)?\+?")
Backend = Literal["local", "skypilot"]


class Resources(Wire):
    """What the trainer needs: SkyPilot's `resources` keys (a subset; a typo is an error naming it).
    The local backend checks cpus, memory and accelerators against this machine."""

    cpus: int | str | None = None
    """CPUs, `8` or `8+`."""
    memory: int | str | None = None
    """GB of memory, `32` or `32+`."""
    accelerators: str | dict[str, int] | None = None
    """`H100:8`, `A100`, or {name: count}."""
    infra: str | None = None
    """SkyPilot infra: `aws`, `gcp/us-central1`, `k8s`, ..."""
    instance_type: str | None = None
    use_spot: bool | None = None
    disk_size: int | None = Field(default=None, gt=0)
    """GB of disk."""
    image_id: str | None = None
    ports: int | str | list[int | str] | None = None

    @field_validator("cpus", "memory")
    @classmethod
    def _size(cls, value: int | str | None) -> int | str | None:
        if value is None:
            return value
        if isinstance(value, bool) or (isinstance(value, int) and value <= 0):
            raise ValueError(f"must be a positive number (or 'N+'), got {value!r}")
        if isinstance(value, str) and not _SIZE_RE.fullmatch(value):
            raise ValueError(f"must be a number or 'N+', got {value!r}")
        return value

    @field_validator("accelerators")
    @classmethod
    def _accelerators(cls, value: str | dict[str, int] | None) -> str | dict[str, int] | None:
        if isinstance(value, str) and not _ACCELERATOR_RE.fullmatch(value):
            raise ValueError(f"must be NAME or NAME:COUNT (e.g. H100:8), got {value!r}")
        if isinstance(value, dict) and any(not isinstance(n, int) or n <= 0 for n in value.values()):
            raise ValueError(f"counts must be positive integers, got {value!r}")
        return value

    def minimum(self, field: str) -> float | None:
        """The lower bound of `cpus`/`memory` (`8+` -> 8), or None."""
        value = getattr(self, field)
        return None if value is None else float(str(value).rstrip("+"))


class TrainerConfig(Wire):
    """Which trainer runs and where."""

    backend: Backend = "local"
    """`local`: a subprocess on the worker's host. `skypilot`: a SkyPilot cluster (task YAML)."""
    command: list[str] = Field(default_factory=lambda: ["python", "-m", "gymflow.workers.trainers.reference"])
    """Local backend: the trainer's command line (run in `workdir`)."""
    task_file: str = "deploy/trainer_skyrl.yaml"
    """SkyPilot backend: the trainer's task YAML (relative to `workdir`)."""
    workdir: str = "."
    """Working directory of the local trainer, and the base of `task_file`; resolved by the worker."""
    resources: Resources = Field(default_factory=Resources)
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables of the trainer (never secrets: those come from the worker's environment)."""
    stop_grace_s: float = Field(default=5.0, gt=0, le=600)
    """On cancel: seconds between SIGTERM and SIGKILL (local) ."""


class DatasetConfig(Wire):
    """Where the tasks come from."""

    uri: str = "generated"
    """A dataset directory or prefix (`manifest.json`, `train.jsonl`, `eval.jsonl`; a path, file:// or
    s3://), as the dataset workflow writes it; or a dataset name the env's `load_dataset` understands
    (math: `generated` or a JSONL path)."""
    train: dict[str, Any] = Field(default_factory=dict)
    """Env datasets: `load_dataset` keyword arguments of the train split (math: n, seed, difficulty)."""
    eval: dict[str, Any] | None = None
    """Env datasets: `load_dataset` keyword arguments of the eval split (None: the train split's)."""


class AlgorithmConfig(Wire):
    """What the trainer is asked to do (it receives these verbatim; the reference trainer reads all)."""

    steps: int = Field(default=20, ge=0, le=10_000_000)
    group_size: int = Field(default=8, ge=1, le=512)
    """Samples per task (GRPO group)."""
    tasks_per_step: int = Field(default=8, ge=1, le=100_000)
    lr: float = Field(default=0.5, gt=0)
    scale_by_std: bool = True
    checkpoint_every: int = Field(default=10, ge=1)
    """Write and report a checkpoint every this many steps (and after the last)."""
    seed: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)
    """Trainer-specific settings."""


class EvalConfig(Wire):
    """How every reported checkpoint is evaluated against the baseline."""

    tasks: int = Field(default=100, ge=1, le=1_000_000)
    """Eval-split tasks per evaluation (the first N)."""
    samples: int = Field(default=1, ge=1, le=64)
    """Samples per task."""
    window: int = Field(default=32, ge=1, le=1000)
    reps: int = Field(default=2000, ge=100, le=100_000)
    """Bootstrap resamples of the comparison."""


class PolicyRef(Wire):
    """A policy as an endpoint: an env baseline policy by name (gymflow serves it for the run), a URL,
    or a checkpoint the trainer reports (the endpoint it reports with it)."""

    policy: str | None = None
    """Name of one of the env's baseline policies (`calculator`, `softmax`, ...)."""
    base_url: str | None = None
    """An OpenAI-compatible endpoint (…/v1)."""
    model: str = ""
    checkpoint: str | None = None
    """A checkpoint the trainer reports, by name (`step-000000`: a trainer's starting weights, which
    it serves itself): the baseline is evaluated once it is reported, and is not compared with itself."""

    @model_validator(mode="after")
    def _one(self) -> PolicyRef:
        if sum(x is not None for x in (self.policy, self.base_url, self.checkpoint)) != 1:
            raise ValueError(
                "give exactly one of 'policy' (an env baseline policy), 'base_url' or 'checkpoint' (one the "
                "trainer reports)"
            )
        return self


class ValidationConfig(Wire):
    """Checks before anything is launched."""

    smoke_policy: PolicyRef | None = Field(default_factory=lambda: PolicyRef(policy="default"))
    """Smoke rollouts are played by this policy (None: no smoke rollouts)."""
    smoke_rollouts: int = Field(default=4, ge=0, le=256)
    min_mean_reward: float | None = None
    """Fail validation when the smoke rollouts score less on average."""


class RunConfig(Wire):
    """A training run, as the user writes it (`gymflow train launch CONFIG`)."""

    run_id: str | None = None
    """The run's id (workflow id, cluster name, storage prefix). Launching the same id twice gives one run."""
    env: str = Field(max_length=MAX_NAME_CHARS)
    """Registered env name or env-file path."""
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy being trained, as rollouts call it (the trainer may override base_url/model per step)."""
    limits: RolloutLimits = Field(default_factory=RolloutLimits)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    baseline: PolicyRef
    """What every checkpoint is compared with."""
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    storage: str | None = None
    """Base URI of the run's files (file:///dir or s3://bucket/prefix); None: the worker's results store."""
    env_packages: dict[str, str] = Field(default_factory=dict)
    """Env packages the run needs, distribution name -> version (`1.2.0` or `==1.2.0`): validation
    fails, naming the install command, when a pinned version is not installed on the worker, and
    the run's bundle carries each of them (gymflow.envs.packages; gymflow.activities.bundle)."""

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str | None) -> str | None:
        if value is not None and not RUN_ID_RE.fullmatch(value):
            raise ValueError("use 1-100 letters, digits, '_', '.' or '-', starting with a letter or digit")
        return value

    def rollout_options(self, model: ModelConfig | None = None) -> RolloutOptions:
        """Options of the run's rollouts (training groups, evals) with `model`."""
        return RolloutOptions(model=model or self.model, limits=self.limits, retry=self.retry)


class CheckpointReport(Wire):
    """A checkpoint the trainer wrote."""

    name: str = Field(min_length=1, max_length=200)
    """Unique within the run, e.g. `step-000010`."""
    step: int = Field(ge=0)
    uri: str
    """Where the checkpoint lives (storage URI)."""
    endpoint: ModelConfig | None = None
    """Where it is served for evaluation (None: not evaluated)."""


class StepReport(Wire):
    """The trainer's `report` update: a finished step, its scalars, maybe a checkpoint."""

    step: int = Field(ge=0)
    scalars: dict[str, float] = Field(default_factory=dict)
    checkpoint: CheckpointReport | None = None


class FinishReport(Wire):
    """The trainer's `finish` update: it is done (answered once every checkpoint is evaluated)."""

    status: Literal["succeeded", "failed"] = "succeeded"
    message: str = ""


class EvalSummary(Wire):
    """One checkpoint against the baseline."""

    checkpoint: str
    step: int
    batch_id: str
    mean: float | None = None
    mean_low: float | None = None
    mean_high: float | None = None
    baseline_mean: float | None = None
    difference: float | None = None
    difference_low: float | None = None
    difference_high: float | None = None
    probability_of_improvement: float | None = None
    poi_low: float | None = None
    poi_high: float | None = None
    n_tasks: int = 0
    infra_failed: int = 0
    report_uri: str | None = None
    error: str | None = None


class CheckpointState(Wire):
    report: CheckpointReport
    eval: EvalSummary | None = None
    eval_started: bool = False


class LaunchRecord(Wire):
    """What the launch activity returned: enough to watch, stop and tear the trainer down."""

    backend: Backend
    run_id: str
    pid: int | None = None
    start_time: int | None = None
    log: str | None = None
    cluster: str | None = None
    job_id: int | None = None
    reused: bool = False
    """True when the trainer was already running (a retried or repeated launch)."""
    host: str | None = None
    """Local backend: the host the trainer runs on (only a worker there can watch or stop it)."""


class PreparedRun(Wire):
    """What validate / bundle / upload produced (lineage)."""

    spec_uri: str
    """The trainer spec in storage (`run.json`): the trainer's one input."""
    manifest_uri: str
    dataset_digest: str
    env_digest: str
    config_digest: str
    bundle_uri: str
    train_uri: str
    eval_uri: str
    train_tasks: int
    eval_tasks: int
    baseline: ModelConfig
    """The baseline as an endpoint."""
    services: list[str] = Field(default_factory=list)
    """Names of the run's local policy services (for teardown)."""


class TrainingRunState(Wire):
    """Progress carried across continue-as-new."""

    phase: str = "validating"
    prepared: PreparedRun | None = None
    launch: LaunchRecord | None = None
    step: int = -1
    scalars: dict[str, float] = Field(default_factory=dict)
    history: list[dict[str, float]] = Field(default_factory=list)
    """Scalars per reported step (bounded: the last `HISTORY_KEEP`)."""
    checkpoints: list[CheckpointState] = Field(default_factory=list)
    baseline_batch: str | None = None
    baseline_parts: list[str] | None = None
    """The baseline's eval trajectories (None until its batch finished)."""
    finish: FinishReport | None = None
    runs: int = 0


class TrainingRunInput(Wire):
    """Input of TrainingRunWorkflow."""

    config: RunConfig
    continue_as_new_events: int = Field(default=8000, ge=20, le=50_000)
    """Continue as new once history holds this many events (at a point with no child in flight)."""
    watch_slice_s: float = Field(default=300.0, gt=0, le=3600)
    """The watch activity returns after this long; the workflow then watches again."""
    state: TrainingRunState = Field(default_factory=TrainingRunState)
    """Internal: progress carried across continue-as-new. Leave empty."""


class TrainingRunResult(Wire):
    run_id: str
    status: Literal["completed", "failed", "cancelled"]
    steps: int
    checkpoints: list[CheckpointState]
    manifest_uri: str | None = None
    message: str = ""


class TrainerSpec(Wire):
    """The trainer's one input (`run.json` in storage, named by GYMFLOW_RUN_SPEC): the trainer contract's data."""

    run_id: str
    env: str
    config: RunConfig
    train_uri: str
    """Task JSONL of the train split."""
    eval_uri: str
    bundle_uri: str
    """The env as an sdist (`pip install -c requirements.txt BUNDLE`)."""
    requirements_uri: str
    bundle_digest: str
    dataset_digest: str
    storage: str
    """The run's storage base URI."""
    checkpoints: str
    """Base URI under which the trainer writes its checkpoints."""
    task_queue: str
    """Where the trainer's rollout groups run."""
