"""The LLM-judge step of a rollout: settings, the activity call, and how rewards combine.

A rollout is judged when its input carries `JudgeConfig` or its env gives a rubric for the task.
The `judge` activity runs on the deployment's judge queue (`names.judge_queue`), whose workers
share one server-side rate limit. A judge that keeps failing (5xx, 429, unusable replies) is
retried by Temporal a bounded number of times, then the rollout ends with REWARD_ERROR flagged
infra_failed — never a reward of 0 and never a failed batch.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Literal

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from pydantic import Field

    from gymflow.activities import errors
    from gymflow.activities.judge import JudgeActivities, JudgeInput
    from gymflow.activities.model import ModelConfig
    from gymflow.envs.contract import Message, Reward, Task, Wire
    from gymflow.envs.rewards.rubric import Rubric
    from gymflow.workflows import names
    from gymflow.workflows.activity_calls import execute

JUDGE_TIMEOUT = timedelta(minutes=5)


class JudgeConfig(Wire):
    """How a rollout is judged."""

    rubric: Rubric | None = None
    """The criteria; None uses the env's rubric for the task."""
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(temperature=0.0))
    """Judge endpoint and sampling; base_url None uses the worker's GYMFLOW_JUDGE_URL."""
    weight: float = Field(default=1.0, ge=0)
    """Weight of the judge's total in the rollout's reward."""
    combine: Literal["add", "replace"] = "add"
    """`add`: env total + weight x judge total; `replace`: weight x judge total alone."""
    attempts: int = Field(default=3, ge=1, le=20)
    """Judge calls at most (retryable failures: connection, 429, 5xx, unusable replies)."""


async def judge(config: JudgeConfig, rubric: Rubric, task: Task, messages: list[Message]) -> Reward:
    """Run the judge activity on the deployment's judge queue; returns the judge's reward."""
    return (
        await execute(
            JudgeActivities.judge,
            JudgeInput(
                rubric=rubric,
                prompt=task.prompt,
                transcript=[m for m in messages if m.role != "system"],
                ground_truth=task.ground_truth,
                model=config.model,
            ),
            task_queue=names.judge_queue(workflow.info().task_queue),
            start_to_close_timeout=JUDGE_TIMEOUT,
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_attempts=config.attempts,
                non_retryable_error_types=[errors.JUDGE_REJECTED, errors.CONTEXT_LENGTH],
            ),
            summary=f"judge {len(rubric.criteria)} criteria",
        )
    ).reward


def combine(env_reward: Reward, judge_reward: Reward, config: JudgeConfig) -> Reward:
    """The rollout's reward: the env's plus the judge's, components kept apart (`judge/...`)."""
    judged = config.weight * judge_reward.total
    total = judged if config.combine == "replace" else math.fsum([env_reward.total, judged])
    components = {**env_reward.components, **{f"judge/{k}": v for k, v in judge_reward.components.items()}}
    return Reward(total=total, components=components, info={**env_reward.info, "judge": judge_reward.info})
