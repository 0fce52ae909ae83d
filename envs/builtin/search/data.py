"""The search env's data: datasets written by `gymflow dataset generate`, and their corpus.

A dataset URI (a directory, file:///dir or s3://bucket/prefix; see `gymflow.envs.datagen.format`) is
read with the standard library or, for S3, a boto3 client configured the usual way (AWS_* and
``AWS_ENDPOINT_URL`` for MinIO / moto). Its rows are validated against `SearchTruth`: every row
names its answers and the gold documents. Each task's ``init_args.corpus`` names the dataset's
``corpus.jsonl``; a worker fetches it once into a local cache (`local_corpus`) and each rollout's
server reads it from there.

The env's `generated` dataset is a sample that ships with gymflow, so `gymflow eval search` runs
with nothing made first: a dataset `gymflow dataset generate` wrote from `sample_corpus/`, its
rows in `sample_tasks.jsonl` (eval split first) and its corpus in `sample_corpus.jsonl`. The rows
name their corpus as `SAMPLE_CORPUS_URI`, which every worker reads from its own installed copy
(no path of the machine that made it). Remake it with `python -m gymflow.envs.builtin.search.data DATASET_DIR`
after `gymflow dataset generate --source corpus:envs/builtin/search/sample_corpus --n 80
--eval-fraction 0.5 --out DATASET_DIR`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from pydantic import Field, ValidationError

from gymflow.envs.contract import Task, Wire
from gymflow.envs.datagen import format as fmt
from gymflow.envs.errors import DatasetError

CACHE_ENV = "GYMFLOW_SEARCH_CACHE"
"""Overrides where fetched corpora are kept (default: <tmp>/gymflow-search)."""
SAMPLE_TASKS = Path(__file__).with_name("sample_tasks.jsonl")
SAMPLE_CORPUS = Path(__file__).with_name("sample_corpus.jsonl")
SAMPLE_CORPUS_URI = "gymflow-sample:corpus.jsonl"
"""The corpus of the sample tasks, wherever gymflow is installed."""


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


def load_sample(split: str | None = None) -> list[Task]:
    """The sample tasks (module docstring), all of them or one split's."""
    if split is not None and split not in fmt.SPLITS:
        raise DatasetError(f"unknown split {split!r}; choose {', '.join(fmt.SPLITS)}")
    tasks = fmt.tasks_from_jsonl(SAMPLE_TASKS.read_bytes(), source=str(SAMPLE_TASKS))
    return [t for t in tasks if split is None or t.metadata.get("split") == split]


def write_sample(dataset_uri: str) -> int:
    """Make a dataset written by `gymflow dataset generate` the env's sample; returns its rows."""
    manifest = fmt.Manifest.model_validate_json(read_uri(fmt.join(dataset_uri, fmt.MANIFEST)))
    rows = []
    for split in sorted(manifest.splits, key=lambda name: name != "eval"):
        for task in load_split(dataset_uri, split):
            rows.append(task.model_copy(update={"init_args": {**task.init_args, "corpus": SAMPLE_CORPUS_URI}}))
    SAMPLE_TASKS.write_text("".join(t.model_dump_json() + "\n" for t in rows), encoding="utf-8")
    SAMPLE_CORPUS.write_bytes(read_uri(fmt.join(dataset_uri, "corpus.jsonl")))
    return len(rows)


def local_corpus(uri: str) -> Path:
    """A local copy of the corpus file at `uri` (local files are used in place)."""
    if uri == SAMPLE_CORPUS_URI:
        return SAMPLE_CORPUS
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


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m gymflow.envs.builtin.search.data DATASET_DIR   (makes it the search env's sample)")
    print(f"{write_sample(sys.argv[1])} tasks -> {SAMPLE_TASKS}")
