"""The storage boundary: results of batches (JSONL) in a local directory or S3, same interface.

Workflows carry URIs, never bulk data: a batch writes its trajectories as JSONL parts through
the `write_jsonl` activity and keeps only the part URIs and per-rollout summaries. URIs are
`file:///abs/path/...` or `s3://bucket/key`. The S3 store uses boto3 with its own retries
reduced to one attempt, because Temporal owns retries (DESIGN: no double retries); blocking
boto3 calls run in a thread. The same boto3 client backs temporalio's S3 external-storage driver
(`Boto3StorageDriverClient`), which keeps payloads over the inline limit out of history.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pydantic import Field
from temporalio import activity
from temporalio.contrib.aws.s3driver import S3StorageDriverClient
from temporalio.exceptions import ApplicationError

from gymflow.activities import errors
from gymflow.envs.contract import Task, Trajectory, Wire
from gymflow.envs.datagen.format import tasks_from_jsonl, to_jsonl
from gymflow.envs.errors import DatasetError, StorageError
from gymflow.envs.registry import dataset_page, page_of
from gymflow.envs.runtime.admission import Admission


class Store(ABC):
    """Byte objects addressed by URI."""

    @abstractmethod
    def uri(self, key: str) -> str:
        """The URI of `key` (a relative, '/'-separated path) in this store."""

    @abstractmethod
    async def put(self, key: str, data: bytes) -> str:
        """Write `data` under `key`; returns its URI."""

    @abstractmethod
    async def get(self, uri: str) -> bytes:
        """Read the object at `uri`."""

    @abstractmethod
    async def exists(self, uri: str) -> bool:
        """Whether an object is at `uri` (a batch's parts, before anything relies on them)."""


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in {"", ".", ".."} for p in parts):
        raise StorageError(f"invalid storage key {key!r}: use a relative path without '..' or empty parts")
    return key


class LocalStore(Store):
    """A directory on this machine (the default: results under the data dir)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def uri(self, key: str) -> str:
        return (self.root / _check_key(key)).as_uri()

    async def put(self, key: str, data: bytes) -> str:
        path = self.root / _check_key(key)
        await asyncio.to_thread(_write_atomic, path, data)
        return path.as_uri()

    async def get(self, uri: str) -> bytes:
        parsed = urlparse(uri)
        if parsed.scheme != "file":
            raise StorageError(f"LocalStore cannot read {uri!r}")
        return await asyncio.to_thread(self._read, Path(unquote(parsed.path)), uri)

    async def exists(self, uri: str) -> bool:
        parsed = urlparse(uri)
        if parsed.scheme != "file":
            raise StorageError(f"LocalStore cannot read {uri!r}")
        return await asyncio.to_thread(Path(unquote(parsed.path)).is_file)

    def _read(self, path: Path, uri: str) -> bytes:
        if self.root not in path.resolve().parents:
            raise StorageError(f"{uri!r} is outside this store's root {self.root}")
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise StorageError(f"no object at {uri}") from exc


def _write_atomic(path: Path, data: bytes) -> None:
    # Write then rename, so a reader never sees half a part (and a retried write is harmless).
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def s3_client(*, endpoint_url: str | None = None, region: str | None = None) -> Any:
    """A boto3 S3 client with retries left to Temporal (one attempt per call)."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=10, read_timeout=60)
    return boto3.client("s3", endpoint_url=endpoint_url, region_name=region or "us-east-1", config=config)


class Boto3StorageDriverClient(S3StorageDriverClient):
    """temporalio's S3 external-storage driver over a (sync) boto3 client, each call in a thread.

    Used by the data converter (gymflow.workers.sdk.client) so payloads over the inline threshold — a huge
    tool output, a long trajectory — live in S3 and history holds a small reference. The boto3
    client comes from `s3_client()` (one attempt per call: the Temporal activity or workflow task
    that needed the payload is what retries). `prefix` is put in front of the driver's keys
    (`v0/ns/...`) and must stay the same for as long as references written under it are read.
    """

    def __init__(self, client: Any, *, prefix: str = "") -> None:
        self.client = client
        self.prefix = prefix.strip("/")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        await asyncio.to_thread(self.client.put_object, Bucket=bucket, Key=self._key(key), Body=data)

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        from botocore.exceptions import ClientError

        def head() -> bool:
            try:
                self.client.head_object(Bucket=bucket, Key=self._key(key))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                    return False
                raise
            return True

        return await asyncio.to_thread(head)

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        def read() -> bytes:
            return bytes(self.client.get_object(Bucket=bucket, Key=self._key(key))["Body"].read())

        return await asyncio.to_thread(read)

    def describe(self) -> Mapping[str, str]:
        info = {"client_region": str(self.client.meta.region_name), "endpoint": str(self.client.meta.endpoint_url)}
        return info | ({"prefix": self.prefix} if self.prefix else {})


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix`.

    Raises:
        StorageError: Not an s3:// URI with a bucket.
    """
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise StorageError(f"not an S3 URI with a bucket: {uri!r} (use s3://bucket/prefix)")
    return parsed.netloc, parsed.path.strip("/")


class S3Store(Store):
    """An S3 bucket and key prefix (any S3 API: AWS, MinIO, moto's server)."""

    def __init__(self, bucket: str, prefix: str = "", *, client: Any) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client

    def _key(self, key: str) -> str:
        key = _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    async def put(self, key: str, data: bytes) -> str:
        full = self._key(key)
        await asyncio.to_thread(self.client.put_object, Bucket=self.bucket, Key=full, Body=data)
        return f"s3://{self.bucket}/{full}"

    async def get(self, uri: str) -> bytes:
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or parsed.netloc != self.bucket:
            raise StorageError(f"{uri!r} is not in bucket {self.bucket!r}")
        key = parsed.path.lstrip("/")

        def read() -> bytes:
            try:
                body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
            except self.client.exceptions.NoSuchKey as exc:
                raise StorageError(f"no object at {uri}") from exc
            return bytes(body.read())

        return await asyncio.to_thread(read)

    async def exists(self, uri: str) -> bool:
        from botocore.exceptions import ClientError

        parsed = urlparse(uri)
        if parsed.scheme != "s3" or parsed.netloc != self.bucket:
            raise StorageError(f"{uri!r} is not in bucket {self.bucket!r}")

        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket, Key=parsed.path.lstrip("/"))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                    return False
                raise
            return True

        return await asyncio.to_thread(head)


def open_store(uri: str, *, s3_endpoint_url: str | None = None) -> Store:
    """The store for a base URI: `file:///dir`, a plain path, or `s3://bucket/prefix`."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"S3 URI {uri!r} names no bucket")
        return S3Store(parsed.netloc, parsed.path, client=s3_client(endpoint_url=s3_endpoint_url))
    if parsed.scheme == "file":
        return LocalStore(Path(unquote(parsed.path)))
    if parsed.scheme == "":
        return LocalStore(Path(uri))
    raise StorageError(f"unsupported storage URI {uri!r}: use file:///dir or s3://bucket/prefix")


def trajectories_from_jsonl(data: bytes, *, source: str = "<jsonl>") -> list[Trajectory]:
    """Parse trajectories written by `write_jsonl`, naming the line of any bad record."""
    out = []
    for number, line in enumerate(data.splitlines(), start=1):
        if line.strip():
            try:
                out.append(Trajectory.model_validate_json(line))
            except ValueError as exc:
                raise StorageError(f"{source}:{number}: not a trajectory: {exc}") from exc
    return out


def is_object_uri(name: str) -> bool:
    """Whether a dataset name is a storage URI of a Task JSONL object (a run's uploaded split)."""
    return name.startswith(("file://", "s3://")) and name.endswith(".jsonl")


class WriteJsonlInput(Wire):
    key: str
    """Relative key under the destination, e.g. `batch-1/trajectories/part-00000.jsonl`."""
    trajectories: list[Trajectory]
    destination: str | None = None
    """Base URI; None: the worker's default store."""


class LoadTasksInput(Wire):
    env: str
    dataset: str
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the env's `load_dataset` (n, seed, ...)."""
    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=256, ge=1, le=4096)


class StorageActivities:
    """Activities that move bulk data between workflows and storage."""

    def __init__(
        self, *, default_uri: str, s3_endpoint_url: str | None = None, admission: Admission | None = None
    ) -> None:
        self.default_uri = default_uri
        self.s3_endpoint_url = s3_endpoint_url
        self.admission = admission
        """The node's process pool for loading datasets (generating one is CPU-bound); None: a thread."""

    def store(self, destination: str | None) -> Store:
        """The store of `destination` (or the default)."""
        try:
            return open_store(destination or self.default_uri, s3_endpoint_url=self.s3_endpoint_url)
        except StorageError as exc:
            raise errors.non_retryable(str(exc), type=errors.STORAGE_ERROR) from exc

    @activity.defn(name="write_jsonl")
    async def write_jsonl(self, input: WriteJsonlInput) -> str:
        """Write trajectories as one JSONL object; returns its URI. Idempotent (same key, same bytes)."""
        store = self.store(input.destination)
        try:
            return await store.put(input.key, to_jsonl(input.trajectories))
        except StorageError as exc:
            raise errors.non_retryable(str(exc), type=errors.STORAGE_ERROR) from exc
        except Exception as exc:  # network, permissions, throttling: let Temporal retry it
            raise ApplicationError(f"writing {input.key} failed: {exc}", type=errors.STORAGE_ERROR) from exc

    @activity.defn(name="load_tasks")
    async def load_tasks(self, input: LoadTasksInput) -> list[Task]:
        """One page of an env's dataset, so a batch never holds a whole dataset in its history."""
        from gymflow.envs.errors import UnknownEnvError
        from gymflow.envs.registry import env_class

        if is_object_uri(input.dataset):  # a training run's uploaded split: Task JSONL in storage
            try:
                data = await open_store(base_of(input.dataset), s3_endpoint_url=self.s3_endpoint_url).get(input.dataset)
                return page_of(tasks_from_jsonl(data, source=input.dataset), input.offset, input.limit)
            except (StorageError, DatasetError) as exc:
                raise errors.non_retryable(
                    f"cannot load dataset {input.dataset!r}: {exc}", type=errors.ENV_CONFIG
                ) from exc
        try:
            cls = env_class(input.env)
            # Off the event loop and its GIL: a generator (sheets: openpyxl) can take seconds.
            if self.admission is not None:
                page = await self.admission.cpu(
                    dataset_page, cls, input.dataset, input.options, input.offset, input.limit
                )
            else:
                page = await asyncio.to_thread(
                    dataset_page, cls, input.dataset, input.options, input.offset, input.limit
                )
        except (UnknownEnvError, ValueError, TypeError, FileNotFoundError, NotImplementedError) as exc:
            raise errors.non_retryable(
                f"cannot load dataset {input.dataset!r} of {input.env}: {exc}", type=errors.ENV_CONFIG
            ) from exc
        return page


async def read_trajectories(uris: Sequence[str], *, s3_endpoint_url: str | None = None) -> list[Trajectory]:
    """Read every JSONL part (client side: reports, the SDK)."""
    out: list[Trajectory] = []
    for uri in uris:
        store = open_store(base_of(uri), s3_endpoint_url=s3_endpoint_url)
        out += trajectories_from_jsonl(await store.get(uri), source=uri)
    return out


def base_of(uri: str) -> str:
    """The base URI of the store holding `uri` (its bucket, or its directory)."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return f"s3://{parsed.netloc}"
    return str(Path(unquote(parsed.path)).parent)
