"""The workflows' input and result types, and the search attributes a rollout starts with.

Kept out of the workflow modules on purpose: the workflow sandbox re-imports a workflow's own
module for every run, and a pydantic model defined there would be rebuilt, with a new type adapter
in the data converter, for every rollout. This module is passed through the sandbox
(`workers.worker.SANDBOX_PASSTHROUGH`), so each model is built once per worker. It is pure: no I/O,
nothing nondeterministic.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from temporalio.common import SearchAttributePair

from activities.model import ModelConfig
from envs.contract import Task, Trajectory, Wire
from workflows import names
from workflows.judging import JudgeConfig

MAX_ATTEMPTS = 1000
"""Upper bound of retry attempts (Temporal's RetryPolicy holds an int32; nobody needs more)."""
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""Upper bound of any timeout in the input (a larger float overflows a protobuf Duration)."""
MAX_NAME_CHARS = 512
"""Env and model names become search attributes; the server refuses keywords over 2 KB."""
PAYLOAD_LIMIT_BYTES = 2 * 1024 * 1024
"""Temporal's default limit of one payload (`limit.blobSize.error`). A workflow task whose command
carries a bigger one fails, and is retried, forever: without external payload storage rollouts
keep their trajectories under it, and groups their results."""


GROUP_INLINE_BYTES = 1024 * 1024
"""A group whose conversations take more than this passes them by reference (rollout workflow ids)
to the group reward and leaves them out of its result, which stays small with or without external
payload storage."""


class RolloutLimits(Wire):
    """Budgets of one rollout."""

    max_turns: int = Field(default=10, ge=1, le=1000)
    """Model turns (generate calls) at most."""
    max_tool_calls: int = Field(default=64, ge=0)
    """Tool calls executed at most, over the whole rollout."""
    max_context_tokens: int | None = Field(default=None, ge=1)
    """Stop before a turn whose prompt would exceed this (None: rely on the endpoint's error)."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """Stop once the model has generated this many tokens in total."""
    max_tool_output_chars: int = Field(default=16_000, ge=256)
    """Tool output longer than this is truncated with a visible marker."""
    tool_timeout_s: float = Field(default=60.0, gt=0, le=MAX_TIMEOUT_S)
    """Time limit of one tool call; a timeout is an error observation."""


class RetrySettings(Wire):
    """How hard Temporal tries before a rollout is declared an infra failure."""

    model_attempts: int = Field(default=5, ge=1, le=MAX_ATTEMPTS)
    """Attempts per model turn (retryable errors only: connection, 408/409/429/5xx)."""
    env_attempts: int = Field(default=3, ge=1, le=MAX_ATTEMPTS)
    """Attempts per env activity."""
    node_timeout_s: float = Field(default=60.0, gt=0, le=MAX_TIMEOUT_S)
    """A node that has not picked up a rollout's activity within this is presumed lost."""
    max_recoveries: int = Field(default=2, ge=0)
    """Re-initialisations after node/server loss before giving up."""


class RolloutInput(Wire):
    """Input of RolloutWorkflow."""

    env: str = Field(max_length=MAX_NAME_CHARS)
    """Registered env name or env-file path (see `gymflow envs`); becomes the GymflowEnv search attribute."""
    task: Task
    model: ModelConfig = Field(default_factory=ModelConfig)
    limits: RolloutLimits = Field(default_factory=RolloutLimits)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    rollout_id: str | None = None
    """Default: the workflow id."""
    batch_id: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """Set by parent workflows; becomes the GymflowBatch search attribute."""
    judge: JudgeConfig | None = None
    """Have an LLM judge score the rollout (the rubric defaults to the env's)."""


RolloutResult = Trajectory
"""Result of RolloutWorkflow: the full trajectory with reward and termination."""


def initial_search_attributes(input: RolloutInput) -> list[SearchAttributePair[Any]]:
    """GymflowEnv / GymflowModel / GymflowStatus=running (/ GymflowBatch) of a starting rollout."""
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(names.SA_ENV, input.env),
        SearchAttributePair(names.SA_MODEL, input.model.model or "default"),
        SearchAttributePair(names.SA_STATUS, "running"),
    ]
    if input.batch_id:
        pairs.append(SearchAttributePair(names.SA_BATCH, input.batch_id))
    return pairs


class GroupInput(Wire):
    """Input of GroupRolloutWorkflow."""

    rollout: RolloutInput
    """Template of every sample (env, task, model, limits); a model seed, if set, is offset per sample."""
    n: int = Field(default=8, ge=1, le=512)
    """Samples of the task."""
    scale_by_std: bool = True
    """GRPO advantages (r - mean) / std; False gives Dr. GRPO's unscaled r - mean."""
    group_reward: bool = True
    """Call the env's compute_group_reward and add its components to each sample's reward."""


class GroupResult(Wire):
    """The group, with rewards and advantages aligned to `trajectories`."""

    task_id: str
    trajectories: list[Trajectory]
    rewards: list[float | None]
    """Total reward per sample (None for infra-failed samples)."""
    advantages: list[float | None]
    """Advantage per sample (None for infra-failed samples)."""
    mean_reward: float | None
    infra_failed: int
    messages_omitted: bool = False
    """True when the conversations were too large to return inline (over `GROUP_INLINE_BYTES`):
    every trajectory's `messages` is then empty, and its rollout workflow (id `rollout_id`) holds
    them. `workers.client.iterate_groups` reads them back."""


class RolloutOptions(Wire):
    """What every rollout of a batch shares: the model, the budgets and the retry settings."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    limits: RolloutLimits = Field(default_factory=RolloutLimits)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    judge: JudgeConfig | None = None
    """LLM-judge settings (rubric rewards); None unless the env gives a rubric."""


class BatchState(Wire):
    """Progress carried across continue-as-new."""

    next_index: int = 0
    """Global index of the next rollout to start (task index * samples + sample)."""
    finished: int = 0
    """Rollouts finished (scored or infra-failed)."""
    scored: int = 0
    infra_failed: int = 0
    reward_sum: float = 0.0
    """Sum of the scored rewards, in completion order (deterministic under replay)."""
    parts: list[str] = Field(default_factory=list)
    """URIs of the JSONL parts written so far."""
    runs: int = 0
    """How many times the batch continued as new."""
    exhausted: bool = False


class BatchInput(Wire):
    """Input of BatchRolloutWorkflow: tasks inline, or an env dataset read page by page."""

    env: str = Field(max_length=MAX_NAME_CHARS)
    tasks: list[Task] = Field(default_factory=list)
    """Inline tasks (keep it small); or leave empty and name a `dataset`."""
    dataset: str | None = None
    """Dataset name or path understood by the env's `load_dataset`."""
    dataset_options: dict[str, object] = Field(default_factory=dict)
    num_tasks: int | None = Field(default=None, ge=1)
    """Use at most this many tasks."""
    samples_per_task: int = Field(default=1, ge=1, le=512)
    options: RolloutOptions = Field(default_factory=RolloutOptions)
    """Model, budgets and retries of every rollout."""
    window: int = Field(default=64, ge=1, le=1000)
    """Children in flight at most."""
    destination: str | None = None
    """Storage base URI for the JSONL parts (None: the worker's default store)."""
    flush_bytes: int = Field(default=400_000, ge=1024, le=1_500_000)
    """Write a JSONL part once buffered trajectories exceed this (under Temporal's 512 KB payload
    warning and far under its 2 MB limit)."""
    max_children_per_run: int = Field(default=400, ge=1)
    """Continue as new after starting this many children in one run (bounds history size)."""
    state: BatchState = Field(default_factory=BatchState)
    """Internal: progress carried across continue-as-new. Leave empty."""


class BatchResult(Wire):
    """What a batch produced; the trajectories are in `parts`."""

    batch_id: str
    total: int
    completed: int
    infra_failed: int
    mean_reward: float | None
    parts: list[str]
    """URIs of the JSONL parts holding every trajectory."""
    runs: int
