"""The environment contract: what an RL environment offers, and the wire types it speaks.

Everything a rollout exchanges between the trainer, Temporal and an environment is one of the
pydantic models of gymflow.envs.wire.models, re-exported here so env code imports the contract from
one module. The same objects travel through workflow history, the Python SDK, `temporal workflow
start --input` JSON and the JSONL a batch writes. This module never imports temporalio: an
environment is plain async Python, testable without a server.

`BaseEnv` keeps every method benchmax's BaseEnv has (system_prompt, list_tools, run_tool,
compute_reward, compute_group_reward, init_rollout/release_rollout, the workspace copies,
dataset_preprocess/load_dataset), with two changes that matter for training:

* Failures are typed. A tool that raises, or a `ToolError`, is the model's problem and becomes
  an error observation. An `InfraError` (a server died, a rollout's state is gone) is the
  system's problem: the rollout ends flagged `infra_failed` instead of scoring 0.
* Rewards are named components validated as finite numbers; NaN or inf is an error.
* An env says whether it can work on a node (`BaseEnv.unavailable`: a missing sandbox, binary,
  image or credential). The CLI refuses to start one that cannot; a worker ends its rollouts
  ``env_unavailable`` (infra-failed), so a node that cannot run an env never scores it 0.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gymflow.envs.policy import make_policy
from gymflow.envs.wire.models import (
    EnvPackageRef,
    Message,
    ProgramRun,
    Reward,
    Role,
    Task,
    TaskTimeouts,
    ToolAttachment,
    ToolCall,
    ToolResult,
    ToolSpec,
    Trajectory,
    Usage,
    Wire,
    json_bytes,
)
from gymflow.envs.wire.rubric import Criterion, Rubric
from gymflow.envs.wire.termination import TerminationReason

__all__ = [  # the contract, and the wire types (gymflow.envs.wire.models) env code speaks, in one place
    "BaseEnv",
    "Criterion",
    "EnvPackageRef",
    "Message",
    "ProgramRun",
    "Reward",
    "Role",
    "Rubric",
    "Task",
    "TaskTimeouts",
    "TerminationReason",
    "ToolAttachment",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Trajectory",
    "Unavailable",
    "Usage",
    "Wire",
    "json_bytes",
]


@dataclass(frozen=True)
class Unavailable:
    """Why an env cannot work on this node, and what the operator does about it."""

    reason: str
    """What is missing, e.g. ``bubblewrap is not installed``."""
    fix: str
    """The remedy, e.g. ``apt-get install bubblewrap``."""

    def __str__(self) -> str:
        return f"{self.reason}. Fix: {self.fix}"


class BaseEnv(ABC):
    """An RL environment: tools, a reward, and per-rollout state.

    One instance serves many concurrent rollouts on a worker; per-rollout state is keyed by
    `rollout_id`. Subclasses implement `list_tools`, `run_tool` and `compute_reward`; the rest
    have working defaults.
    """

    name: ClassVar[str] = ""
    """Registry name (`gymflow rollout NAME`)."""
    system_prompt: ClassVar[str] = ""
    replayable: ClassVar[bool] = False
    """True when re-running a rollout's recorded tool calls on a fresh instance rebuilds its
    state exactly; lets a rollout survive the loss of its node."""
    stateless: ClassVar[bool] = False
    """True when tools keep no per-rollout state, so a lost rollout can simply be re-initialised."""
    fused_turns: ClassVar[bool] = False
    """True: a turn's tool calls (and a final answer's reward) run in the model turn's activity on
    the rollout's node, one activity per turn instead of one per model turn and per tool call
    (gymflow.activities.turn). A retry then re-runs the whole turn, so only stateless envs may set it."""
    policies: ClassVar[Mapping[str, Any]] = {}
    """Scripted policies that play this env without a model, name -> `module:Class` (or the class):
    `--policy NAME` and `gymflow policy serve ENV --policy NAME` run them. The first is the default;
    `null` is always there (gymflow.envs.policy)."""
    env_turns: ClassVar[bool] = False
    """True: the env answers the model's final answers (a user simulator, a game): when the model
    replies without a tool call, `env_response` gives the next user message(s) and the rollout goes
    on, until it answers None. Fused turns are off for such envs."""
    roles: ClassVar[tuple[str, ...]] = ()
    """Named policies that play this env together (a solver and its critic, two players), the first
    opening; each plays with its own model (`RolloutInput.roles`, else the rollout's model) and sees
    the others' answers as user messages (gymflow.envs.wire.roles). A role keeps the turn while it calls
    tools; after its final answer `next_role` names who speaks next. Empty: one unnamed policy."""
    package: ClassVar[EnvPackageRef | None] = None
    """The env package this env's code comes from (gymflow.envs.packages), recorded on every
    trajectory; None for envs of this installation."""
    cpu_bound: ClassVar[bool] = False
    """True when tool calls and rewards are CPU-heavy work on the worker's machine (sandboxed code,
    formula recalculation): a worker then admits only as many at once as its cores can run and
    queues the rest (gymflow.envs.runtime.admission); a tool's timeout starts when it is admitted."""
    offline_reward: ClassVar[bool] = False
    """True when `compute_reward` reads only the conversation, the ground truth and its keyword
    arguments (no tools, no workspace, no per-rollout state): a finished batch's stored trajectories
    can then be scored again with it, without running anything (`gymflow eval rescore --reward ENV`,
    gymflow.envs.rescore). An env of `McpEnv`'s own reward qualifies when its reward functions do."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.fused_turns and not cls.stateless:
            raise TypeError(f"{cls.__name__}: fused_turns re-runs tool calls on retries: stateless envs only")
        if len(set(cls.roles)) != len(cls.roles) or not all(isinstance(r, str) and r for r in cls.roles):
            raise TypeError(f"{cls.__name__}: roles must be distinct non-empty names, got {cls.roles!r}")

    def __init__(self, **kwargs: Any) -> None:
        del kwargs

    # -- tools -------------------------------------------------------------------------------
    @abstractmethod
    async def list_tools(self) -> list[ToolSpec]:
        """The tools the model may call."""

    @abstractmethod
    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult | str:
        """Run one tool call in the rollout's context.

        Raise `ToolError` (or let the tool raise) for failures the model should see; raise
        `InfraError` for failures of the environment's machinery.
        """

    # -- rewards -----------------------------------------------------------------------------
    @abstractmethod
    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward | Mapping[str, float]:
        """Score one finished rollout. Called before `release_rollout`, so state is readable."""

    async def compute_group_reward(
        self,
        rollout_ids: Sequence[str],
        completions: Sequence[list[Message]],
        ground_truths: Sequence[Any],
        **kwargs: Any,
    ) -> list[dict[str, float]]:
        """Score rollouts jointly (ranking, diversity); one dict per rollout, {} for none."""
        del completions, ground_truths, kwargs
        return [{} for _ in rollout_ids]

    async def env_response(self, rollout_id: str, messages: list[Message]) -> list[Message] | None:
        """The env's answer to a final answer (`env_turns` envs): the next user message(s), or
        None when the episode is over. `messages` is the conversation so far (system prompt first)."""
        del rollout_id, messages
        return None

    async def next_role(self, rollout_id: str, messages: list[Message]) -> str | None:
        """Who speaks after a role's final answer (`roles` envs): one of `roles`, or None when the
        episode is over. `messages` is the conversation so far, each assistant message naming its
        `speaker`. Default: each role once, in the declared order (a solver answers, its critic
        reviews, done). An env that also has `env_turns` answers with `env_response` after this."""
        del rollout_id
        last = next((m.speaker for m in reversed(messages) if m.role == "assistant" and m.speaker), None)
        at = self.roles.index(last) + 1 if last in self.roles else 0
        return self.roles[at] if at < len(self.roles) else None

    # -- prompt ------------------------------------------------------------------------------
    async def get_system_prompt(self, task: Task | None = None) -> str:
        """The system prompt for a rollout of `task`."""
        del task
        return self.system_prompt

    def placeholders(self, rollout_id: str) -> dict[str, str]:
        """Values of `{name}` placeholders in the system prompt and the task's prompt for this
        rollout (after `init_rollout`); `{rollout_id}` is always filled in. McpEnv adds `{workspace}`."""
        del rollout_id
        return {}

    # -- lifecycle ---------------------------------------------------------------------------
    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        """Acquire per-rollout resources (server processes, a workspace)."""
        del rollout_id, rollout_args

    async def release_rollout(self, rollout_id: str) -> None:
        """Free per-rollout resources. Must be idempotent."""
        del rollout_id

    async def shutdown(self) -> None:
        """Free everything at worker exit."""
        return None

    # -- workspace ---------------------------------------------------------------------------
    async def copy_to_workspace(self, rollout_id: str, src_path: Path, dst_filename: str | None = None) -> None:
        """Copy a local file into the rollout's workspace."""
        raise NotImplementedError(f"{type(self).__name__} has no workspace")

    async def copy_content_to_workspace(self, rollout_id: str, src_content: str | bytes, dst_filename: str) -> None:
        """Create a file with the given content in the rollout's workspace."""
        raise NotImplementedError(f"{type(self).__name__} has no workspace")

    async def copy_from_workspace(self, rollout_id: str, src_filename: str, dst_path: Path) -> None:
        """Copy a file out of the rollout's workspace."""
        raise NotImplementedError(f"{type(self).__name__} has no workspace")

    # -- data --------------------------------------------------------------------------------
    @classmethod
    def dataset_preprocess(cls, example: Mapping[str, Any], **kwargs: Any) -> Task:
        """Turn one raw dataset row into a Task (default: the row already is one)."""
        del kwargs
        return Task.model_validate(example)

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> Iterable[Task]:
        """Load a dataset by name or path into Tasks."""
        raise NotImplementedError(f"{cls.__name__} has no dataset loader for {name!r}")

    def rubric(self, task: Task) -> Rubric | None:
        """Criteria an LLM judge scores for `task` (gymflow.envs.rewards.rubric.Rubric), or None.

        When a rubric is given (here or in the rollout's judge settings), the rollout runs the
        `judge` activity after `compute_reward` and combines both rewards.
        """
        del task
        return None

    def isolation_record(self) -> str | None:
        """What every trajectory of this env must carry about weakened isolation, or None.

        An env that runs model-written code returns a line here when the operator opted out of
        its guaranteeing sandbox (e.g. ``GYMFLOW_SANDBOX=unsafe-unshare``); it lands in
        `Trajectory.sandbox` and in the eval report.
        """
        return None

    @classmethod
    def unavailable(cls, **env_kwargs: Any) -> Unavailable | None:
        """Why this env cannot work on this node, with the fix; None when it can.

        Override it when the env needs something a node may lack (a code sandbox, a binary, a
        container image, a credential) and check it cheaply (it runs before every rollout's init;
        cache what is costly). `gymflow eval`/`rollout`/`demo` refuse to start an env that answers
        here, and a worker ends the rollout infra-failed (``env_unavailable``) instead of scoring it.

        Args:
            **env_kwargs: The keyword arguments the worker builds the env with (its per-env
                settings), for envs whose needs depend on them.
        """
        del env_kwargs
        return None

    @classmethod
    def preflight(cls) -> str | None:
        """One line the CLI prints at start when this env runs, but weaker than promised, here.

        E.g. the operator opted out of the code sandbox's isolation. None when all is well (an env
        that cannot work at all says so in `unavailable`).
        """
        return None

    @classmethod
    def node_facts(cls) -> list[str]:
        """Lines `gymflow envs show` prints under "this node": what the node gives this env (its
        container engine, the disk cap it can hold, ...). Empty by default."""
        return []

    @classmethod
    def baseline_policy(cls, name: str = "default") -> Any:
        """The scripted policy `name` of `policies` (see gymflow.envs.policy): `default` is the first, `null`
        exists everywhere. Raises `gymflow.envs.errors.NoBaselinePolicy` / `UnknownPolicy` (UserErrors)."""
        return make_policy(cls, name)
