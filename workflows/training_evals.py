"""Evaluating a training run's checkpoints (workflow code, used by TrainingRunWorkflow).

The baseline is evaluated once, then every reported checkpoint with an endpoint, in order and one
at a time, each as a child BatchRolloutWorkflow over the run's eval split (ids `<run>/eval/baseline`,
`<run>/eval/<checkpoint>`: a replayed or recovered run never starts one twice), and compared with
the baseline by the `compare_checkpoint` activity. Deterministic: no I/O, only workflow calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, TypedSearchAttributes
from temporalio.exceptions import ApplicationError, CancelledError, ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import names
    from gymflow.activities.errors import TRAINING_CONFIG
    from gymflow.activities.model import ModelConfig
    from gymflow.activities.schema import BatchInput, BatchResult
    from gymflow.activities.training import CompareInput, TrainingActivities
    from gymflow.activities.training_schema import (
        CheckpointReport,
        CheckpointState,
        EvalSummary,
        PreparedRun,
        RunConfig,
        TrainingRunState,
    )
    from gymflow.workflows.activity_calls import execute
    from gymflow.workflows.group import BatchRolloutWorkflow

COMPARE_TIMEOUT = timedelta(minutes=2)
COMPARE_RETRY = RetryPolicy(maximum_attempts=5, non_retryable_error_types=[TRAINING_CONFIG])


async def child_batch(run_id: str, env: str, batch_id: str, batch: BatchInput) -> BatchResult:
    """Run a child batch of the run; its cancellation (the run is closing) is the caller's cancellation."""
    try:
        return await workflow.execute_child_workflow(
            BatchRolloutWorkflow.run,
            batch,
            id=batch_id,
            # Rollouts run on the shared queue the run's training queue belongs to (gymflow.activities.names).
            task_queue=names.rollout_queue(workflow.info().task_queue),
            parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            search_attributes=TypedSearchAttributes(names.start_attributes(env, run=run_id, batch=batch_id)),
        )
    except ChildWorkflowError as exc:
        if isinstance(exc.cause, CancelledError):
            raise asyncio.CancelledError from exc
        raise


class Evaluator:
    """The run's evaluations; `run` is a task of the workflow until the run closes."""

    def __init__(
        self,
        *,
        run_id: str,
        config: RunConfig,
        state: TrainingRunState,
        prepared: PreparedRun,
        on_eval: Callable[[], Awaitable[Any]],
    ) -> None:
        self.run_id, self.config, self.state, self.prepared = run_id, config, state, prepared
        self.on_eval = on_eval
        """Called after each checkpoint's evaluation (the run records its lineage)."""
        self.running = False
        """An evaluation is in flight (the run must not continue as new)."""
        self.draining = False
        """Start no new evaluation (the run is about to continue as new)."""
        self.closing = False
        """The run is closing: `run` returns."""

    def done(self) -> bool:
        """Every reported checkpoint has its evaluation."""
        return all(c.eval is not None for c in self.state.checkpoints) and not self.running

    async def run(self) -> None:
        """Evaluate the baseline, then each checkpoint in order, one at a time."""
        state = self.state
        if state.baseline_parts is None:
            model = self.prepared.baseline
            named = self.config.baseline.checkpoint
            if named is not None:  # the trainer's own checkpoint (its starting weights): once it is reported
                await workflow.wait_condition(
                    lambda: self.closing or self._reported(named) is not None or self.state.finish is not None
                )
                if self.closing:
                    return
                if self._reported(named) is None:  # nothing can be compared: the run fails, saying why
                    raise ApplicationError(
                        f"baseline.checkpoint: the trainer finished without reporting checkpoint {named!r}",
                        type=TRAINING_CONFIG,
                        non_retryable=True,
                    )
                model = self._reported(named).report.endpoint or model  # type: ignore[union-attr]
            self.running = True
            baseline = await self._batch("baseline", model)
            state.baseline_batch, state.baseline_parts = baseline.batch_id, baseline.parts
            if named is not None:
                self._reported(named).eval = EvalSummary(  # type: ignore[union-attr]
                    checkpoint=named,
                    step=self._reported(named).report.step,  # type: ignore[union-attr]
                    batch_id=baseline.batch_id,
                    mean=baseline.mean_reward,
                    baseline_mean=baseline.mean_reward,
                    n_tasks=baseline.total,
                    infra_failed=baseline.infra_failed,
                    error="the baseline itself",
                )
            self.running = False
        while True:
            await workflow.wait_condition(
                lambda: self.closing or (not self.draining and any(c.eval is None for c in state.checkpoints))
            )
            if self.closing:
                return
            checkpoint = next(c for c in state.checkpoints if c.eval is None)
            self.running = True
            checkpoint.eval = await self._evaluate(checkpoint.report)
            await self.on_eval()
            self.running = False

    def _reported(self, name: str) -> CheckpointState | None:
        return next((c for c in self.state.checkpoints if c.report.name == name), None)

    async def _evaluate(self, checkpoint: CheckpointReport) -> EvalSummary:
        batch_id = f"{self.run_id}/eval/{checkpoint.name}"
        if checkpoint.endpoint is None:
            return EvalSummary(
                checkpoint=checkpoint.name, step=checkpoint.step, batch_id="", error="no endpoint reported"
            )
        try:
            result = await self._batch(checkpoint.name, checkpoint.endpoint)
        except ChildWorkflowError as exc:
            return EvalSummary(
                checkpoint=checkpoint.name, step=checkpoint.step, batch_id=batch_id, error=str(exc.cause)
            )
        return await execute(
            TrainingActivities.compare,
            CompareInput(
                run_id=self.run_id,
                checkpoint=checkpoint,
                batch_id=batch_id,
                parts=result.parts,
                baseline_parts=self.state.baseline_parts or [],
                reps=self.config.eval.reps,
                storage=self.config.storage,
            ),
            start_to_close_timeout=COMPARE_TIMEOUT,
            retry_policy=COMPARE_RETRY,
            summary=f"compare {checkpoint.name} with the baseline",
        )

    async def _batch(self, name: str, model: ModelConfig) -> BatchResult:
        config = self.config
        batch = BatchInput(
            env=config.env,
            dataset=self.prepared.eval_uri,
            num_tasks=config.eval.tasks,
            samples_per_task=config.eval.samples,
            options=config.rollout_options(model),
            window=config.eval.window,
            destination=config.storage,
        )
        return await child_batch(self.run_id, config.env, f"{self.run_id}/eval/{name}", batch)
