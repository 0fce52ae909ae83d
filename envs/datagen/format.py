"""The dataset format: what a dataset URI holds, and how to read and write it.

A dataset is a directory (or S3 prefix) holding::

    manifest.json     config, source digests, counts, rejections by reason, split sizes
    train.jsonl       one `gymflow.envs.contract.Task` per line (Task.model_dump_json)
    train.parquet     the same rows for HF `datasets` / pandas / DuckDB
    eval.jsonl
    eval.parquet
    corpus.jsonl      corpus sources only: the documents the questions come from (search env)
    rejected.jsonl    every rejected item with its stage, reason and detail

Rows are Tasks of the env named in the manifest. Parquet needs one type per column, and ground
truths differ by env, so its columns are: ``id``, ``prompt`` (the text; null when the prompt is a
message list), ``prompt_messages`` (JSON of the message list, else null), and ``ground_truth``,
``init_args``, ``metadata`` as JSON text. `tasks_from_parquet` turns rows back into Tasks, and
``datasets.load_dataset("parquet", data_files={"train": ".../train.parquet"})`` reads them as is.
Paths inside the manifest are relative to the dataset URI.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from gymflow.envs.contract import Message, Task, Wire
from gymflow.envs.errors import DatasetError

FORMAT = "gymflow-dataset/1"
MANIFEST = "manifest.json"
SPLITS = ("train", "eval")
CORPUS = "corpus.jsonl"
REJECTED = "rejected.jsonl"
PARQUET_COLUMNS = ("id", "prompt", "prompt_messages", "ground_truth", "init_args", "metadata")


class SplitInfo(Wire):
    """One split's files and size."""

    rows: int
    jsonl: str
    parquet: str
    sha256: str
    """Digest of the JSONL file."""
    groups: int
    """Source groups (documents, sessions, env tasks) behind its rows."""


class Manifest(Wire):
    """``manifest.json`` of a dataset."""

    format: str = FORMAT
    env: str
    """The env whose tasks the rows are (``search``, ``math``, ``traces`` for chat turns)."""
    workflow_id: str
    created_at: str
    source: dict[str, str]
    """``{"kind": corpus|traces|env, "location": ...}``."""
    config: dict[str, Any]
    """The generation input (model endpoints by URL only; keys never enter it)."""
    seed: int
    target: int
    accepted: int
    target_met: bool
    counts: dict[str, int]
    """``candidates`` planned, ``processed``, ``accepted``, ``rejected`` (each item counted once)."""
    rejections: dict[str, int]
    """``stage/reason`` -> count."""
    accepted_by_type: dict[str, int]
    splits: dict[str, SplitInfo]
    source_digests: dict[str, str]
    """Source document (or trace file, or generator) -> sha256."""
    corpus: str | None = None
    rejected: str = REJECTED
    data_files: dict[str, str] = Field(default_factory=dict)
    """Split -> Parquet file, as `datasets.load_dataset("parquet", data_files=...)` takes them."""
    moved_rows: int = 0
    """Rows moved from the split of their documents to the other one, which had no row
    (`gymflow.envs.datagen.plan.fill_empty_split`)."""


def to_jsonl(items: Iterable[BaseModel]) -> bytes:
    """One JSON object per line (tasks, trajectories, plans: any pydantic model)."""
    return b"".join(item.model_dump_json().encode() + b"\n" for item in items)


def tasks_from_jsonl(data: bytes, *, source: str = "<jsonl>") -> list[Task]:
    """The tasks of a JSONL file (a dataset split, a training run's uploaded split).

    Raises:
        DatasetError: A line is not a Task; the message names ``source:LINE`` and the field.
    """
    tasks = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            tasks.append(Task.model_validate_json(line))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "(row)"
            raise DatasetError(f"{source}:{number}: field {field!r}: {err['msg']}") from None
    return tasks


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def tasks_to_parquet(tasks: Sequence[Task]) -> bytes:
    """The tasks as a Parquet file (columns: see the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [task.model_dump(mode="json") for task in tasks]
    columns = {
        "id": [r["id"] for r in rows],
        "prompt": [r["prompt"] if isinstance(r["prompt"], str) else None for r in rows],
        "prompt_messages": [None if isinstance(r["prompt"], str) else _json(r["prompt"]) for r in rows],
        "ground_truth": [_json(r["ground_truth"]) for r in rows],
        "init_args": [_json(r["init_args"]) for r in rows],
        "metadata": [_json(r["metadata"]) for r in rows],
    }
    table = pa.table({name: pa.array(values, type=pa.string()) for name, values in columns.items()})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def task_from_record(record: dict[str, Any]) -> Task:
    """A Task from one Parquet row (as pyarrow or HF `datasets` gives it)."""
    prompt: str | list[Message] = record.get("prompt") or ""
    if record.get("prompt_messages"):
        prompt = [Message.model_validate(m) for m in json.loads(record["prompt_messages"])]
    return Task(
        id=record["id"],
        prompt=prompt,
        ground_truth=json.loads(record.get("ground_truth") or "null"),
        init_args=json.loads(record.get("init_args") or "{}"),
        metadata=json.loads(record.get("metadata") or "{}"),
    )


def tasks_from_parquet(data: bytes) -> list[Task]:
    import pyarrow.parquet as pq

    return [task_from_record(r) for r in pq.read_table(io.BytesIO(data)).to_pylist()]


def join(base: str, name: str) -> str:
    """``base/name`` for a directory path, file:// or s3:// URI."""
    return base.rstrip("/") + "/" + name
