"""The workflows' input and result types, and the search attributes a rollout starts with.

They live in the activities layer because both sides use them: the workflows orchestrate with
them, and activities (training checks and launches, the SDK's clients above) take them as input;
what two layers share sits in the lower one (docs/code-map.md). They are kept out of the workflow
modules on purpose too: the workflow sandbox re-imports a workflow's own
module for every run, and a pydantic model defined there would be rebuilt, with a new type adapter
in the data converter, for every rollout. This module is passed through the sandbox
(`gymflow.workers.sandbox_runner.SANDBOX_PASSTHROUGH`), so each model is built once per worker. It is pure: no I/O,
nothing nondeterministic.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field
from temporalio.common import SearchAttributePair

from gymflow.activities import names
from gymflow.activities.dataset_models import DEFAULT_ENV, DatasetSource, GenerationOptions, ScanResult
from gymflow.activities.judge import GroupJudgeConfig, JudgeConfig
from gymflow.activities.model import ModelConfig
from gymflow.envs.contract import EnvPackageRef, Task, Trajectory, Wire
from gymflow.envs.rewards.group_judge import GroupJudgement

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


PolicyMode = Literal["continue", "drain"]
"""What a running rollout does when its trainer announces new weights (`PolicyUpdate`): ``continue``
plays on the weights it has until the new ones are live, then moves to them at its next turn (a
partial rollout, each turn tagged with its version); ``drain`` finishes the turn it is in and waits at
the next turn boundary until the new weights are live."""


class PolicyUpdate(Wire):
    """A trainer's announcement to its running rollouts (the `names.POLICY_SIGNAL` signal)."""

    version: int = Field(ge=0)
    """The new policy version (a trainer step)."""
    live: bool = True
    """False: the weights are about to change (rollouts that drain wait at their next turn); True:
    version `version` serves now, from the next turn on."""
    model: ModelConfig | None = None
    """The endpoint of the new version, when it changes (another base URL or model name); None: the
    rollout's own, with `version`."""


RoleName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
"""A role's name, as the env declares it (`BaseEnv.roles`)."""


class AgenticJudgeConfig(Wire):
    """A judge with tools: a child rollout of a judge env (`workspace-judge` by default) that inspects
    what the judged rollout left in its workspace, on the judged rollout's node, before its state is
    released (gymflow.workflows.judging.agentic_judge). The child's reward is the judge's score."""

    env: str = Field(default="workspace-judge", max_length=MAX_NAME_CHARS)
    """The judge env; its init gets the judged workspace as ``init_args["source"]``."""
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(temperature=0.0))
    """The judge model (base_url None: the worker's default endpoint)."""
    instructions: str = Field(
        default="Score 1 if the agent did what its task asked and what it says it did is really there; "
        "0 if not; in between for partial work.",
        min_length=1,
        max_length=8_000,
    )
    """What the judge checks (its rubric, in prose)."""
    limits: RolloutLimits = Field(default_factory=lambda: RolloutLimits(max_turns=8, max_tool_calls=16))
    """The judge's own turn, tool and time budgets."""
    weight: float = Field(default=1.0, ge=0)
    """Weight of the judge's score in the rollout's reward."""
    combine: Literal["add", "replace"] = "add"
    """`add`: env total + weight x score; `replace`: weight x score alone."""


class RolloutInput(Wire):
    """Input of RolloutWorkflow."""

    compact_json = True

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
    fuse_turns: bool | None = None
    """Run each turn's tool calls in the model turn's activity (gymflow.activities.turn): None follows the
    env (`BaseEnv.fused_turns`), False keeps one activity per tool call, True asks for fused turns,
    which only a stateless env gets (a stateful env's completed calls are never run again)."""
    policy_mode: PolicyMode = "continue"
    """What the rollout does when its trainer announces new weights (`PolicyMode`)."""
    policy: PolicyUpdate | None = None
    """The trainer's newest announcement when the rollout starts (set by its group, which passes on
    later ones as `names.POLICY_SIGNAL` signals)."""
    agentic_judge: AgenticJudgeConfig | None = None
    """Have a judge with tools inspect the rollout's workspace (a child rollout on its node)."""
    node_queue: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """Pin the rollout's env to this node's queue (an agentic judge's child runs where the judged
    workspace is); a pinned rollout is not recovered elsewhere."""
    roles: dict[RoleName, ModelConfig] = Field(default_factory=dict)
    """For an env of several roles (`BaseEnv.roles`: a solver and its critic, two players): the model
    of each role named here; the roles not named play `model`, the trained policy that follows the
    trainer's announcements (`policy`). A role the env does not declare fails the rollout (InvalidInput)."""


RolloutResult = Trajectory
"""Result of RolloutWorkflow: the full trajectory with reward and termination."""


ROLLOUT_PLAN = 2
"""The RolloutWorkflow plan starters declare in the memo (`names.MEMO_PLAN`): plan 2 is the release
folded into the reward, start attributes upserted only when missing and opt-in local model turns."""


def rollout_memo(input: RolloutInput) -> dict[str, Any]:
    """The memo a starter sets on a rollout: its task id (listings show it without the input) and the
    plan it expects, which spares the rollout its patch marker."""
    return {"task_id": input.task.id, names.MEMO_PLAN: ROLLOUT_PLAN}


def initial_search_attributes(input: RolloutInput) -> list[SearchAttributePair[Any]]:
    """GymflowEnv / GymflowModel / GymflowTask (/ GymflowBatch) of a starting rollout; GymflowStatus is
    written only when it closes (gymflow.workflows.status)."""
    return names.start_attributes(
        input.env,
        model=input.model.model or "default",
        batch=input.batch_id,
        task=input.task.id[:MAX_NAME_CHARS],  # task ids have no length limit; keywords do
    )


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
    group_judge: GroupJudgeConfig | None = None
    """Judge the samples against each other (`gymflow.workflows.judging.judge_group`) and add the
    normalised score (`group/judge`) to each sample's reward; a judge that fails leaves the group's
    samples infra-failed, never scored 0."""


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
    group_id: str = ""
    """The group workflow's id, set by the SDK that streams groups (gymflow.workers.sdk.groups); trainers
    resuming a batch dedupe by it."""
    judgement: GroupJudgement | None = None
    """The group judge's scores, orders and agreement, when the group was judged."""
    judge_note: str = ""
    """Why a group with a judge configured was not judged (or not used), when so."""
    messages_omitted: bool = False
    """True when the conversations were too large to return inline (over `GROUP_INLINE_BYTES`):
    every trajectory's `messages` and `tokens` are then empty, and its rollout workflow (id `rollout_id`) holds
    them. `gymflow.workers.sdk.client.iterate_groups` reads them back."""


class RolloutOptions(Wire):
    """What every rollout of a batch shares: the model, the budgets and the retry settings."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    limits: RolloutLimits = Field(default_factory=RolloutLimits)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    judge: JudgeConfig | None = None
    """LLM-judge settings (rubric rewards); None unless the env gives a rubric."""
    fuse_turns: bool | None = None
    """`RolloutInput.fuse_turns` of every rollout."""
    policy_mode: PolicyMode = "continue"
    """`RolloutInput.policy_mode` of every rollout."""
    agentic_judge: AgenticJudgeConfig | None = None
    """Have a judge with tools inspect the rollout's workspace (a child rollout on its node)."""
    node_queue: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """Pin the rollout's env to this node's queue (an agentic judge's child runs where the judged
    workspace is); a pinned rollout is not recovered elsewhere."""
    roles: dict[RoleName, ModelConfig] = Field(default_factory=dict)
    """`RolloutInput.roles` of every rollout."""

    def rollout(
        self, env: str, task: Task, *, batch_id: str | None = None, model: ModelConfig | None = None
    ) -> RolloutInput:
        """The input of one rollout with these options (`model`: instead of theirs, e.g. a per-sample seed)."""
        return RolloutInput(
            env=env,
            task=task,
            model=model or self.model,
            limits=self.limits,
            retry=self.retry,
            judge=self.judge,
            fuse_turns=self.fuse_turns,
            policy_mode=self.policy_mode,
            roles=self.roles,
            batch_id=batch_id,
        )


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
    env_packages: list[EnvPackageRef] = Field(default_factory=list)
    """The env packages (name, version, digest) the finished rollouts ran, each once, in order seen."""
    carried: int | None = None
    """With `BatchInput.resumed_from`: how many finished rollouts were carried over (counted above);
    None until they are."""
    done: list[tuple[int, int]] = Field(default_factory=list)
    """Index ranges [start, end) of the rollouts carried over, sorted and disjoint: never started here."""


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
    also_envs: list[str] = Field(default_factory=list, max_length=16)
    """Further envs that play every task too, side by side with `env` (e.g. two versions of an env
    package, or two packages whose dependencies conflict); each rollout's trajectory names its env."""
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
    label: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """What is evaluated (a policy's name, a checkpoint), the title of the batch's report; None: the
    model name."""
    resumed_from: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """A batch this one resumes (`gymflow eval --resume`): its finished rollouts that are not
    infra-failed are carried over into this batch's parts, and only the others run here. It must be
    of the same tasks, samples and envs; if it is still open, it is terminated (and its open rollouts)."""
    state: BatchState = Field(default_factory=BatchState)
    """Internal: progress carried across continue-as-new. Leave empty."""


def group_search_attributes(input: GroupInput) -> list[SearchAttributePair[Any]]:
    """GymflowEnv / GymflowModel (/ GymflowBatch) of a starting group: its template rollout's."""
    rollout = input.rollout
    return names.start_attributes(rollout.env, model=rollout.model.model or "default", batch=rollout.batch_id)


def batch_search_attributes(input: BatchInput, batch_id: str) -> list[SearchAttributePair[Any]]:
    """GymflowEnv / GymflowModel / GymflowBatch (its own workflow id) of a starting batch."""
    return names.start_attributes(input.env, model=input.options.model.model or "default", batch=batch_id)


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
    report: str | None = None
    """URI of the batch's report, `report.html` (self-contained; `report.json` beside it), written
    when the batch ended; None when nothing ran or the report failed (`report_error`)."""
    report_error: str | None = None
    """Why the batch has no report, if it failed to render; the batch's results are complete anyway."""
    env_packages: list[EnvPackageRef] = Field(default_factory=list)
    """The env packages (name, version, content digest) whose code produced the batch's rewards;
    empty for envs of this installation."""
    resumed_from: str | None = None
    """The batch this one resumed (`BatchInput.resumed_from`), whose finished rollouts it carried over."""
    carried: int = 0
    """Rollouts carried over from `resumed_from` (in `total` and the parts, never run again)."""
    rescored_from: str | None = None
    """The batch whose stored trajectories this one scored again (gymflow.workflows.rescore), if any."""
    reward: str | None = None
    """With `rescored_from`: the reward spec the trajectories were scored with."""


# -- dataset generation (gymflow.workflows.dataset) ---------------------------------------------------


class DatasetState(Wire):
    """Progress of a dataset generation, carried across continue-as-new."""

    stage: Literal["scanning", "generating", "finalizing", "done"] = "scanning"
    scan: ScanResult | None = None
    next_batch: int = 0
    """Index of the next batch to generate."""
    merged: int = 0
    """Batches merged (in order): the accepted items are in their files."""
    accepted: int = 0
    accepted_by_type: dict[str, int] = Field(default_factory=dict)
    processed: int = 0
    """Candidates of the merged batches."""
    rejections: dict[str, int] = Field(default_factory=dict)
    """``stage/reason`` -> count, scan rejections included."""
    calls_made: int = 0
    calls_reused: int = 0
    """Model calls answered from the run's call record (retried batches)."""
    runs: int = 0


class DatasetInput(Wire):
    """Input of DatasetGenerationWorkflow."""

    source: DatasetSource
    n: int = Field(ge=1, le=10_000_000)
    """Accepted items wanted (the run stops there, or when the source is exhausted)."""
    out: str | None = Field(default=None, max_length=4096)
    """Dataset URI (directory, file:///dir or s3://bucket/prefix); None: <worker store>/datasets/<workflow id>."""
    env: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """The env the rows are for; default: ``search`` (corpus), ``traces``, or the env itself."""
    seed: int = 0
    options: GenerationOptions = Field(default_factory=GenerationOptions)
    batch_size: int = Field(default=64, ge=1, le=2048)
    """Candidates per batch activity."""
    window: int = Field(default=4, ge=1, le=256)
    """Batch activities in flight at most."""
    max_batches_per_run: int = Field(default=200, ge=1, le=100_000)
    """Continue as new after this many batches in one run (bounds history)."""
    state: DatasetState = Field(default_factory=DatasetState)
    """Internal: progress carried across continue-as-new. Leave empty."""

    def env_name(self) -> str:
        return self.env or DEFAULT_ENV.get(self.source.kind) or self.source.location


class DatasetResult(Wire):
    """Where the dataset is and what it holds."""

    uri: str
    """The dataset URI (manifest.json, {split}.jsonl, {split}.parquet)."""
    manifest_uri: str
    env: str
    accepted: int
    target_met: bool
    target: int = 0
    """Accepted items wanted (the input's `n`; 0 from runs before this field)."""
    splits: dict[str, int]
    rejected: int
    rejections: dict[str, int]
    calls_made: int = 0
    """Model calls made (generation, judge, labels)."""
    calls_reused: int = 0
    """Calls a retried batch found already answered in the run's record instead of asking again."""
    runs: int
