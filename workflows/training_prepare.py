"""Preparing a training run (workflow code, used by TrainingRunWorkflow): validate, serve, smoke, bundle, upload.

The static checks run first (`validate_training_run`: env, dataset, storage, trainer); the env's
baseline policies a run names are served over HTTP for the smoke rollouts and the baseline eval;
the smoke rollouts (a child batch on the shared queue) must run without infrastructure failures and
reach `validation.min_mean_reward`; then the env is bundled and the bundle, the dataset and the
trainer's spec go to the run's storage. A failed check fails the run (TrainingConfigError) before
anything is launched.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from gymflow.activities import names
    from gymflow.activities.errors import TRAINING_CONFIG
    from gymflow.activities.model import ModelConfig
    from gymflow.activities.schema import BatchInput
    from gymflow.activities.training import (
        BundleInfo,
        BundleRequest,
        ServicesInput,
        TrainingActivities,
        UploadInput,
        ValidateInput,
        ValidationReport,
    )
    from gymflow.activities.training_schema import PreparedRun, RunConfig, TrainingRunState
    from gymflow.workflows.activity_calls import execute
    from gymflow.workflows.training_evals import child_batch

QUICK = RetryPolicy(maximum_attempts=5, non_retryable_error_types=[TRAINING_CONFIG])
SHORT = timedelta(minutes=2)
LONG = timedelta(minutes=30)
BUNDLE_ENV_PACKAGES = "bundle-env-packages"
"""Patch id: a run that pins env packages asks `bundle_env` for them too (a `BundleRequest`)."""


async def prepare(run_id: str, config: RunConfig, state: TrainingRunState) -> PreparedRun:
    """Validate, serve, smoke-test, bundle and upload the run; its phase goes to `state.phase`.

    Raises:
        ApplicationError: The config is at fault (TrainingConfigError: the smoke rollouts failed or
            scored too low).
        ActivityError: A step failed for good.
        ChildWorkflowError: The smoke batch failed.
    """
    state.phase = "validating"
    report: ValidationReport = await execute(
        TrainingActivities.validate,
        ValidateInput(run_id=run_id, config=config),
        start_to_close_timeout=LONG,
        retry_policy=QUICK,
        summary="validate env, dataset, storage, trainer",
    )
    policies = {}
    smoke = config.validation.smoke_policy if config.validation.smoke_rollouts else None
    for ref in (smoke, config.baseline):
        if ref is not None and ref.policy is not None:
            policies[f"policy-{ref.policy}"] = ref.policy
    urls: dict[str, str] = {}
    if policies:
        urls = await execute(
            TrainingActivities.start_services,
            ServicesInput(run_id=run_id, env=config.env, policies=policies),
            start_to_close_timeout=SHORT,
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=QUICK,
            summary=f"serve {', '.join(sorted(policies.values()))}",
        )
    services = sorted(policies)

    def endpoint(ref: Any) -> ModelConfig:
        if (
            ref.checkpoint is not None
        ):  # the trainer reports its endpoint with the checkpoint (gymflow.workflows.training_evals)
            return config.model
        if ref.policy is not None:
            return config.model.model_copy(update={"base_url": urls[f"policy-{ref.policy}"], "model": ""})
        return config.model.model_copy(update={"base_url": ref.base_url, "model": ref.model})

    if smoke is not None:
        state.phase = "smoke"
        result = await child_batch(
            run_id,
            config.env,
            f"{run_id}/smoke",
            BatchInput(
                env=config.env,
                tasks=report.smoke_tasks,
                options=config.rollout_options(endpoint(smoke)),
                destination=config.storage,
            ),
        )
        if result.infra_failed:
            raise ApplicationError(
                f"validation: {result.infra_failed} of {result.total} smoke rollouts failed for infrastructure "
                f"reasons (batch {result.batch_id})",
                type=TRAINING_CONFIG,
                non_retryable=True,
            )
        floor = config.validation.min_mean_reward
        if floor is not None and (result.mean_reward or 0.0) < floor:
            raise ApplicationError(
                f"validation.min_mean_reward: the smoke rollouts scored {result.mean_reward}, below {floor}",
                type=TRAINING_CONFIG,
                non_retryable=True,
            )
    state.phase = "bundling"
    # Runs that pin env packages bundle them too; others (and histories from before pins) send the name.
    pinned = bool(config.env_packages) and workflow.patched(BUNDLE_ENV_PACKAGES)
    bundle: BundleInfo = await execute(
        TrainingActivities.bundle,
        BundleRequest(env=config.env, env_packages=config.env_packages) if pinned else config.env,
        start_to_close_timeout=SHORT,
        retry_policy=QUICK,
        summary="bundle env",
    )
    state.phase = "uploading"
    return await execute(
        TrainingActivities.upload,
        UploadInput(
            run_id=run_id,
            config=config,
            bundle=bundle,
            baseline=endpoint(config.baseline),
            services=services,
            task_queue=names.rollout_queue(workflow.info().task_queue),  # where the trainer's rollouts go
        ),
        start_to_close_timeout=LONG,
        retry_policy=QUICK,
        summary="upload bundle, dataset, trainer spec",
    )
