"""Input, updates and results of `RolloutSessionWorkflow` (the trainer-driven session).

Kept apart from the workflow module, like gymflow.activities.schema, so the models are built once per
worker (passed through the sandbox), not once per run. Pure.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from temporalio.common import SearchAttributePair

from gymflow.activities import names
from gymflow.activities.schema import MAX_NAME_CHARS, MAX_TIMEOUT_S, RetrySettings, RolloutLimits
from gymflow.envs.contract import Message, Reward, Task, TerminationReason, ToolSpec, Trajectory, Wire
from gymflow.envs.wire import chat


class SessionInput(Wire):
    """Input of RolloutSessionWorkflow: one episode of one task, played by the caller."""

    env: str = Field(max_length=MAX_NAME_CHARS)
    """Registered env name or env-file path; becomes the GymflowEnv search attribute."""
    task: Task
    limits: RolloutLimits = Field(default_factory=RolloutLimits)
    """`max_turns` counts steps; tool budgets and timeouts as in a rollout."""
    retry: RetrySettings = Field(default_factory=RetrySettings)
    idle_timeout_s: float = Field(default=600.0, gt=0, le=MAX_TIMEOUT_S)
    """Seconds without an update (while no step runs) after which the session frees its env and
    ends with `idle_timeout` (a trainer that died must not hold servers forever)."""
    model: str = Field(default="", max_length=MAX_NAME_CHARS)
    """The policy being trained, for the GymflowModel search attribute (the trainer generates)."""
    run_id: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """The training run the session belongs to; becomes the GymflowRun search attribute."""
    rollout_id: str | None = None
    """Default: the workflow id."""


def session_search_attributes(input: SessionInput) -> list[SearchAttributePair[Any]]:
    """GymflowEnv / GymflowTask / GymflowModel (/ GymflowRun) of a new session; GymflowStatus is
    written only when it closes (gymflow.workflows.status)."""
    return names.start_attributes(input.env, model=input.model or "trainer", task=input.task.id, run=input.run_id)


class ResetResult(Wire):
    """What the episode starts from."""

    session_id: str
    tools: list[ToolSpec]
    system_prompt: str
    messages: list[Message]
    """The first observation: the system prompt (if any) and the task's opening messages."""
    node_id: str
    """The worker node holding the env's state (it moves if that node is lost)."""


class StepInput(Wire):
    """One assistant turn the trainer generated: a message, or its raw text."""

    message: Message | None = None
    """An assistant message with typed tool calls."""
    text: str | None = None
    """The model's raw text; ``<tool_call>`` blocks (hermes format) are parsed into tool calls."""

    @model_validator(mode="after")
    def _one_of(self) -> StepInput:
        if (self.message is None) == (self.text is None):
            raise ValueError("give exactly one of `message` or `text`")
        if self.message is not None and self.message.role != "assistant":
            raise ValueError(f"message.role must be 'assistant', not {self.message.role!r}")
        return self

    def assistant_message(self, turn: int) -> Message:
        """The turn as an assistant Message (hermes calls get ids unique to the turn)."""
        if self.message is not None:
            return self.message
        return chat.parse_assistant_message({"content": self.text}, "hermes", id_prefix=f"call_{turn}")


class StepResult(Wire):
    """What the env answered to one step."""

    observations: list[Message]
    """One tool message per tool call of the step, in order (errors included); for an env that
    answers final answers (`BaseEnv.env_turns`), its user messages."""
    done: bool
    """The episode is over: a final answer, a budget, or an infra failure."""
    reward: Reward | None = None
    """The reward, when done and scored."""
    termination: TerminationReason | None = None
    """Why the episode ended, when done."""
    infra_failed: bool = False
    """Done because the system failed (drop the episode; never a reward of 0)."""
    error: str | None = None
    turn: int
    """Steps taken so far, this one included."""


SessionResult = Trajectory
"""Result of RolloutSessionWorkflow (and of its `close` update): the episode's trajectory."""
