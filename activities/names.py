"""Names other tools rely on: task queues, workflow types, search attributes.

These are a wire contract with the Temporal CLI, the Web UI and saved queries, so they are
defined once here and never repeated as literals.
"""

from __future__ import annotations

import enum
from typing import Any

from temporalio.common import SearchAttributeKey, SearchAttributePair

TASK_QUEUE = "gymflow"
"""Default shared task queue: workflows, model calls and rollout initialisation."""

JUDGE_QUEUE_SUFFIX = "-judge"
"""LLM-judge activities run on f"{shared queue}{JUDGE_QUEUE_SUFFIX}": a queue of their own, so one
server-side rate limit covers every judge worker of the deployment."""
JUDGE_TASK_QUEUE = TASK_QUEUE + JUDGE_QUEUE_SUFFIX

DATASET_QUEUE_SUFFIX = "-dataset"
"""Dataset generation (the workflow and its activities) runs on f"{shared queue}{DATASET_QUEUE_SUFFIX}"."""
TRAINING_QUEUE_SUFFIX = "-training"
"""Training runs (the workflow and its activities) run on f"{shared queue}{TRAINING_QUEUE_SUFFIX}"; their
eval batches and the trainer's rollout groups run on the shared queue itself."""

NODE_QUEUE_SEPARATOR = "@"
"""A node's own queue is f"{shared queue}{NODE_QUEUE_SEPARATOR}{node id}"."""

ROLLOUT_WORKFLOW = "RolloutWorkflow"
GROUP_WORKFLOW = "GroupRolloutWorkflow"
BATCH_WORKFLOW = "BatchRolloutWorkflow"
DATASET_WORKFLOW = "DatasetGenerationWorkflow"
TRAINING_WORKFLOW = "TrainingRunWorkflow"
SESSION_WORKFLOW = "RolloutSessionWorkflow"
RESCORE_WORKFLOW = "RescoreBatchWorkflow"
"""A finished batch's stored trajectories scored again with another reward, as a new batch."""

SA_ENV = SearchAttributeKey.for_keyword("GymflowEnv")
SA_STATUS = SearchAttributeKey.for_keyword("GymflowStatus")
SA_REWARD = SearchAttributeKey.for_float("GymflowReward")
SA_BATCH = SearchAttributeKey.for_keyword("GymflowBatch")
SA_MODEL = SearchAttributeKey.for_keyword("GymflowModel")
SA_TASK = SearchAttributeKey.for_keyword("GymflowTask")
"""The task id of a rollout (or session)."""
SA_RUN = SearchAttributeKey.for_keyword("GymflowRun")
"""The training run (or dataset generation run) a workflow belongs to."""

POLICY_SIGNAL = "policy"
"""Signal of a rollout (and of a group, which passes it to its rollouts): the trainer's new policy
version (`gymflow.activities.schema.PolicyUpdate`)."""

MEMO_PLAN = "plan"
"""Memo key: the RolloutWorkflow plan its starter expects (`gymflow.activities.schema.ROLLOUT_PLAN`). A rollout
whose starter declares it runs that plan without a patch marker (and the TemporalChangeVersion
upsert that comes with one); without it, the workflow asks `workflow.patched` as it always did."""

SEARCH_ATTRIBUTES = (SA_ENV, SA_STATUS, SA_REWARD, SA_BATCH, SA_MODEL, SA_TASK, SA_RUN)
"""Every search attribute gymflow sets; `gymflow server` registers them."""


def node_queue(task_queue: str, node_id: str) -> str:
    """The task queue only the worker on `node_id` polls."""
    return f"{task_queue}{NODE_QUEUE_SEPARATOR}{node_id}"


def command_queue(task_queue: str, command: str, key: str) -> str:
    """The queue of one CLI command's in-process worker (`gymflow-eval-1a2b3c4d`): the command starts
    its workflows there (or on that queue's dataset or training queue) and only its worker polls it,
    so commands run side by side never run (or log) each other's work. `gymflow worker` fleets keep
    polling `task_queue` itself."""
    return f"{task_queue}-{command}-{key}"


def judge_queue(task_queue: str) -> str:
    """The LLM-judge queue belonging to shared queue `task_queue`."""
    return f"{task_queue}{JUDGE_QUEUE_SUFFIX}"


def dataset_queue(task_queue: str) -> str:
    """The queue of dataset generation belonging to shared queue `task_queue` (workers of the `dataset` role)."""
    return f"{task_queue}{DATASET_QUEUE_SUFFIX}"


def training_queue(task_queue: str) -> str:
    """The queue of training runs belonging to shared queue `task_queue` (workers of the `training` role)."""
    return f"{task_queue}{TRAINING_QUEUE_SUFFIX}"


def rollout_queue(training_task_queue: str) -> str:
    """The shared queue a training queue belongs to: where a run's eval batches and its trainer's
    rollouts go. A run started on a shared queue itself (before training had a queue of its own)
    keeps it."""
    return training_task_queue.removesuffix(TRAINING_QUEUE_SUFFIX)


class Status(enum.StrEnum):
    """Values of the GymflowStatus search attribute; only ever written when a workflow closes."""

    COMPLETED = "completed"
    INFRA_FAILED = "infra_failed"
    CANCELLED = "cancelled"
    FAILED = "failed"


def start_attributes(
    env: str,
    *,
    model: str | None = None,
    batch: str | None = None,
    task: str | None = None,
    run: str | None = None,
) -> list[SearchAttributePair[Any]]:
    """The search attributes a gymflow workflow starts with: never GymflowStatus, which only the closing
    path of the workflow's own code writes (gymflow.workflows.status says why)."""
    pairs: list[SearchAttributePair[Any]] = [SearchAttributePair(SA_ENV, env)]
    for key, value in ((SA_MODEL, model), (SA_BATCH, batch), (SA_TASK, task), (SA_RUN, run)):
        if value:
            pairs.append(SearchAttributePair(key, value))
    return pairs
