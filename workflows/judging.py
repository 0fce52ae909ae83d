"""The LLM-judge step of a rollout: settings, the activity call, and how rewards combine.

A rollout is judged when its input carries `JudgeConfig` or its env gives a rubric for the task.
The `judge` activity runs on the deployment's judge queue (`names.judge_queue`), whose workers
share one server-side rate limit. A judge that keeps failing (5xx, 429, unusable replies) is
retried by Temporal a bounded number of times, then the rollout ends with REWARD_ERROR flagged
infra_failed — never a reward of 0 and never a failed batch.
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ChildWorkflowError, is_cancelled_exception
from temporalio.workflow import ChildWorkflowCancellationType, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors, names
    from gymflow.activities.env_schema import RolloutHandle
    from gymflow.activities.judge import GroupJudgeConfig, GroupJudgeInput, JudgeActivities, JudgeConfig, JudgeInput
    from gymflow.activities.schema import AgenticJudgeConfig, RetrySettings, RolloutInput, RolloutResult
    from gymflow.envs.contract import Message, Reward, Task
    from gymflow.envs.rewards.agentic import judge_task
    from gymflow.envs.rewards.group_judge import GroupJudgement, judge_orders
    from gymflow.envs.rewards.group_judge import combine as combine_orders
    from gymflow.envs.wire.rubric import Rubric
    from gymflow.workflows.activity_calls import execute

JUDGE_TIMEOUT = timedelta(minutes=5)


def _on_judge_queue(attempts: int) -> dict[str, Any]:
    """Where and how a judge call runs: the deployment's judge queue, `attempts` tries at most."""
    return {
        "task_queue": names.judge_queue(workflow.info().task_queue),
        "start_to_close_timeout": JUDGE_TIMEOUT,
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=1),
            maximum_attempts=attempts,
            non_retryable_error_types=[errors.JUDGE_REJECTED, errors.CONTEXT_LENGTH],
        ),
    }


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
            **_on_judge_queue(config.attempts),
            summary=f"judge {len(rubric.criteria)} criteria",
        )
    ).reward


def combine(env_reward: Reward, judge_reward: Reward, config: JudgeConfig | AgenticJudgeConfig) -> Reward:
    """The rollout's reward: the env's plus the judge's, components kept apart (`judge/...`)."""
    judged = config.weight * judge_reward.total
    total = judged if config.combine == "replace" else math.fsum([env_reward.total, judged])
    components = {**env_reward.components, **{f"judge/{k}": v for k, v in judge_reward.components.items()}}
    return Reward(total=total, components=components, info={**env_reward.info, "judge": judge_reward.info})


async def judge_group(config: GroupJudgeConfig, task: Task, transcripts: list[list[Message]]) -> GroupJudgement:
    """Judge a group's trajectories against each other: one `judge_group` activity per order, at once."""
    orders = judge_orders(len(transcripts), config.orders, config.seed)
    shown = [[m for m in messages if m.role != "system"] for messages in transcripts]
    calls = [
        execute(
            JudgeActivities.judge_group,
            GroupJudgeInput(
                criteria=config.criteria,
                prompt=task.prompt,
                transcripts=shown,
                order=order,
                model=config.model,
                max_trajectory_chars=config.max_trajectory_chars,
            ),
            **_on_judge_queue(config.attempts),
            summary=f"group judge x{len(order)}, order {k + 1} of {len(orders)}",
        )
        for k, order in enumerate(orders)
    ]
    # Every order's call ends (or fails) before the group goes on: none is left running behind it.
    results = await asyncio.gather(*calls, return_exceptions=True)
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        raise failure
    return combine_orders([r.scores for r in results if not isinstance(r, BaseException)], orders)


def group_judged(reward: Reward, score: float, config: GroupJudgeConfig) -> Reward:
    """A sample's reward with the group judge's normalised score (`group/judge`) added or in its place."""
    judged = config.weight * score
    total = judged if config.combine == "replace" else math.fsum([reward.total, judged])
    return Reward(total=total, components={**reward.components, "group/judge": score}, info=reward.info)


class JudgeFailed(Exception):
    """The agentic judge gave no score (it failed, or ended infra-failed): the rollout's reward_error."""


async def agentic_judge(
    config: AgenticJudgeConfig, task: Task, messages: list[Message], handle: RolloutHandle, rollout_id: str
) -> Reward:
    """Run the judge with tools as a child rollout on the judged rollout's node (`handle`), whose
    workspace it snapshots; returns its reward (the score).

    Raises:
        JudgeFailed: The env has no workspace, or the judge's rollout failed or was infra-failed.
    """
    if handle.workspace is None:
        raise JudgeFailed("the env keeps no workspace for an agentic judge to inspect")
    judge = RolloutInput(
        env=config.env,
        task=judge_task(task, [m for m in messages if m.role != "system"], source=handle.workspace,
                        instructions=config.instructions),
        model=config.model,
        limits=config.limits,
        retry=RetrySettings(max_recoveries=0),  # the judged workspace is on this node only
        node_queue=handle.node_queue,
    )  # fmt: skip  # no batch: the judge's rollout is not a sample of the judged rollout's batch
    try:
        result = await workflow.execute_child_workflow(
            names.ROLLOUT_WORKFLOW,
            judge,
            id=f"{rollout_id}/judge",
            result_type=RolloutResult,
            retry_policy=RetryPolicy(maximum_attempts=1),
            parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            cancellation_type=ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
            static_summary=f"agentic judge ({config.env}) of {task.id}",
        )
    except ChildWorkflowError as exc:
        if is_cancelled_exception(exc):  # the rollout was cancelled, and its judge with it: not a judge failure
            raise asyncio.CancelledError() from exc
        raise JudgeFailed(f"the agentic judge failed: {exc.cause or exc}") from exc
    if result.infra_failed or result.reward is None:
        raise JudgeFailed(f"the agentic judge ended {result.termination.value}: {result.error or 'no score'}")
    return result.reward
