"""The wire types: what a rollout exchanges between the trainer, Temporal and an environment.

Every one is a pydantic model (`Wire`: unknown fields rejected), so the same objects travel through
workflow history, the Python SDK, `temporal workflow start --input` JSON and the JSONL a batch
writes. Environments import them from gymflow.envs.contract, which re-exports them beside `BaseEnv`.
No temporalio here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import to_json

from gymflow.envs.errors import TokenDataError
from gymflow.envs.wire.termination import TerminationReason
from gymflow.envs.wire.tokens import (
    TokenSequence,
    TurnTokens,
    build_role_sequences,
    build_segments,
    build_sequence,
)

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
    speaker: str | None = Field(default=None, exclude_if=lambda speaker: speaker is None)
    """For role=assistant in a rollout of several roles (`BaseEnv.roles`): the role whose model wrote it.
    None otherwise, and then absent from the JSON. Never sent to a model: each role's model reads the
    others' answers as user messages (gymflow.envs.wire.roles)."""


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


class Usage(Wire):
    """Token counts summed over a rollout's model turns."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_prompt_tokens: int = 0
    """Prompt tokens of the latest turn: how full the context window is."""


class EnvPackageRef(Wire):
    """Which env code produced a rollout: an env package installed in a venv of its own
    (gymflow.envs.packages), by name, version and content digest."""

    name: str
    """The distribution's name (`pip show NAME`)."""
    version: str
    digest: str
    """sha256 over the distribution's installed files (its RECORD): the same code gives the same
    digest on every node; any change to it gives another."""
    env: str = ""
    """The env of the package that ran (a package may declare several)."""
    kind: str = ""
    """How gymflow runs it: `plain`, `benchmax`, `verifiers` or `openenv`."""


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
    env_package: EnvPackageRef | None = Field(default=None, exclude_if=lambda ref: ref is None)
    """The env package (name, version, digest) whose code ran the tools and the reward; None for
    envs that are part of this installation (built-ins, env files, registered classes)."""
    messages: list[Message]
    """System prompt, prompt, every assistant turn and tool observation, in order."""
    tokens: list[TurnTokens] = Field(default_factory=list)
    """Per assistant turn, the token ids and logprobs the endpoint returned (`ModelConfig.tokens`);
    empty when token data was off. `token_sequence()` joins them (gymflow.envs.wire.tokens)."""
    program: ProgramRun | None = Field(default=None, exclude_if=lambda program: program is None)
    """For a harness rollout, its agent program's run (`turns` then counts its model calls)."""
    versions: list[int | None] = Field(default_factory=list, exclude_if=lambda versions: not versions)
    """Per model turn, in order, the policy version that played it (`ModelConfig.version`; None for a
    turn of an unversioned model); empty when no turn was versioned."""
    speakers: list[str] = Field(default_factory=list, exclude_if=lambda speakers: not speakers)
    """Per model turn, in order, the role that played it (`BaseEnv.roles`); empty for a rollout of one
    unnamed policy. `role_sequences()` gives each role its own token sequence."""

    def version_span(self) -> tuple[int, int] | None:
        """(first, last): the oldest and the newest policy version among the turns; None if none was versioned."""
        known = [v for v in self.versions if v is not None]
        return (min(known), max(known)) if known else None

    def token_segments(self) -> list[TokenSequence]:
        """The conversation as linear token segments, each with its own loss mask: one segment when every
        turn's prompt extends the previous prompt + completion, more where the program rewrote its history
        (gymflow.envs.wire.tokens.build_segments). Never re-tokenises.

        Raises:
            gymflow.envs.errors.TokenDataError: A turn has no token data.
        """
        return build_segments(self.tokens, expected_turns=self.turns)

    def token_sequence(self) -> TokenSequence:
        """The whole conversation as the model saw it: token ids, loss mask (1 on model tokens), logprobs.

        Raises:
            gymflow.envs.errors.TokenDataError: A turn has no token data, several roles played the turns
                (`role_sequences`), or (`TokenMismatch`) its prompt does not extend the previous prompt +
                completion (`token_segments` splits there instead).
        """
        return build_sequence(self.tokens, expected_turns=self.turns)

    def role_sequences(self, *roles: str) -> dict[str, TokenSequence]:
        """Per role (`roles`, default every role that played): the conversation as that role's model saw
        it, token ids, loss mask (1 only on that role's tokens) and logprobs. A trainer of one role asks
        for that role alone, whose turns alone need token data (gymflow.envs.wire.tokens.build_role_sequences).

        Raises:
            gymflow.envs.errors.TokenDataError: The rollout had no roles (`token_sequence` is its
                sequence), a wanted role's turn has no token data, or (`TokenMismatch`) a role's prompt
                does not extend its previous prompt + completion.
        """
        if not self.speakers:
            raise TokenDataError(f"rollout {self.rollout_id} was played by one policy: use token_sequence()")
        return build_role_sequences(self.tokens, speakers=self.speakers, roles=roles or None)

    @model_validator(mode="after")
    def _infra_matches_reason(self) -> Trajectory:
        if self.infra_failed != self.termination.infra_failed:
            raise ValueError(f"infra_failed={self.infra_failed} contradicts termination {self.termination}")
        return self
