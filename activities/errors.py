"""Error types by boundary, as they travel through Temporal.

Activities raise `ApplicationError(type=<one of these>)`; workflows and RetryPolicies name the
same constants, so a retry decision is made on a type, never on message text.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.exceptions import ApplicationError

# Model endpoint
MODEL_ERROR = "ModelError"
"""Retryable: connection failures, timeouts, 408/409/429/5xx, a 200 that is not a chat completion."""
MODEL_REJECTED = "ModelRequestRejected"
"""Non-retryable: any other 4xx, or no endpoint configured."""
CONTEXT_LENGTH = "ContextLengthExceeded"
"""Non-retryable: the prompt no longer fits the model's context window."""

# LLM judge
JUDGE_ERROR = "JudgeError"
"""Retryable: the judge endpoint failed (connection, timeouts, 408/409/429/5xx, not a completion)."""
JUDGE_REJECTED = "JudgeRequestRejected"
"""Non-retryable: any other 4xx, or no judge endpoint configured."""
JUDGE_REPLY_INVALID = "JudgeReplyInvalid"
"""Retryable (a sampled judge may answer better next time; the RetryPolicy bounds the attempts):
the judge's reply has no usable scores. Name it in `non_retryable_error_types` for a greedy judge."""

# Environments
ENV_ERROR = "EnvError"
"""Retryable failure of the env machinery (server crashed while starting, ...)."""
ENV_CONFIG = "EnvConfigError"
"""Non-retryable: unknown env, invalid env arguments, invalid task."""
ENV_UNAVAILABLE = "EnvUnavailable"
"""Retryable (another node may have what this one lacks): the env cannot work on the node that took
the rollout (`BaseEnv.unavailable`); once the attempts are spent the rollout ends ``env_unavailable``."""
ROLLOUT_NOT_FOUND = "RolloutNotFound"
"""Non-retryable: this worker holds no state for the rollout (released, or the worker restarted)."""
REWARD_ERROR = "RewardError"
"""Non-retryable: the reward function raised or returned a non-finite value."""
CONTEXT_MISSING = "TurnContextMissing"
"""Non-retryable: a fused turn named a conversation this node no longer holds
(gymflow.activities.context_cache); the workflow sends the turn again whole."""

# Inputs
INVALID_INPUT = "InvalidInput"
"""Non-retryable: workflow or activity input failed validation; the message names the field."""
SESSION_ENDED = "SessionEnded"
"""An update reached a trainer-driven session whose episode is already over (gymflow.workflows.session)."""
CALL_REFUSED = "ModelCallRefused"
"""A harness rollout refused a program's model call: a budget is spent or the rollout is ending
(gymflow.workflows.harness); the gateway answers it as the program's API answers a bad request."""

# Storage
STORAGE_ERROR = "StorageError"

# Training runs
TRAINING_CONFIG = "TrainingConfigError"
"""Non-retryable: the run's config is invalid; the message names every field at fault."""
TRAINER_FAILED = "TrainerFailed"
"""Non-retryable: the trainer exited with an error; the message holds its last log lines."""


def retryable(message: str, *, type: str, retry_after: float | None = None) -> ApplicationError:
    """A failure a later attempt may not have, after the server's Retry-After when it gave one."""
    delay = timedelta(seconds=retry_after) if retry_after is not None else None
    return ApplicationError(message, type=type, next_retry_delay=delay)


def model_error(message: str, *, retry_after: float | None = None) -> ApplicationError:
    """A retryable model failure, honouring the server's Retry-After when it gave one."""
    return retryable(message, type=MODEL_ERROR, retry_after=retry_after)


def non_retryable(message: str, *, type: str) -> ApplicationError:
    """A failure that retrying cannot fix."""
    return ApplicationError(message, type=type, non_retryable=True)
