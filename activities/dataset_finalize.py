"""The last step of dataset generation: the dataset files a run leaves at its URI.

Reads the accepted and rejected files of every merged batch (``work/<id>/``) and writes the
layout `gymflow.envs.datagen.format` describes: ``{train,eval}.jsonl`` and ``.parquet``, ``corpus.jsonl``
for corpus sources (every task's ``init_args.corpus`` points at it), ``rejected.jsonl`` (scan
rejections first, then batch by batch) and ``manifest.json`` last, so a reader that finds a
manifest finds every file it names. When the accepted rows left a split empty, whole source
components move to it first (`gymflow.envs.datagen.plan.fill_empty_split`; the manifest counts the rows).
Deterministic: a retried finalize writes the same bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable

from gymflow.activities.dataset_models import BatchRecord, FinalizeInput, FinalizeResult, work_prefix
from gymflow.activities.storage import Store
from gymflow.envs.contract import Task
from gymflow.envs.datagen import format as fmt
from gymflow.envs.datagen.plan import fill_empty_split


async def write_dataset(
    input: FinalizeInput, store: Store, *, read: Callable[[str], Awaitable[bytes]]
) -> FinalizeResult:
    """Write the dataset of a finished run (see the module docstring); `read` fetches work files."""
    prefix = work_prefix(input.workflow_id)
    corpus_uri = store.uri(fmt.CORPUS) if input.scan.corpus_uri else None
    tasks: list[Task] = []
    rejected = [await read(input.scan.rejected_uri)]
    for index in range(input.merged):
        for line in (await read(store.uri(f"{prefix}/accepted-{index:06d}.jsonl"))).splitlines():
            task = BatchRecord.model_validate_json(line).task
            if task is not None:
                tasks.append(task.model_copy(update={"init_args": {"corpus": corpus_uri}}) if corpus_uri else task)
        rejected.append(await read(store.uri(f"{prefix}/rejected-{index:06d}.jsonl")))
    sources = [(str(t.metadata.get("split", "")), _groups(t)) for t in tasks]
    splits_now = fill_empty_split(sources, seed=input.seed, eval_fraction=input.eval_fraction)
    moved = [i for i, (t, split) in enumerate(zip(tasks, splits_now, strict=True)) if t.metadata.get("split") != split]
    for i in moved:
        tasks[i] = tasks[i].model_copy(update={"metadata": {**tasks[i].metadata, "split": splits_now[i]}})
    if corpus_uri is not None and input.scan.corpus_uri is not None:
        await store.put(fmt.CORPUS, await read(input.scan.corpus_uri))
    await store.put(fmt.REJECTED, b"".join(rejected))
    splits: dict[str, fmt.SplitInfo] = {}
    for split in fmt.SPLITS:
        rows = [t for t in tasks if t.metadata.get("split") == split]
        jsonl = fmt.to_jsonl(rows)
        await store.put(f"{split}.jsonl", jsonl)
        await store.put(f"{split}.parquet", await asyncio.to_thread(fmt.tasks_to_parquet, rows))
        groups = {g for t in rows for g in _groups(t)}
        splits[split] = fmt.SplitInfo(
            rows=len(rows), jsonl=f"{split}.jsonl", parquet=f"{split}.parquet",
            sha256=hashlib.sha256(jsonl).hexdigest(), groups=len(groups),
        )  # fmt: skip
    digests = json.loads(await read(input.scan.digests_uri))
    manifest = fmt.Manifest(
        env=input.env,
        workflow_id=input.workflow_id,
        created_at=input.created_at,
        source={"kind": input.source.kind, "location": input.source.location},
        config=input.config,
        seed=input.seed,
        target=input.target,
        accepted=len(tasks),
        target_met=len(tasks) >= input.target,
        counts=input.counts,
        rejections=dict(sorted(input.rejections.items())),
        accepted_by_type=dict(sorted(input.accepted_by_type.items())),
        splits=splits,
        source_digests=digests,
        corpus=fmt.CORPUS if corpus_uri else None,
        data_files={split: info.parquet for split, info in splits.items()},
        moved_rows=len(moved),
    )
    manifest_uri = await store.put(fmt.MANIFEST, manifest.model_dump_json(indent=2).encode())
    return FinalizeResult(
        uri=store.uri(fmt.MANIFEST).rsplit("/", 1)[0],
        manifest_uri=manifest_uri,
        splits={k: v.rows for k, v in splits.items()},
    )


def _groups(task: Task) -> list[str]:
    meta = task.metadata
    return list(meta.get("doc_ids") or [meta.get("session") or task.id])
