"""The training run's preparation and evaluation boundary: validate a run, serve its policies,
bundle and upload what the trainer needs, compare checkpoints with the baseline, write the
manifest. Launching, watching and stopping the trainer is gymflow.activities.trainer_jobs.

Each activity is idempotent by run id: storage keys are content-addressed or per run, and the
backends (gymflow.activities.trainer_backends) find a job they started before instead of starting another. Watching is
a heartbeating activity that returns when the trainer ends or after a slice of time, so a killed
worker's watch is picked up by another within the heartbeat timeout, and the workflow gets a point
to continue as new. Failures that retrying cannot fix (a bad config, a trainer that failed) are
non-retryable `ApplicationError`s whose message names the field or carries the trainer's last log
lines.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from gymflow.activities import errors
from gymflow.activities import trainer_backends as backends
from gymflow.activities.bundle import Bundle, build_bundle, read_splits, sha256
from gymflow.activities.comparison import compare_batches
from gymflow.activities.model import ModelConfig
from gymflow.activities.storage import open_store, read_trajectories
from gymflow.activities.training_checks import check_config
from gymflow.activities.training_schema import CheckpointReport, EvalSummary, PreparedRun, RunConfig, TrainerSpec
from gymflow.envs.contract import BaseEnv, Task, Wire
from gymflow.envs.datagen.format import to_jsonl
from gymflow.envs.errors import BundleError, DatasetError, StorageError
from gymflow.envs.registry import env_class

SERVICE_START_S = 60.0


class ValidateInput(Wire):
    run_id: str
    config: RunConfig


class ValidationReport(Wire):
    tools: list[str]
    train_tasks: int
    eval_tasks: int
    smoke_tasks: list[Task]
    """The first train tasks, for the smoke rollouts."""


class ServicesInput(Wire):
    run_id: str
    env: str
    policies: dict[str, str]
    """Service name -> env baseline policy name."""


class BundleInfo(Wire):
    env: str
    digest: str
    filename: str
    requirements: list[str]
    files: int


class BundleRequest(Wire):
    """What `bundle_env` bundles: the run's env and the env packages its config pins."""

    env: str
    env_packages: dict[str, str] = Field(default_factory=dict)


class UploadInput(Wire):
    run_id: str
    config: RunConfig
    bundle: BundleInfo
    baseline: ModelConfig
    services: list[str]
    task_queue: str


class CompareInput(Wire):
    run_id: str
    checkpoint: CheckpointReport
    batch_id: str
    parts: list[str]
    baseline_parts: list[str]
    reps: int = 2000
    storage: str | None = None


class ManifestInput(Wire):
    run_id: str
    storage: str | None = None
    manifest: dict[str, Any]


def _fail(message: str, type: str = errors.TRAINING_CONFIG) -> Exception:
    return errors.non_retryable(message, type=type)


class TrainingActivities:
    """Activities that prepare and evaluate a training run; owns its storage and its local services."""

    def __init__(self, *, data_dir: Path, default_storage: str, s3_endpoint_url: str | None = None) -> None:
        self.data_dir = data_dir
        self.default_storage = default_storage
        self.s3_endpoint_url = s3_endpoint_url

    def activities(self) -> list[Any]:
        """Every activity of the training boundary, for the worker."""
        return [self.validate, self.start_services, self.bundle, self.upload, self.compare, self.write_manifest]

    def _store(self, storage: str | None) -> Any:
        try:
            return open_store(storage or self.default_storage, s3_endpoint_url=self.s3_endpoint_url)
        except StorageError as exc:
            raise _fail(f"storage: {exc}") from exc

    @activity.defn(name="validate_training_run")
    async def validate(self, input: ValidateInput) -> ValidationReport:
        """Static checks: env and policies, trainer and resources, dataset rows, storage, tools.

        Every check runs and the failure names every problem found, so a config with three mistakes
        is fixed in one try (a check that needs what failed before it, such as the eval split's
        size without a dataset, is left out).
        """
        config = input.config
        problems = await asyncio.to_thread(check_config, config)
        splits = None
        try:
            splits = await read_splits(config.dataset, config.env, s3_endpoint_url=self.s3_endpoint_url)
        except (DatasetError, StorageError) as exc:
            problems.append(f"dataset: {exc}")
        except Exception as exc:  # network failures of the dataset's store; an env that does not load
            problems.append(f"dataset: cannot read {config.dataset.uri}: {exc}")
        if splits is not None and len(splits.eval) < config.eval.tasks:
            problems.append(
                f"eval.tasks: the eval split has {len(splits.eval)} tasks, the run asks for {config.eval.tasks}"
            )
        problems += await self._check_storage(config.storage, input.run_id)
        tools: list[str] = []
        if not any(p.startswith("env:") for p in problems):
            try:
                tools = await self._tools(env_class(config.env))
            except ApplicationError as exc:
                problems.append(exc.message)
            else:
                if not tools:
                    problems.append(f"env: {config.env} lists no tools")
        if problems or splits is None:
            raise _fail("; ".join(problems))
        return ValidationReport(
            tools=tools,
            train_tasks=len(splits.train),
            eval_tasks=len(splits.eval),
            smoke_tasks=splits.train[: config.validation.smoke_rollouts],
        )

    async def _check_storage(self, storage: str | None, run_id: str) -> list[str]:
        """The run's storage can be written and read (a problem per failure, none when it can)."""
        try:
            store = self._store(storage)
        except ApplicationError as exc:
            return [exc.message]
        key = f"runs/{run_id}/.probe"
        try:
            uri = await store.put(key, b"ok")
            await store.get(uri)
        except Exception as exc:  # connection refused, no bucket, no permission: all "unreachable"
            return [f"storage: cannot write and read {store.uri(key)}: {exc}"]
        return []

    async def _tools(self, cls: type[BaseEnv]) -> list[str]:
        workspace = self.data_dir / "training" / ".validate"
        env = cls(workspace_root=workspace, pool_size=0)
        try:
            return [tool.name for tool in await asyncio.wait_for(env.list_tools(), 120)]
        except Exception as exc:  # a server that does not start is the env's problem, reported as such
            raise _fail(f"env: listing the tools of {cls.name or cls.__name__} failed: {exc}") from exc
        finally:
            await env.shutdown()

    @activity.defn(name="start_policy_services")
    async def start_services(self, input: ServicesInput) -> dict[str, str]:
        """Serve env baseline policies for the run (`gymflow policy serve`), once; name -> URL."""
        jobs = backends.LocalJobs(self.data_dir, input.run_id)
        urls = {}
        for name, policy in sorted(input.policies.items()):
            port = backends.free_port()
            command = [
                sys.executable,
                "-m",
                "gymflow.workers.cli.main",
                "policy",
                "serve",
                input.env,
                "--policy",
                policy,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ]
            record, _ = await asyncio.to_thread(
                jobs.launch, name, command, cwd=Path.cwd(), env=dict(os.environ), extra={"port": port}
            )
            url = f"http://127.0.0.1:{record['port']}/v1"
            deadline = time.monotonic() + SERVICE_START_S
            while not await asyncio.to_thread(_answers, url):
                activity.heartbeat(name)
                if not jobs.running(record) or time.monotonic() > deadline:
                    raise _fail(
                        f"policy service {name} ({policy}) did not start:\n{jobs.tail(record)}", errors.ENV_ERROR
                    )
                await asyncio.sleep(0.1)
            urls[name] = url
        return urls

    @activity.defn(name="bundle_env")
    async def bundle(self, request: str | BundleRequest) -> BundleInfo:
        """Build the env's sdist (see gymflow.activities.bundle) and keep it in this host's bundle cache.

        `request`: the env's name (runs that pin no env packages, and histories from before pins), or
        the env with the env packages the run pins."""
        env, pins = (request, {}) if isinstance(request, str) else (request.env, request.env_packages)
        try:
            bundle = await asyncio.to_thread(build_bundle, env, pins)
        except (BundleError, OSError) as exc:
            raise _fail(f"env: cannot bundle {env}: {exc}") from exc
        await asyncio.to_thread(self._cache, bundle)
        return BundleInfo(
            env=env,
            digest=bundle.digest,
            filename=bundle.filename,
            requirements=bundle.requirements,
            files=len(bundle.files),
        )

    def _cache(self, bundle: Bundle) -> Path:
        path = self.data_dir / "bundles" / bundle.digest / bundle.filename
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(bundle.data)
            tmp.replace(path)
        return path

    @activity.defn(name="upload_training_run")
    async def upload(self, input: UploadInput) -> PreparedRun:
        """Upload the bundle, the dataset splits and the trainer spec; returns their URIs and digests."""
        config, info = input.config, input.bundle
        cached = self.data_dir / "bundles" / info.digest / info.filename
        data = (
            cached.read_bytes()
            if cached.is_file()
            else (await asyncio.to_thread(build_bundle, config.env, config.env_packages)).data
        )
        if sha256(data) != info.digest:  # another host built it differently: its environment differs
            raise _fail(f"env: the bundle built here has digest {sha256(data)}, not {info.digest}", errors.ENV_ERROR)
        store = self._store(config.storage)
        bundle_uri = await store.put(f"bundles/{info.digest}/{info.filename}", data)
        requirements_uri = await store.put(
            f"bundles/{info.digest}/requirements.txt", "".join(f"{r}\n" for r in info.requirements).encode()
        )
        splits = await read_splits(config.dataset, config.env, s3_endpoint_url=self.s3_endpoint_url)
        train, evals = to_jsonl(splits.train), to_jsonl(splits.eval)
        dataset_digest = sha256(sha256(train).encode() + sha256(evals).encode())
        base = f"datasets/{dataset_digest}"
        train_uri = await store.put(f"{base}/train.jsonl", train)
        eval_uri = await store.put(f"{base}/eval.jsonl", evals)
        await store.put(
            f"{base}/manifest.json",
            _json(
                {
                    "env": config.env,
                    "train": len(splits.train),
                    "eval": len(splits.eval),
                    "train_sha256": sha256(train),
                    "eval_sha256": sha256(evals),
                    "source": splits.source,
                }
            ),
        )
        config_digest = sha256(config.model_dump_json().encode())
        spec = TrainerSpec(
            run_id=input.run_id,
            env=config.env,
            config=config,
            train_uri=train_uri,
            eval_uri=eval_uri,
            bundle_uri=bundle_uri,
            requirements_uri=requirements_uri,
            bundle_digest=info.digest,
            dataset_digest=dataset_digest,
            storage=_base(store),
            checkpoints=store.uri(f"runs/{input.run_id}/checkpoints"),
            task_queue=input.task_queue,
        )
        spec_uri = await store.put(f"runs/{input.run_id}/run.json", spec.model_dump_json(indent=1).encode())
        return PreparedRun(
            spec_uri=spec_uri,
            manifest_uri=store.uri(f"runs/{input.run_id}/manifest.json"),
            dataset_digest=dataset_digest,
            env_digest=info.digest,
            config_digest=config_digest,
            bundle_uri=bundle_uri,
            train_uri=train_uri,
            eval_uri=eval_uri,
            train_tasks=len(splits.train),
            eval_tasks=len(splits.eval),
            baseline=input.baseline,
            services=input.services,
        )

    @activity.defn(name="compare_checkpoint")
    async def compare(self, input: CompareInput) -> EvalSummary:
        """A checkpoint's eval batch against the baseline's, paired by task (gymflow.envs.eval.stats)."""
        checkpoint = await read_trajectories(input.parts, s3_endpoint_url=self.s3_endpoint_url)
        baseline = await read_trajectories(input.baseline_parts, s3_endpoint_url=self.s3_endpoint_url)
        summary, report = await asyncio.to_thread(compare_batches, input, checkpoint, baseline)
        store = self._store(input.storage)
        uri = await store.put(f"runs/{input.run_id}/evals/{input.checkpoint.name}.json", _json(report))
        return summary.model_copy(update={"report_uri": uri})

    @activity.defn(name="write_training_manifest")
    async def write_manifest(self, input: ManifestInput) -> str:
        """The run's lineage as `runs/<run id>/manifest.json`."""
        return await self._store(input.storage).put(f"runs/{input.run_id}/manifest.json", _json(input.manifest))


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _base(store: Any) -> str:
    return str(store.uri("x"))[:-2]


def _json(value: Mapping[str, Any]) -> bytes:
    import json

    return json.dumps(value, indent=1, default=str).encode()
