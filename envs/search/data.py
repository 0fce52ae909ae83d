"""The search env's data: datasets written by `gymflow dataset generate`, and their corpus.

A dataset URI (a directory, file:///dir or s3://bucket/prefix; see `envs.datagen.format`) is
read with the standard library or, for S3, a boto3 client configured the usual way (AWS_* and
``AWS_ENDPOINT_URL`` for MinIO / moto). Its rows are validated against `SearchTruth`: every row
names its answers and the gold documents. Each task's ``init_args.corpus`` names the dataset's
``corpus.jsonl``; a worker fetches it once into a local cache (`local_corpus`) and each rollout's
server reads it from there.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from pydantic import Field, ValidationError

from envs.contract import DatasetError, Task, Wire
from envs.datagen import format as fmt

CACHE_ENV = "GYMFLOW_SEARCH_CACHE"
"""Overrides where fetched corpora are kept (default: <tmp>/gymflow-search)."""


class SearchTruth(Wire):
    """The ground truth of a search task."""

    answers: list[str] = Field(min_length=1)
    """Acceptable answers (token F1 / exact match take the best)."""
    doc_ids: list[str] = Field(min_length=1)
    """The documents the answer comes from: citing one of them earns the citation reward."""


def validate_task(task: Task) -> SearchTruth:
    """The task's ground truth, checked against the search env's task schema.

    Raises:
        DatasetError: The task is not a search task (names the task and the field).
    """
    if not isinstance(task.prompt, str) or not task.prompt.strip():
        raise DatasetError(f"task {task.id}: prompt must be a question (a non-empty string)")
    unknown = set(task.init_args) - {"corpus"}
    if unknown:
        raise DatasetError(f"task {task.id}: unknown init_args {sorted(unknown)}")
    try:
        return SearchTruth.model_validate(task.ground_truth)
    except ValidationError as exc:
        raise DatasetError(f"task {task.id}: ground_truth: {exc}") from exc


def read_uri(uri: str) -> bytes:
    """The bytes at a path, file:// or s3:// URI."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        import boto3

        body = boto3.client("s3").get_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))["Body"]
        return bytes(body.read())
    path = Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(uri)
    if not path.is_file():
        raise FileNotFoundError(f"no file at {uri}")
    return path.read_bytes()


def load_split(uri: str, split: str = "eval") -> list[Task]:
    """The validated tasks of one split of a dataset.

    Raises:
        DatasetError: A row is not a search task; FileNotFoundError: no such dataset or split.
    """
    if split not in fmt.SPLITS:
        raise DatasetError(f"unknown split {split!r}; choose {', '.join(fmt.SPLITS)}")
    manifest = fmt.Manifest.model_validate_json(read_uri(fmt.join(uri, fmt.MANIFEST)))
    source = fmt.join(uri, manifest.splits[split].jsonl)
    tasks = fmt.tasks_from_jsonl(read_uri(source), source=source)
    for task in tasks:
        validate_task(task)
    return tasks


def local_corpus(uri: str) -> Path:
    """A local copy of the corpus file at `uri` (local files are used in place)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(uri)
        if not path.is_file():
            raise FileNotFoundError(f"no corpus at {uri}")
        return path.resolve()
    root = Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "gymflow-search")
    path = root / hashlib.sha256(uri.encode()).hexdigest()[:24] / "corpus.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".corpus.{os.getpid()}.tmp")
        tmp.write_bytes(read_uri(uri))
        tmp.replace(path)  # atomic: concurrent rollouts never read half a corpus
    return path


def read_corpus(path: Path) -> list[dict[str, str]]:
    """The documents of a corpus.jsonl (id, title, text)."""
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
