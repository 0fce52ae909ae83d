"""What the env activities (gymflow.activities.env) take and answer: the payloads of their history events.

Apart from the activities so a workflow (and the data converter) can name them without importing
the env machinery; class names are what histories record, so they stay put.
"""

from __future__ import annotations

from pydantic import Field

from gymflow.envs.contract import EnvPackageRef, Message, Task, ToolCall, ToolSpec, Wire
from gymflow.envs.harness.env import HarnessInfo
from gymflow.envs.wire.rubric import Rubric


class InitRolloutInput(Wire):
    compact_json = True

    env: str
    rollout_id: str
    incarnation: int = 0
    """0 for the first init, n for the n-th recovery."""
    task: Task


class RolloutHandle(Wire):
    """Where a rollout lives and what it offers the model."""

    compact_json = True

    state_key: str
    node_id: str
    node_queue: str
    tools: list[ToolSpec]
    system_prompt: str
    replayable: bool = False
    stateless: bool = False
    fused_turns: bool = False
    """The env asks for fused turns (BaseEnv.fused_turns, gymflow.activities.turn)."""
    rubric: Rubric | None = None
    """The env's judge rubric for this task, if it has one."""
    payload_limit_bytes: int | None = None
    """The largest payload the deployment's history takes inline; None where large payloads go to
    external storage (or for handles recorded before this field existed: no limit is enforced)."""
    opening_messages: list[Message] | None = None
    """The task's opening messages with their placeholders (`{workspace}`, `{rollout_id}`) filled
    in; None when they have none (the workflow uses the task's own, history carries no copy)."""
    sandbox: str | None = None
    """The env's `isolation_record`: set when model code runs under a sandbox the operator opted
    out of; the workflow copies it onto the trajectory."""
    env_package: EnvPackageRef | None = None
    """The env package whose code runs the rollout (`BaseEnv.package`); copied onto the trajectory."""
    env_turns: bool = False
    """The env answers final answers (`BaseEnv.env_turns`): the workflow asks `env_response` for the
    next user message instead of ending the rollout. Handles recorded before it existed say False."""
    roles: list[str] = Field(default_factory=list)
    """The env's roles (`BaseEnv.roles`), the first opening: after each role's final answer the workflow
    asks `env_response` who speaks next. Empty: one unnamed policy (and for handles recorded before it)."""
    workspace: str | None = None
    """The rollout's workspace directory on its node (envs that have one), for an agentic judge's
    snapshot; None for envs without one and for handles recorded before it existed."""
    harness: HarnessInfo | None = None
    """Set for a harness env (gymflow.envs.harness): an agent program plays the rollout, its model calls
    coming through the gateway (gymflow.workflows.harness) instead of the workflow's agent loop."""


class CallToolInput(Wire):
    compact_json = True

    env: str
    state_key: str
    call: ToolCall
    timeout_s: float = Field(default=60.0, gt=0)
    max_output_chars: int = Field(default=16_000, ge=256)


class ComputeRewardInput(Wire):
    compact_json = True

    env: str
    state_key: str
    messages: list[Message]
    task: Task
    release: bool = False
    """Free the rollout's state once the reward is computed, saving the workflow a
    `release_rollout` round trip. Only a successful call frees it: after a failure the state stays
    for a retry, and the workflow releases it as on every other failure path."""


class GroupRewardInput(Wire):
    env: str
    rollout_ids: list[str]
    completions: list[list[Message]] | None
    """The conversations; None when too large to carry inline: the activity then reads them from
    the results of the rollout workflows, whose ids are `rollout_ids`."""
    tasks: list[Task]


class EnvResponseInput(Wire):
    compact_json = True

    env: str
    state_key: str
    messages: list[Message]
    """The conversation so far, ending with the model's final answer."""


class EnvResponse(Wire):
    """The env's answer to a final answer: user messages to go on with, or the end of the episode."""

    compact_json = True

    messages: list[Message] = Field(default_factory=list)
    done: bool = False
    next_role: str | None = None
    """In a rollout of roles (`RolloutHandle.roles`): the role that speaks next (`BaseEnv.next_role`)."""


class ReleaseInput(Wire):
    compact_json = True

    env: str
    state_key: str
