"""The trainer boundary: launch the run's trainer, watch it, stop it, tear the run down.

Launch is idempotent by run id through the backends of gymflow.activities.trainer_backends (a local process recorded
before it starts; a SkyPilot job found in its cluster's queue before one is submitted). Watching is
a heartbeating activity that returns when the trainer ends or after a slice of time, so a killed
worker's watch resumes on another worker within the heartbeat timeout and the workflow gets a point
to continue as new. A local trainer is a process of one host: only a worker there can watch or stop
it (elsewhere the activity fails retryably, and Temporal retries it).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from temporalio import activity

from gymflow.activities import errors, names
from gymflow.activities import trainer_backends as backends
from gymflow.activities.training_checks import resources
from gymflow.activities.training_schema import LaunchRecord, PreparedRun, RunConfig
from gymflow.envs.contract import Wire

HEARTBEAT_EVERY_S = 1.0


class LaunchInput(Wire):
    run_id: str
    config: RunConfig
    prepared: PreparedRun


class WatchInput(Wire):
    launch: LaunchRecord
    slice_s: float


class WatchResult(Wire):
    state: str
    """`running` (the slice ended), `succeeded` or `failed`."""
    exit_code: int | None = None
    detail: str = ""
    log_tail: str = ""


class StopInput(Wire):
    launch: LaunchRecord
    grace_s: float = 5.0


class TeardownInput(Wire):
    run_id: str
    launch: LaunchRecord | None = None
    backend: str = "local"
    grace_s: float = 5.0


class TrainerActivities:
    """Activities that start, watch and stop a run's trainer; owns where local jobs live and how
    trainers reach Temporal (never secrets: the worker's environment passes those on)."""

    def __init__(
        self, *, data_dir: Path, temporal_address: str, namespace: str, s3_endpoint_url: str | None = None
    ) -> None:
        self.data_dir = data_dir
        self.temporal_address = temporal_address
        self.namespace = namespace
        self.s3_endpoint_url = s3_endpoint_url

    def activities(self) -> list[Any]:
        """Every activity of the trainer boundary, for the worker."""
        return [self.launch, self.watch, self.stop, self.teardown]

    def trainer_env(self, run_id: str, config: RunConfig, prepared: PreparedRun, task_queue: str) -> dict[str, str]:
        """What a trainer is told: the run, where its spec is, how to reach Temporal (no secrets)."""
        env = {
            "GYMFLOW_RUN_ID": run_id,
            "GYMFLOW_RUN_SPEC": prepared.spec_uri,
            "GYMFLOW_TEMPORAL_ADDRESS": self.temporal_address,
            "GYMFLOW_NAMESPACE": self.namespace,
            "GYMFLOW_TASK_QUEUE": task_queue,
            **config.trainer.env,
        }
        if self.s3_endpoint_url:
            env["GYMFLOW_S3_ENDPOINT_URL"] = self.s3_endpoint_url
        return env

    @activity.defn(name="launch_trainer")
    async def launch(self, input: LaunchInput) -> LaunchRecord:
        """Start the trainer unless this run's trainer was started before (then return that one)."""
        config = input.config
        queue = activity.info().task_queue
        env = self.trainer_env(input.run_id, config, input.prepared, queue)
        workdir = await asyncio.to_thread(Path(config.trainer.workdir).resolve)
        if config.trainer.backend == "skypilot":
            task = backends.task_config(workdir / config.trainer.task_file, env=env, resources=resources(config))
            job_id, reused = await asyncio.to_thread(backends.skypilot_launch, input.run_id, task)
            return LaunchRecord(
                backend="skypilot",
                run_id=input.run_id,
                cluster=backends.cluster_name(input.run_id),
                job_id=job_id,
                reused=reused,
            )
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        jobs = backends.LocalJobs(self.data_dir, input.run_id)
        record, reused = await asyncio.to_thread(
            jobs.launch,
            backends.TRAINER,
            config.trainer.command,
            cwd=workdir,
            env={**os.environ, **env, "PATH": path},
        )
        return LaunchRecord(
            backend="local",
            run_id=input.run_id,
            pid=record["pid"],
            start_time=record["start"],
            log=record["log"],
            reused=reused,
            host=socket.gethostname(),
        )

    def _status(self, launch: LaunchRecord) -> tuple[backends.JobStatus, str]:
        _on_its_host(launch)
        if launch.backend == "skypilot":
            assert launch.job_id is not None
            status = backends.skypilot_status(launch.run_id, launch.job_id)
            tail = backends.skypilot_tail(launch.run_id, launch.job_id) if status.state != "running" else ""
            return status, tail
        record = _local_record(launch)
        status = backends.LocalJobs(self.data_dir, launch.run_id).status(record)
        return status, backends.LocalJobs.tail(record) if status.state != "running" else ""

    @activity.defn(name="watch_trainer")
    async def watch(self, input: WatchInput) -> WatchResult:
        """Heartbeat while the trainer runs; return when it ends or after `slice_s`."""
        deadline = time.monotonic() + input.slice_s
        while True:
            status, tail = await asyncio.to_thread(self._status, input.launch)
            if status.state != "running" or time.monotonic() >= deadline:
                return WatchResult(state=status.state, exit_code=status.exit_code, detail=status.detail, log_tail=tail)
            activity.heartbeat(status.state)
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    @activity.defn(name="stop_trainer")
    async def stop(self, input: StopInput) -> bool:
        """Stop the trainer (SIGTERM, SIGKILL after the grace; SkyPilot: cancel the job)."""
        launch = input.launch
        if launch.backend == "skypilot":
            assert launch.job_id is not None
            await asyncio.to_thread(backends.skypilot_cancel, launch.run_id, launch.job_id)
            return True
        _on_its_host(launch)
        jobs = backends.LocalJobs(self.data_dir, launch.run_id)
        return await asyncio.to_thread(jobs.stop, _local_record(launch), grace_s=input.grace_s)

    @activity.defn(name="teardown_training_run")
    async def teardown(self, input: TeardownInput) -> list[str]:
        """Stop whatever of the run still runs here (trainer, policy services); take the cluster down."""
        jobs = backends.LocalJobs(self.data_dir, input.run_id)
        stopped = []
        for record in await asyncio.to_thread(jobs.records):
            if await asyncio.to_thread(jobs.stop, record, grace_s=input.grace_s):
                stopped.append(record["name"])
        if input.backend == "skypilot":
            await asyncio.to_thread(backends.skypilot_down, input.run_id)
            stopped.append(backends.cluster_name(input.run_id))
        # The trainer's rollout groups (tagged with the run by the SDK) are no children of the run.
        client = activity.client()
        query = (
            f'{names.SA_RUN.name}="{input.run_id}" AND ExecutionStatus="Running" '
            f'AND WorkflowType="{names.GROUP_WORKFLOW}"'
        )
        async for execution in client.list_workflows(query):
            await client.get_workflow_handle(execution.id, run_id=execution.run_id).cancel()
            stopped.append(execution.id)
        return stopped


def _on_its_host(launch: LaunchRecord) -> None:
    """A local trainer is a process of one host: elsewhere, fail retryably (Temporal retries, and
    the activity lands on a worker of that host), never report it gone."""
    if launch.backend == "local" and launch.host and launch.host != socket.gethostname():
        raise errors.retryable(
            f"the trainer runs on host {launch.host}, not {socket.gethostname()}", type=errors.ENV_ERROR
        )


def _local_record(launch: LaunchRecord) -> dict[str, Any]:
    log = Path(launch.log or "")
    return {"pid": launch.pid, "start": launch.start_time, "log": str(log), "exit_file": str(log.with_suffix(".exit"))}
