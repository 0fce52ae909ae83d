"""Why a rollout stopped: `TerminationReason`, part of the wire contract (trajectories, results).

A module of its own with no gymflow imports, so the error types (gymflow.envs.errors) can name the
termination an infrastructure error ends a rollout with.
"""

from __future__ import annotations

import enum


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
