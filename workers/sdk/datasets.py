"""`gymflow dataset generate|show`: run a DatasetGenerationWorkflow with a progress bar; read a dataset.

`generate` starts the workflow (and an in-process worker unless --no-worker), draws a bar from
its `progress` query (accepted / target, rejections so far) and prints where the dataset is.
When fewer items were accepted than asked, `shortfall` says which filters rejected most and what
relaxes each (``--skip-filter NAME`` for the skippable ones: `gymflow.envs.datagen.filters.FILTERS`).
`show` reads a dataset URI (directory, file:// or s3://) and prints its counts, rejections by
reason and a few rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from temporalio.client import WorkflowHandle

from gymflow.activities.dataset_models import DatasetSource, GenerationOptions
from gymflow.activities.model import ModelConfig
from gymflow.activities.names import dataset_queue
from gymflow.activities.schema import DatasetInput, DatasetResult
from gymflow.envs.datagen import format as fmt
from gymflow.workers.config import Settings
from gymflow.workers.roles import COMMAND_ROLES
from gymflow.workers.sdk import scripts
from gymflow.workers.sdk.local import connect_or_start
from gymflow.workers.sdk.progress import Progress, Reading, follow
from gymflow.workers.worker import running_worker
from gymflow.workflows.dataset import DatasetGenerationWorkflow


@dataclass
class GenerateOptions:
    """What `gymflow dataset generate` runs."""

    source: str
    n: int
    out: str | None = None
    env: str | None = None
    generator: str = "offline"
    model_url: str | None = None
    model: str = ""
    judge_url: str | None = None
    seed: int = 0
    eval_fraction: float = 0.2
    batch_size: int = 64
    local_worker: bool = True
    skip_filters: tuple[str, ...] = ()
    """Filters not applied (`GenerationOptions.skip_filters`): too_easy, dedup, quota."""


def dataset_input(options: GenerateOptions) -> DatasetInput:
    """The workflow input; local paths become absolute (workers resolve them, maybe elsewhere)."""
    source = DatasetSource.parse(options.source)
    if source.kind in ("corpus", "traces") and "://" not in source.location:
        source = source.model_copy(update={"location": str(Path(source.location).resolve())})
    out = options.out
    if out is not None and "://" not in out:
        out = str(Path(out).resolve())
    generation = GenerationOptions(
        generator=options.generator,
        model=ModelConfig(base_url=options.model_url, model=options.model, temperature=0.7, max_tokens=512),
        judge=ModelConfig(base_url=options.judge_url, temperature=0.0) if options.judge_url else None,
        eval_fraction=options.eval_fraction,
        skip_filters=list(dict.fromkeys(options.skip_filters)),
    )
    return DatasetInput(
        source=source, n=options.n, out=out, env=options.env, seed=options.seed, options=generation,
        batch_size=options.batch_size,
    )  # fmt: skip


async def _accepted(handle: WorkflowHandle[Any, DatasetResult]) -> Reading:
    progress = await handle.query(DatasetGenerationWorkflow.progress)
    rejected, stage = progress.get("rejected", 0), progress.get("stage", "starting")
    return int(progress.get("accepted", 0)), f"accepted, {rejected} rejected ({stage})"


async def run_generate(options: GenerateOptions, settings: Settings, *, out: TextIO = sys.stderr) -> DatasetResult:
    """Generate the dataset; returns the workflow's result."""
    input = dataset_input(options)
    client = await connect_or_start(settings, start_server=False, out=out)
    if options.local_worker:  # its own queue: no other command's workflows, none of its own elsewhere
        settings = settings.command_queue("dataset")
        scripts.note_queue_on_interrupt(settings.task_queue)
    async with contextlib.AsyncExitStack() as stack:
        if options.local_worker:
            await stack.enter_async_context(running_worker(client, settings, roles=COMMAND_ROLES["dataset"]))
        handle = await client.start_workflow(
            DatasetGenerationWorkflow.run,
            input,
            id=f"dataset-{input.env_name()}-{uuid.uuid4().hex[:8]}",
            task_queue=dataset_queue(settings.task_queue),
        )
        done = asyncio.Event()
        progress = Progress(out, options.n)
        bar = asyncio.create_task(follow(progress, lambda: _accepted(handle), done))
        result: DatasetResult | None = None
        try:
            result = await handle.result()
        finally:
            done.set()
            last = await bar
            if result is not None:
                last = (result.accepted, f"accepted, {result.rejected} rejected (done)")
            progress.close(*last)
    return result


# What relaxes each rejection (by ``stage/reason``, else by stage), for `shortfall`.
_RELAX = {
    "too_easy": "the answer is in the top BM25 passage for the question: keep them with --skip-filter too_easy",
    "dedup": "near-duplicates of accepted questions: keep them with --skip-filter dedup",
    "quota": "a question type reached its share of the target: lift the caps with --skip-filter quota",
    "generate/no_question": "the offline generator found nothing unambiguous to ask there: a model writes more "
    "(--generator model --model-url URL), or give more documents",
    "generate": "the model's reply was unusable or the call failed: see rejected.jsonl for the replies",
    "guard": "malformed or not answerable from its sources (not relaxable): see rejected.jsonl",
    "judge": "the judge found no support in the passages, or failed: drop --judge-url to skip the check",
    "scan": "files that could not be read as documents: see rejected.jsonl for each file and why",
    "batch": "batches failed for good (the worker's log says why); running again retries them",
}


def shortfall(result: DatasetResult, *, top: int = 3) -> list[str]:
    """Why a run accepted fewer items than it wanted: the reasons that rejected most and what
    relaxes each; [] when the target was met.

    Args:
        result: The run's result.
        top: Reasons listed at most.
    """
    if result.target_met:
        return []
    return explain(result.accepted, result.target, result.rejections, top=top)


def explain(accepted: int, target: int, rejections: dict[str, int], *, top: int = 3) -> list[str]:
    """`shortfall`'s lines from the counts (a result's, or a manifest's)."""
    reasons = sorted(
        ((n, key) for key, n in rejections.items() if not key.startswith("target/")), key=lambda kv: -kv[0]
    )
    wanted = f" of the {target} wanted" if target else ""
    lines = [f"accepted {accepted}{wanted}: the source ran out of candidates. Most rejections:"]
    lines += [f"  {count:>6}  {key}: {relax(key)}" for count, key in reasons[:top]]
    if not reasons:
        lines.append("  none: the source holds fewer candidates than that (more documents, or --n lower)")
    return lines


def relax(reason: str) -> str:
    """What a ``stage/reason`` rejection means and what relaxes it."""
    return _RELAX.get(reason) or _RELAX.get(reason.split("/", 1)[0], "see rejected.jsonl")


def format_result(result: DatasetResult) -> str:
    """`generate`'s summary for people: where the dataset is, and any shortfall explained."""
    splits = ", ".join(f"{k} {v}" for k, v in result.splits.items())
    lines = [f"{result.accepted} items ({splits}), {result.rejected} rejected: {result.uri}", *shortfall(result)]
    lines.append(f"see them with `gymflow dataset show {result.uri}`")
    return "\n".join(lines)


def show(uri: str, *, samples: int = 3) -> dict[str, Any]:
    """A dataset's manifest summary and a few rows of each split."""
    from gymflow.envs.builtin.search.data import read_uri

    manifest = fmt.Manifest.model_validate_json(read_uri(fmt.join(uri, fmt.MANIFEST)))
    rows = {}
    for split, info in manifest.splits.items():
        tasks = fmt.tasks_from_jsonl(read_uri(fmt.join(uri, info.jsonl)))[:samples]
        rows[split] = [t.model_dump(mode="json", exclude={"init_args"}) for t in tasks]
    return {
        "uri": uri,
        "env": manifest.env,
        "source": manifest.source,
        "accepted": manifest.accepted,
        "target": manifest.target,
        "target_met": manifest.target_met,
        "splits": {split: info.rows for split, info in manifest.splits.items()},
        "groups": {split: info.groups for split, info in manifest.splits.items()},
        "by_type": manifest.accepted_by_type,
        "counts": manifest.counts,
        "rejections": manifest.rejections,
        "samples": rows,
    }


def format_show(summary: dict[str, Any]) -> str:
    """`show`'s summary for people."""
    source = summary["source"]
    lines = [
        f"dataset {summary['uri']} (env {summary['env']}, source {source['kind']}:{source['location']})",
        f"accepted {summary['accepted']} of {summary['target']} wanted; "
        + ", ".join(f"{s}: {n} rows from {summary['groups'][s]} sources" for s, n in summary["splits"].items()),
        "by type: " + ", ".join(f"{k} {v}" for k, v in summary["by_type"].items()),
        f"candidates {summary['counts'].get('candidates', 0)}, processed {summary['counts'].get('processed', 0)}, "
        f"rejected {summary['counts'].get('rejected', 0)}:",
    ]
    for reason, count in sorted(summary["rejections"].items(), key=lambda kv: -kv[1]):
        # Short of the target: what relaxes each reason, as the generate command said.
        hint = "" if summary["target_met"] or reason.startswith("target/") else f": {relax(reason)}"
        lines.append(f"  {count:>6}  {reason}{hint}")
    for split, rows in summary["samples"].items():
        lines.append(f"samples ({split}):")
        for row in rows:
            prompt = row["prompt"] if isinstance(row["prompt"], str) else json.dumps(row["prompt"])[:200]
            lines.append(f"  [{row['id']}] {prompt}\n      -> {json.dumps(row['ground_truth'])[:200]}")
    return "\n".join(lines)
