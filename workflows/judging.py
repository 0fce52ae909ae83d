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

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors, names
    from gymflow.activities.judge import JudgeActivities, JudgeConfig, JudgeInput
    from gymflow.envs.contract import Message, Reward, Task
    from gymflow.envs.wire.rubric import Rubric
    from gymflow.workflows.activity_calls import execute

JUDGE_TIMEOUT = timedelta(minutes=5)


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
