"""The environment contract: what an RL environment offers, and the wire types it speaks.

Everything a rollout exchanges between the trainer, Temporal and an environment is one of the
pydantic models below, so the same objects travel through workflow history, the Python SDK,
`temporal workflow start --input` JSON and the JSONL a batch writes. This module never imports
temporalio: an environment is plain async Python, testable without a server.

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

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import to_json

from gymflow.envs.errors import UserError
from gymflow.envs.wire.tokens import TokenSequence, TurnTokens, build_segments, build_sequence

if TYPE_CHECKING:  # gymflow.envs.rewards.rubric imports this module
    from gymflow.envs.rewards.rubric import Rubric

Role = Literal["system", "user", "assistant", "tool"]


class Wire(BaseModel):
    """Base of every wire type: unknown fields are rejected so a typo in JSON input is loud."""

    model_config = ConfigDict(extra="forbid")

    compact_json: ClassVar[bool] = False
    """Set on the payloads every turn of a rollout carries (activity inputs and results, the rollout's
    input): the data converter writes them without the fields at their defaults, and decoding fills
    those in again (gymflow.workers.sdk.client). Results people read as JSON (the trajectory) stay whole."""


def json_bytes(value: Any) -> int:
    """The size of `value` as the pydantic data converter writes it (bytes of JSON)."""
    return len(to_json(value))


class ToolSpec(Wire):
    """A tool the model may call, in MCP terms (name, description, JSON-schema input)."""

    name: str = Field(min_length=1)
    """Tool name as the model must write it."""
    description: str = ""
    """What the tool does, shown to the model."""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON schema of the arguments object."""
    server: str | None = None
    """The MCP server providing the tool, for summaries and logs (never shown to the model)."""

    def to_openai(self) -> dict[str, Any]:
        """The tool in OpenAI `tools=[...]` function format."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }


class ToolCall(Wire):
    """One tool call emitted by the model.

    A call the model wrote badly (unparseable JSON, arguments that are not an object) is kept,
    with `parse_error` set, so the model can be told what was wrong with it.
    """

    id: str
    """Call id, echoed back in the tool message."""
    name: str
    """Tool name as written by the model (may be unknown)."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """Parsed arguments; empty when `parse_error` is set."""
    raw_arguments: str | None = None
    """The arguments text exactly as the model wrote it, when it was text."""
    parse_error: str | None = None
    """Why the call could not be parsed; None for a well-formed call."""


class ToolAttachment(Wire):
    """Binary content a tool returned (an image, audio, a blob resource), never dropped silently.

    Small content is kept inline as base64 `data`; content over the env's inline cap is written
    to a file in the rollout's workspace instead and referenced by `workspace_path`, readable by
    the reward and `copy_from_workspace` while the rollout lives.
    """

    kind: Literal["image", "audio", "resource"]
    mime_type: str = "application/octet-stream"
    size_bytes: int = Field(ge=0)
    """Decoded size of the content."""
    data: str | None = None
    """Base64 content, when kept inline."""
    workspace_path: str | None = None
    """Path relative to the rollout's workspace, when the content was saved there instead."""
    uri: str | None = None
    """The resource's URI, for embedded resources."""


class Message(Wire):
    """A chat message, OpenAI-shaped, with typed tool calls."""

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    """Tool calls of an assistant message."""
    tool_call_id: str | None = None
    """For role=tool: the call this message answers."""
    name: str | None = None
    """For role=tool: the tool that produced it."""
    is_error: bool = False
    """For role=tool: the observation is an error the model should react to."""
    images: list[ToolAttachment] = Field(default_factory=list, exclude_if=lambda images: not images)
    """For role=tool: the images the tool returned inline (`content` names each one). A model whose
    `ModelConfig.images` is on sees them as image parts; any other reads only the text."""


class TaskTimeouts(Wire):
    """Time a task itself asks for (Harbor's task.toml), beyond the rollout's own limits.

    The rollout workflow fits its activities' timeouts to these: the init's start-to-close covers
    `setup_s` (an image build can take minutes), each tool call may run until the agent's time is
    up, the agent loop ends at `agent_s` (`TerminationReason.TIME_BUDGET`, still scored), and the
    reward's start-to-close covers `reward_s`. Env activities heartbeat meanwhile, so a lost node
    is still noticed within seconds.
    """

    setup_s: float | None = Field(default=None, gt=0)
    """Longest `init_rollout` may take (building and starting the task's environment)."""
    agent_s: float | None = Field(default=None, gt=0)
    """The agent's whole time, from the end of init to its last tool call."""
    reward_s: float | None = Field(default=None, gt=0)
    """Longest `compute_reward` may take (a verifier's run)."""


class Task(Wire):
    """One dataset row: a prompt, what a correct answer is, and how to set up the rollout."""

    id: str = Field(min_length=1)
    """Stable task id; rollouts of the same task share it."""
    prompt: str | list[Message]
    """The user prompt, or a full list of opening messages."""
    ground_truth: Any = None
    """Whatever the env's reward needs (an answer, cells, a rubric); JSON-serialisable."""
    init_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for `BaseEnv.init_rollout` (files to stage, seeds, ...)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form labels (difficulty, split, source); never shown to the model."""
    timeouts: TaskTimeouts | None = Field(default=None, exclude_if=lambda timeouts: timeouts is None)
    """Time the task asks for (setup, agent, reward); None: the rollout's defaults."""

    def opening_messages(self) -> list[Message]:
        """The conversation the model starts from (without the system prompt)."""
        if isinstance(self.prompt, str):
            return [Message(role="user", content=self.prompt)]
        return list(self.prompt)


class ToolResult(Wire):
    """What a tool call produced, as the model will see it."""

    compact_json = True

    text: str
    """Rendered text content (images and resources are summarised in it)."""
    is_error: bool = False
    """True when the call failed in a way the model should see and react to."""
    structured: Any = None
    """Structured content, when the tool returned some."""
    truncated_chars: int = 0
    """How many characters of output were cut by the output policy."""
    attachments: list[ToolAttachment] = Field(default_factory=list)
    """Images, audio and blobs the tool returned; `text` names each one where it appeared."""


class Reward(Wire):
    """A rollout's reward: a total plus named components.

    Components are what a trainer logs; `total` is what it optimises. A mapping returned by
    `compute_reward` becomes a Reward whose total is the sum of its components (benchmax's
    convention).
    """

    total: float
    components: dict[str, float] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)
    """Explanations (extracted answer, judge rationale) that are not numbers."""

    @field_validator("total")
    @classmethod
    def _finite_total(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"reward total must be finite, got {value!r}")
        return value

    @field_validator("components")
    @classmethod
    def _finite_components(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not math.isfinite(v)}
        if bad:
            raise ValueError(f"reward components must be finite, got {bad!r}")
        return value

    @classmethod
    def of(cls, value: Reward | Mapping[str, float] | float) -> Reward:
        """Normalise what a reward function returned into a validated Reward."""
        if isinstance(value, Reward):
            return value
        if isinstance(value, Mapping):
            components = {str(k): float(v) for k, v in value.items()}
            return cls(total=math.fsum(components.values()), components=components)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"a reward must be a Reward, a mapping or a number, not {type(value).__name__}")
        return cls(total=float(value), components={"reward": float(value)})


class TerminationReason(enum.StrEnum):
    """Why a rollout stopped. The first group is normal; the second is infrastructure."""

    FINAL_ANSWER = "final_answer"
    """The model answered without calling a tool."""
    MAX_TURNS = "max_turns"
    CONTEXT_BUDGET = "context_budget"
    """The next turn would not fit the model's context window, or the conversation reached the
    payload limit of the deployment's history (its last message is then cut, with a note)."""
    OUTPUT_BUDGET = "output_budget"
    """The model produced more tokens in total than the rollout allows."""
    TOOL_BUDGET = "tool_budget"
    """The model made more tool calls than the rollout allows."""
    AGENT_EXIT = "agent_exit"
    """A harness rollout's agent program exited (whatever its exit code: the reward judges the work)."""
    TIME_BUDGET = "time_budget"
    """The agent's time ran out (`TaskTimeouts.agent_s`, a task's agent timeout, or a harness program's
    `timeout_s`): still scored."""
    MODEL_ERROR = "model_error"
    """The model endpoint failed after Temporal's retries (or refused the request)."""
    ENV_ERROR = "env_error"
    """The environment failed (server died, init failed) and could not be recovered."""
    ENV_UNAVAILABLE = "env_unavailable"
    """The env cannot work on the node that took the rollout (`BaseEnv.unavailable`: no code
    sandbox, a missing binary, image or credential); the error names the fix."""
    NODE_LOST = "node_lost"
    """The worker node holding the rollout disappeared and the env cannot be rebuilt."""
    REWARD_ERROR = "reward_error"
    """The reward function failed or returned a non-finite value."""
    CANCELLED = "cancelled"
    IDLE_TIMEOUT = "idle_timeout"
    """A trainer-driven session (RolloutSessionWorkflow) got no update for its idle timeout."""

    @property
    def infra_failed(self) -> bool:
        """Whether a rollout that ended this way must be dropped rather than trained on."""
        return self in _INFRA_REASONS


_INFRA_REASONS = frozenset(
    {
        TerminationReason.MODEL_ERROR,
        TerminationReason.ENV_ERROR,
        TerminationReason.ENV_UNAVAILABLE,
        TerminationReason.NODE_LOST,
        TerminationReason.REWARD_ERROR,
        TerminationReason.CANCELLED,
        TerminationReason.IDLE_TIMEOUT,
    }
)


class Usage(Wire):
    """Token counts summed over a rollout's model turns."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_prompt_tokens: int = 0
    """Prompt tokens of the latest turn: how full the context window is."""


class ProgramRun(Wire):
    """What a harness rollout's agent program did (gymflow.envs.harness)."""

    command: list[str]
    """The command line that ran (placeholders filled in)."""
    exit_code: int | None = None
    """The program's exit status (128+N for signal N); None when it was stopped by a budget."""
    output: str = ""
    """The end of its stdout and stderr."""
    starts: int = 1
    """How often it was started: more than once after its node was lost (gymflow.workflows.harness)."""
    replayed_calls: int = 0
    """Model calls a restarted program made that were answered from the rollout's recorded turns."""
    abandoned_calls: int = 0
    """Recorded calls a restarted program did not make again (its requests diverged): not in `tokens`."""


class Trajectory(Wire):
    """The full record of one rollout.

    Field order is the order of its JSON: the outcome (reward, termination) first, the
    conversation last, so a person reading a result in the Web UI or a JSONL line sees the
    reward without scrolling past every message. Order is not part of the wire contract.
    """

    reward: Reward | None = None
    """None when the rollout failed for infrastructure reasons."""
    termination: TerminationReason
    infra_failed: bool = False
    error: str | None = None
    """What went wrong, for infra failures."""
    rollout_id: str
    task_id: str
    env: str
    model: str = ""
    turns: int = 0
    tool_calls: int = 0
    usage: Usage = Field(default_factory=Usage)
    recoveries: int = 0
    """How many times the rollout was re-initialised after losing its node or server."""
    sandbox: str | None = None
    """Set when model-written code ran under a sandbox the operator opted out of (e.g.
    ``GYMFLOW_SANDBOX=unsafe-unshare``): which level, and what it did not keep from the code."""
    messages: list[Message]
    """System prompt, prompt, every assistant turn and tool observation, in order."""
    tokens: list[TurnTokens] = Field(default_factory=list)
    """Per assistant turn, the token ids and logprobs the endpoint returned (`ModelConfig.tokens`);
    empty when token data was off. `token_sequence()` joins them (gymflow.envs.wire.tokens)."""
    program: ProgramRun | None = Field(default=None, exclude_if=lambda program: program is None)
    """For a harness rollout, its agent program's run (`turns` then counts its model calls)."""

    def token_segments(self) -> list[TokenSequence]:
        """The conversation as linear token segments, each with its own loss mask: one segment when every
        turn's prompt extends the previous prompt + completion, more where the program rewrote its history
        (gymflow.envs.wire.tokens.build_segments). Never re-tokenises.

        Raises:
            gymflow.envs.wire.tokens.TokenDataError: A turn has no token data.
        """
        return build_segments(self.tokens, expected_turns=self.turns)

    def token_sequence(self) -> TokenSequence:
        """The whole conversation as the model saw it: token ids, loss mask (1 on model tokens), logprobs.

        Raises:
            gymflow.envs.wire.tokens.TokenDataError: A turn has no token data, or (`TokenMismatch`) its prompt
                does not extend the previous prompt + completion (`token_segments` splits there instead).
        """
        return build_sequence(self.tokens, expected_turns=self.turns)

    @model_validator(mode="after")
    def _infra_matches_reason(self) -> Trajectory:
        if self.infra_failed != self.termination.infra_failed:
            raise ValueError(f"infra_failed={self.infra_failed} contradicts termination {self.termination}")
        return self


class ToolError(Exception):
    """A tool failed in a way the model should see (bad arguments, a refused path, ...)."""


class InfraError(Exception):
    """The environment itself failed: not the model's fault, never a reward of 0.

    Raise it (or a subclass) from run_tool/compute_reward/init_rollout when the failure is in
    the machinery (a server process died, a connection broke). The rollout is recovered or ends
    flagged infra_failed.
    """


class RolloutNotFound(InfraError):
    """This process holds no state for the rollout (it was released, or the worker restarted)."""


class DatasetError(UserError, ValueError):
    """A dataset row is invalid; the message names the row (file:line) and the field."""


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
    cpu_bound: ClassVar[bool] = False
    """True when tool calls and rewards are CPU-heavy work on the worker's machine (sandboxed code,
    formula recalculation): a worker then admits only as many at once as its cores can run and
    queues the rest (gymflow.workers.admission); a tool's timeout starts when it is admitted."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.fused_turns and not cls.stateless:
            raise TypeError(f"{cls.__name__}: fused_turns re-runs tool calls on retries: stateless envs only")

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
    def baseline_policy(cls, name: str = "default") -> Any:
        """The scripted policy `name` of `policies` (see gymflow.envs.policy): `default` is the first, `null`
        exists everywhere. Raises `gymflow.envs.policy.NoBaselinePolicy` / `UnknownPolicy` (UserErrors)."""
        from gymflow.envs.policy import make_policy  # gymflow.envs.policy builds on this module

        return make_policy(cls, name)
