"""The scan step of dataset generation: read a source once, reject what is unusable, plan the rest.

Writes, under ``<out>/work/<workflow id>/``: ``plan.jsonl`` (one candidate, trace turn or env task
per line, in processing order), ``chunks.jsonl`` and ``corpus.jsonl`` (corpus sources),
``digests.json`` (source -> sha256) and ``scan-rejected.jsonl``. All of it is a function of the
source and the input, so a retried scan writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter

from temporalio import activity

from gymflow.activities import errors
from gymflow.activities.dataset_models import ScanInput, ScanResult, work_prefix
from gymflow.activities.dataset_sources import corpus_files, read_file
from gymflow.activities.storage import Store
from gymflow.envs.contract import Task, Wire
from gymflow.envs.datagen.corpus import Chunk, Document, Rejection, chunk_document, decode_document, reject
from gymflow.envs.datagen.format import to_jsonl
from gymflow.envs.datagen.plan import assign_splits, corpus_plan, partners
from gymflow.envs.datagen.traces import TraceTurn, parse_trace_line
from gymflow.envs.errors import StorageError

MAX_TRACE_LINE_BYTES = 4 * 1024 * 1024
ENV_OVERSAMPLE = 1.25
"""Env sources: tasks generated per target item (duplicates are removed later)."""


async def scan(input: ScanInput, store: Store, out: str, *, s3_endpoint_url: str | None) -> ScanResult:
    """Scan `input.source` into a plan in `store` (the dataset URI `out`)."""
    try:
        if input.source.kind == "corpus":
            return await _corpus(input, store, out, s3_endpoint_url)
        if input.source.kind == "traces":
            return await _traces(input, store, out, s3_endpoint_url)
        return await _env(input, store, out)
    except StorageError as exc:
        raise errors.non_retryable(f"source {input.source.location!r}: {exc}", type=errors.INVALID_INPUT) from exc


async def _write(
    input: ScanInput,
    store: Store,
    out: str,
    *,
    plan: list[Wire],
    rejected: list[Rejection],
    digests: dict[str, str],
    groups: dict[str, str],
    items: int,
    extra: dict[str, str | None] | None = None,
) -> ScanResult:
    prefix = work_prefix(input.workflow_id)
    return ScanResult(
        out=out,
        plan_uri=await store.put(f"{prefix}/plan.jsonl", to_jsonl(plan)),
        plan_size=len(plan),
        digests_uri=await store.put(f"{prefix}/digests.json", json.dumps(digests, sort_keys=True).encode()),
        rejected_uri=await store.put(f"{prefix}/scan-rejected.jsonl", to_jsonl(rejected)),
        groups=dict(Counter(groups.values())),
        rejections=dict(Counter(f"{r.stage}/{r.reason}" for r in rejected)),
        items=items,
        **(extra or {}),
    )


async def _corpus(input: ScanInput, store: Store, out: str, s3_endpoint_url: str | None) -> ScanResult:
    options = input.options
    docs: list[Document] = []
    rejected: list[Rejection] = []
    items = 0
    async for file in corpus_files(
        input.source.location, max_bytes=options.max_file_bytes, s3_endpoint_url=s3_endpoint_url
    ):
        items += 1
        activity.heartbeat(f"read {items} files")
        if file.data is None:
            rejected.append(reject(file.id, "scan", "too_large", f"{file.size} bytes > limit {options.max_file_bytes}"))
            continue
        outcome = decode_document(file.id, file.data, max_bytes=options.max_file_bytes)
        (docs if isinstance(outcome, Document) else rejected).append(outcome)  # type: ignore[arg-type]
    if not docs:
        raise errors.non_retryable(
            f"corpus {input.source.location!r} has no usable document ({items} files, {len(rejected)} rejected)",
            type=errors.INVALID_INPUT,
        )
    splits = assign_splits([d.id for d in docs], seed=input.seed, eval_fraction=options.eval_fraction)
    chunks: list[Chunk] = []
    for doc in docs:
        try:
            pieces = chunk_document(doc, chunk_tokens=options.chunk_tokens, overlap_tokens=options.overlap_tokens)
        except ValueError as exc:
            raise errors.non_retryable(f"chunking: {exc}", type=errors.INVALID_INPUT) from exc
        chunks += [c.model_copy(update={"split": splits[doc.id]}) for c in pieces]
    activity.heartbeat(f"{len(chunks)} chunks; linking")
    related = partners(chunks, docs, seed=input.seed)
    types = list(dict.fromkeys(options.types))
    plan = corpus_plan(chunks, related, types=types, variants=options.variants, seed=input.seed)
    prefix = work_prefix(input.workflow_id)
    corpus = b"".join(
        json.dumps({"id": d.id, "title": d.title, "text": d.text, "sha256": d.sha256}).encode() + b"\n" for d in docs
    )
    return await _write(
        input, store, out, plan=list(plan), rejected=rejected, digests={d.id: d.sha256 for d in docs},
        groups=splits, items=items,
        extra={
            "chunks_uri": await store.put(f"{prefix}/chunks.jsonl", to_jsonl(list(chunks))),
            "corpus_uri": await store.put(f"{prefix}/corpus.jsonl", corpus),
        },
    )  # fmt: skip


async def _traces(input: ScanInput, store: Store, out: str, s3_endpoint_url: str | None) -> ScanResult:
    data = await read_file(input.source.location, s3_endpoint_url=s3_endpoint_url)
    source = input.source.location.rsplit("/", 1)[-1]
    turns: list[TraceTurn] = []
    rejected: list[Rejection] = []
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if number % 1000 == 0:
            activity.heartbeat(f"line {number}")
        if len(line) > MAX_TRACE_LINE_BYTES:
            rejected.append(reject(f"{source}:{number}", "scan", "line_too_large", f"{len(line)} bytes"))
            continue
        outcome = parse_trace_line(line, number, source=source)
        if isinstance(outcome, Rejection):
            rejected.append(outcome)
        else:
            turns += outcome
    splits = assign_splits([t.session for t in turns], seed=input.seed, eval_fraction=input.options.eval_fraction)
    plan = [t.model_copy(update={"split": splits[t.session]}) for t in turns]
    return await _write(
        input, store, out, plan=list(plan), rejected=rejected,
        digests={source: hashlib.sha256(data).hexdigest()}, groups=splits,
        items=sum(1 for line in lines if line.strip()),
    )  # fmt: skip


async def _env(input: ScanInput, store: Store, out: str) -> ScanResult:
    from gymflow.envs.errors import UnknownEnvError
    from gymflow.envs.registry import env_class

    name = input.source.location
    count = math.ceil(input.n * ENV_OVERSAMPLE) + 16
    try:
        tasks = list(env_class(name).load_dataset("generated", n=count, seed=input.seed))[:count]
    except (UnknownEnvError, NotImplementedError, ValueError, TypeError) as exc:
        raise errors.non_retryable(f"env {name!r} has no task generator: {exc}", type=errors.INVALID_INPUT) from exc
    splits = assign_splits([t.id for t in tasks], seed=input.seed, eval_fraction=input.options.eval_fraction)
    plan: list[Task] = []
    for task in tasks:
        metadata = {**task.metadata, "split": splits[task.id], "type": str(task.metadata.get("type", "task"))}
        plan.append(task.model_copy(update={"metadata": metadata}))
    digest = hashlib.sha256(b"".join(t.model_dump_json().encode() for t in plan)).hexdigest()
    return await _write(
        input,
        store,
        out,
        plan=list(plan),
        rejected=[],
        digests={f"env:{name}": digest},
        groups=splits,
        items=len(tasks),
    )
