"""TrainingRunWorkflow: validate -> bundle -> upload -> launch -> watch -> evaluate every checkpoint.

Preparing (validate, serve, smoke, bundle, upload) is gymflow.workflows.training_prepare; evaluating
the checkpoints is gymflow.workflows.training_evals; this module launches, watches and closes.

The trainer is an outside process (gymflow.activities.training launches it, locally or on SkyPilot); it
talks back through two updates: `report` (a step's scalars, maybe a checkpoint) and `finish`
(answered once every checkpoint is evaluated, so a trainer that serves its checkpoints keeps them
up until then). A heartbeating `watch_trainer` activity notices when it exits; a killed worker's
watch resumes on another worker within the heartbeat timeout, and the launch is idempotent by run
id, so nothing is started twice.

Every checkpoint with an endpoint is evaluated once, as a child BatchRolloutWorkflow over the eval
split (id `<run>/eval/<checkpoint>`), and compared with the baseline's batch (`<run>/eval/baseline`)
by the `compare_checkpoint` activity (paired by task: mean CIs, difference, probability of
improvement). Lineage (digests of config, dataset and env bundle; checkpoints; evals) goes to the
memo and to `runs/<run>/manifest.json`. Cancelling the run (Temporal cancel, or the `cancel`
signal) stops the trainer first, then cancels (never terminates) every child. Long runs continue
as new at a point with no eval in flight, carrying their state.

The run lives on a training queue (`names.training_queue`, served by workers of the `training`
role); its eval batches and its trainer's rollout groups go to the shared queue that queue belongs
to (`names.rollout_queue`), served by the `rollout` role.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import errors, names
    from gymflow.activities.errors import TRAINER_FAILED
    from gymflow.activities.trainer_jobs import LaunchInput, StopInput, TeardownInput, TrainerActivities, WatchInput
    from gymflow.activities.training import (
        ManifestInput,
        TrainingActivities,
    )
    from gymflow.activities.training_schema import (
        CheckpointState,
        EvalSummary,
        FinishReport,
        PreparedRun,
        StepReport,
        TrainingRunInput,
        TrainingRunResult,
        TrainingRunState,
    )
    from gymflow.workflows import status
    from gymflow.workflows.activity_calls import describe, error_type, execute
    from gymflow.workflows.status import Status
    from gymflow.workflows.training_evals import Evaluator
    from gymflow.workflows.training_prepare import LONG, QUICK, SHORT, prepare

WATCH_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10))
WATCH_HEARTBEAT = timedelta(seconds=10)
"""A worker killed while watching is noticed within this; the watch resumes on another worker."""
HISTORY_KEEP = 500
"""Scalars of the last this many steps stay in the state (the progress query's plot data)."""
TERMINAL = ("completed", "failed", "cancelled")


@workflow.defn(name=names.TRAINING_WORKFLOW)
class TrainingRunWorkflow:
    def __init__(self) -> None:
        self._state = TrainingRunState()
        self._cancel_reason: str | None = None
        self._evals: Evaluator | None = None

    # -- the trainer contract: updates in, a query out -------------------------------------------
    @workflow.update
    def report(self, report: StepReport) -> dict[str, Any]:
        """A finished step (and maybe a checkpoint). Idempotent: a repeated step or checkpoint is a no-op."""
        state = self._state
        if report.step > state.step:
            state.step = report.step
            state.scalars = dict(report.scalars)
            state.history = [*state.history, {"step": float(report.step), **report.scalars}][-HISTORY_KEEP:]
        checkpoint = report.checkpoint
        if checkpoint is not None and all(c.report.name != checkpoint.name for c in state.checkpoints):
            state.checkpoints.append(CheckpointState(report=checkpoint))
        return {"step": state.step, "checkpoints": len(state.checkpoints)}

    @report.validator
    def _check_report(self, report: StepReport) -> None:
        if self._state.phase in (*TERMINAL, "stopping"):
            raise ApplicationError(f"the run is {self._state.phase}; report of step {report.step} refused")

    @workflow.update
    async def finish(self, report: FinishReport) -> list[EvalSummary]:
        """The trainer is done; answered once every reported checkpoint is evaluated."""
        self._state.finish = report
        await workflow.wait_condition(lambda: self._evals_done() or self._state.phase in (*TERMINAL, "stopping"))
        return [c.eval for c in self._state.checkpoints if c.eval is not None]

    @workflow.signal
    def cancel(self, reason: str) -> None:
        """Stop the run: the trainer is stopped, children cancelled, the run ends `cancelled`."""
        self._cancel_reason = reason or "cancelled by signal"

    @workflow.query
    def progress(self) -> dict[str, Any]:
        """Phase, step, scalars, checkpoints with their evals, and where the trainer runs."""
        state = self._state
        return {
            "phase": state.phase,
            "step": state.step,
            "scalars": state.scalars,
            "history": state.history,
            "checkpoints": [c.model_dump(mode="json") for c in state.checkpoints],
            "launch": state.launch.model_dump(mode="json") if state.launch else None,
            "prepared": state.prepared.model_dump(mode="json") if state.prepared else None,
            "finish": state.finish.model_dump(mode="json") if state.finish else None,
            "runs": state.runs,
        }

    # -- orchestration -----------------------------------------------------------------------------
    @workflow.run
    async def run(self, input: TrainingRunInput) -> TrainingRunResult:
        self._input = input
        self._config = input.config
        self._run_id = workflow.info().workflow_id
        if input.config.run_id is not None and input.config.run_id != self._run_id:
            raise ApplicationError(
                f"config.run_id {input.config.run_id!r} differs from the workflow id {self._run_id!r}",
                type=errors.INVALID_INPUT,
                non_retryable=True,
            )
        self._state = input.state.model_copy(deep=True)
        self._evaluator: asyncio.Task[None] | None = None
        # GymflowEnv / GymflowRun at start (if the starter did not set them); GymflowStatus once, at close.
        with status.Closing(names.start_attributes(input.config.env, run=self._run_id)) as self._status:
            return await self._run()

    async def _run(self) -> TrainingRunResult:
        try:
            if self._state.prepared is None:
                await self._prepare()
            if self._state.launch is None:
                await self._launch()
            return await self._watch()
        except asyncio.CancelledError:
            await self._close("cancelled", "cancelled")
            raise
        except ApplicationError as exc:
            await self._close("failed", exc.message)
            raise
        except (ActivityError, ChildWorkflowError) as exc:
            # An activity whose retries ran out, or a child that failed: the run fails naming it.
            if isinstance(exc, ActivityError) and isinstance(exc.cause, ApplicationError):
                message, kind = exc.cause.message, exc.cause.type or errors.ENV_ERROR  # our activities' own words
            elif isinstance(exc, ActivityError):
                message, kind = describe(exc), error_type(exc) or errors.ENV_ERROR
            else:
                message, kind = f"child workflow failed: {exc.cause or exc}", errors.ENV_ERROR
            await self._close("failed", message)
            raise ApplicationError(message, type=kind, non_retryable=True) from exc

    async def _prepare(self) -> None:
        self._state.prepared = await prepare(self._run_id, self._config, self._state)
        await self._record_lineage()

    async def _launch(self) -> None:
        self._phase("launching")
        self._state.launch = await execute(
            TrainerActivities.launch,
            LaunchInput(run_id=self._run_id, config=self._config, prepared=self._prepared()),
            start_to_close_timeout=LONG,
            retry_policy=QUICK,
            summary=f"launch trainer ({self._config.trainer.backend})",
        )

    def _prepared(self) -> PreparedRun:
        if self._state.prepared is None:  # unreachable: the run prepares before it launches or evaluates
            raise ApplicationError("the run is not prepared", type=errors.INVALID_INPUT, non_retryable=True)
        return self._state.prepared

    async def _watch(self) -> TrainingRunResult:
        launch = self._state.launch
        if launch is None:  # unreachable: launched just before
            raise ApplicationError("the run has no trainer", type=errors.INVALID_INPUT, non_retryable=True)
        self._phase("watching")
        self._evals = Evaluator(
            run_id=self._run_id, config=self._config, state=self._state, prepared=self._prepared(),
            on_eval=self._record_lineage,
        )  # fmt: skip
        self._evaluator = asyncio.ensure_future(self._evals.run())
        while True:
            watching = asyncio.ensure_future(
                execute(
                    TrainerActivities.watch,
                    WatchInput(launch=launch, slice_s=self._input.watch_slice_s),
                    start_to_close_timeout=timedelta(seconds=self._input.watch_slice_s + 120),
                    heartbeat_timeout=WATCH_HEARTBEAT,
                    retry_policy=WATCH_RETRY,
                    summary="watch trainer",
                )
            )
            try:
                await workflow.wait_condition(
                    lambda: watching.done() or self._cancel_reason is not None or self._evaluator_failed()  # noqa: B023
                )
            except asyncio.CancelledError:
                watching.cancel()
                raise
            self._raise_evaluator_failure(watching)
            if self._cancel_reason is not None:
                watching.cancel()
                return await self._close("cancelled", self._cancel_reason)
            result = watching.result()
            if result.state == "running":
                if self._history_full():
                    await self._continue_as_new()
                continue
            if result.state == "failed":
                detail = f"exit code {result.exit_code}" if result.exit_code is not None else result.detail
                raise ApplicationError(
                    f"trainer failed ({detail}); its last log lines:\n{result.log_tail}",
                    type=TRAINER_FAILED,
                    non_retryable=True,
                )
            self._phase("evaluating")
            await workflow.wait_condition(lambda: self._evals_done() or self._evaluator_failed())
            self._raise_evaluator_failure(None)
            return await self._close("completed", (self._state.finish.message if self._state.finish else ""))

    def _history_full(self) -> bool:
        info = workflow.info()
        long = info.get_current_history_length() > self._input.continue_as_new_events
        return self._state.finish is None and (info.is_continue_as_new_suggested() or long)

    async def _continue_as_new(self) -> None:
        evals = self._evals
        if evals is not None:  # no new eval; let the running one finish (children cannot be carried over)
            evals.draining = True
            await workflow.wait_condition(lambda: not evals.running and workflow.all_handlers_finished())
        self._state.runs += 1
        workflow.continue_as_new(self._input.model_copy(update={"state": self._state}))

    # -- evaluation ----------------------------------------------------------------------------
    def _evals_done(self) -> bool:
        return self._evals.done() if self._evals is not None else not self._state.checkpoints

    def _evaluator_failed(self) -> bool:
        return self._evaluator is not None and self._evaluator.done()

    def _raise_evaluator_failure(self, watching: asyncio.Future[Any] | None) -> None:
        """The evaluator only ends by failing (a baseline batch or a comparison that failed for good)."""
        if self._evaluator is not None and self._evaluator.done() and not self._evaluator.cancelled():
            if watching is not None:
                watching.cancel()
            exc = self._evaluator.exception()
            if exc is not None:
                raise exc

    # -- lineage, status, the end ------------------------------------------------------------------
    def _phase(self, phase: str) -> None:
        self._state.phase = phase

    def _lineage(self, status: str) -> dict[str, Any]:
        state = self._state
        prepared = state.prepared
        return {
            "run_id": self._run_id,
            "status": status,
            "env": self._config.env,
            "config": self._config.model_dump(mode="json"),
            "digests": {
                "config": prepared.config_digest,
                "dataset": prepared.dataset_digest,
                "env": prepared.env_digest,
            }
            if prepared
            else {},
            "prepared": prepared.model_dump(mode="json") if prepared else None,
            "launch": state.launch.model_dump(mode="json") if state.launch else None,
            "step": state.step,
            "history": state.history,
            "baseline_batch": state.baseline_batch,
            "checkpoints": [c.model_dump(mode="json") for c in state.checkpoints],
        }

    async def _record_lineage(self, status: str = "running") -> str | None:
        prepared = self._state.prepared
        if prepared is None:
            return None
        last = next((c for c in reversed(self._state.checkpoints) if c.eval is not None), None)
        workflow.upsert_memo(
            {
                "run_id": self._run_id,
                "config_digest": prepared.config_digest,
                "dataset_digest": prepared.dataset_digest,
                "env_digest": prepared.env_digest,
                "manifest": prepared.manifest_uri,
                "checkpoints": len(self._state.checkpoints),
                "last_eval": last.eval.model_dump(mode="json") if last and last.eval else None,
            }
        )
        return await execute(
            TrainingActivities.write_manifest,
            ManifestInput(run_id=self._run_id, storage=self._config.storage, manifest=self._lineage(status)),
            start_to_close_timeout=SHORT,
            retry_policy=QUICK,
            summary="write manifest",
        )

    async def _close(self, status: str, message: str) -> TrainingRunResult:
        """Stop the trainer, cancel children, tear down, record: every way a run ends goes through here."""
        state = self._state
        if self._evals is not None:
            self._evals.closing = True
        self._phase("stopping")
        launch = state.launch
        grace = self._config.trainer.stop_grace_s
        if launch is not None and status != "completed":
            await execute(
                TrainerActivities.stop,
                StopInput(launch=launch, grace_s=grace),
                start_to_close_timeout=SHORT,
                retry_policy=QUICK,
                summary="stop trainer",
            )
        if self._evaluator is not None and not self._evaluator.done():
            self._evaluator.cancel()
            await asyncio.gather(self._evaluator, return_exceptions=True)  # children cancelled, not terminated
        await execute(
            TrainerActivities.teardown,
            TeardownInput(run_id=self._run_id, launch=launch, backend=self._config.trainer.backend, grace_s=grace),
            start_to_close_timeout=LONG,
            retry_policy=QUICK,
            summary="tear down",
        )
        self._phase(status)
        manifest = await self._record_lineage(status)
        self._status.close(Status(status))  # in the workflow task that closes the run
        return TrainingRunResult(
            run_id=self._run_id,
            status=status,
            steps=state.step,
            checkpoints=state.checkpoints,
            manifest_uri=manifest,
            message=message,
        )
