"""Dataset generation throughput: DatasetGenerationWorkflow vs a plain-asyncio pipeline in one process.

    .venv/bin/python -m bench.dataset [--docs 200] [--n 400] [--repeats 2] [--delay-ms 20]

A 200-document corpus (`gymflow.envs.builtin.search.sample`), then, alternating, each pipeline `--repeats` times:

* **direct**: one asyncio process doing the same work with the same functions (read, check,
  chunk, link, plan; drafts, guards, too-easy, judge; quotas and MinHash dedup; JSONL + Parquet)
  and the same concurrency (window x per-batch calls), with nothing durable: no storage between
  steps, no recorded model replies, no Temporal.
* **gymflow**: `DatasetGenerationWorkflow` on an embedded dev server (SQLite file, as `gymflow
  server` runs it) and one `gymflow worker` process.

Two generators: **offline** (no model) and **model** (generation and grounding judge from a
scripted OpenAI-compatible server in its own process, `--delay-ms` per reply). The figure is
accepted items per second of wall time; the target is gymflow >= 0.8x direct. Writes
bench/out/dataset.json and dataset.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.procs import ROOT, Procs, free_port, load, measured, start_server
from gymflow.activities.chat_endpoint import ChatEndpoint
from gymflow.activities.dataset_models import DatasetSource, GenerationOptions
from gymflow.activities.judge import JUDGE_ENDPOINT
from gymflow.activities.model import MODEL_ENDPOINT, ModelConfig, chat_body
from gymflow.envs.builtin.search.sample import write_sample_corpus
from gymflow.envs.contract import Task
from gymflow.envs.datagen import format as fmt
from gymflow.envs.datagen.corpus import Document, chunk_document, decode_document
from gymflow.envs.datagen.filters import MinHashDedup, answer_in, guard, quota_caps
from gymflow.envs.datagen.generate import (
    Candidate,
    Draft,
    generation_messages,
    judge_messages,
    offline_draft,
    parse_generation,
    parse_judge,
)
from gymflow.envs.datagen.index import Bm25Index
from gymflow.envs.datagen.plan import assign_splits, corpus_plan, partners, task_id
from gymflow.envs.datagen.text import CorpusContext

OUT = ROOT / "bench" / "out"


def options_for(generator: str, url: str | None) -> GenerationOptions:
    if generator == "offline":
        return GenerationOptions()
    return GenerationOptions(
        generator="model",
        model=ModelConfig(base_url=url, request_timeout_s=60),
        judge=ModelConfig(base_url=url, request_timeout_s=60, temperature=0),
    )


# -- direct: the same work in one asyncio process ---------------------------------------------


async def direct(corpus: Path, out: Path, *, n: int, options: GenerationOptions, batch: int, window: int) -> int:
    docs = []
    for path in sorted(p for p in corpus.rglob("*") if p.is_file()):  # noqa: ASYNC240 (one process, as a script would)
        doc = decode_document(path.relative_to(corpus).as_posix(), path.read_bytes(), max_bytes=options.max_file_bytes)
        if isinstance(doc, Document):
            docs.append(doc)
    splits = assign_splits([d.id for d in docs], seed=0, eval_fraction=options.eval_fraction)
    chunks = [
        c.model_copy(update={"split": splits[d.id]})
        for d in docs
        for c in chunk_document(d, chunk_tokens=options.chunk_tokens, overlap_tokens=options.overlap_tokens)
    ]
    plan = corpus_plan(chunks, partners(chunks, docs, seed=0), types=options.types, variants=options.variants, seed=0)
    by_id = {c.id: c for c in chunks}
    index = Bm25Index([c.text for c in chunks])
    context = CorpusContext(chunks)
    model = ChatEndpoint(errors=MODEL_ENDPOINT)
    judge = ChatEndpoint(errors=JUDGE_ENDPOINT)
    slots = asyncio.Semaphore(options.concurrency * window)

    async def ask(endpoint: ChatEndpoint, config: ModelConfig, messages: list[dict[str, str]]) -> str:
        async with slots:
            reply = await endpoint.complete(config.base_url, chat_body(config, messages), timeout_s=60)
        return str(reply["choices"][0]["message"].get("content") or "")

    async def one(candidate: Candidate) -> Draft | None:
        passages = [by_id[i] for i in candidate.chunk_ids]
        if options.generator == "offline":
            draft = offline_draft(candidate, passages, context)
        else:
            draft = parse_generation(
                candidate, await ask(model, options.model, generation_messages(candidate, passages)), model="m"
            )
        if not isinstance(draft, Draft) or guard(draft, [p.text for p in passages], options.guards):
            return None
        return draft

    async def grounded(draft: Draft) -> Draft | None:
        if options.judge is None:
            return draft
        passages = [by_id[i] for i in draft.chunk_ids]
        return draft if parse_judge(await ask(judge, options.judge, judge_messages(draft, passages))) else None

    accepted: list[Task] = []
    dedup, by_type, caps = (
        MinHashDedup(threshold=options.dedup_threshold),
        Counter[str](),
        quota_caps(options.quotas, n),
    )
    step = batch * window
    for start in range(0, len(plan), step):
        drafts = [d for d in await asyncio.gather(*(one(c) for c in plan[start : start + step])) if d is not None]
        tops = index.search_many([d.question for d in drafts], k=1)
        drafts = [
            d
            for d, hits in zip(drafts, tops, strict=True)
            if not (hits and answer_in(chunks[hits[0].position].text, d.answer))
        ]
        for draft in await asyncio.gather(*(grounded(d) for d in drafts)):
            if draft is None or len(accepted) >= n or by_type[draft.type] >= caps.get(draft.type, n):
                continue
            if dedup.admit(draft.candidate_id, draft.question):
                continue
            by_type[draft.type] += 1
            truth = {"answers": [draft.answer], "doc_ids": draft.doc_ids}
            metadata = {"type": draft.type, "split": draft.split, "doc_ids": draft.doc_ids}
            accepted.append(
                Task(id=task_id(draft.candidate_id), prompt=draft.question, ground_truth=truth, metadata=metadata)
            )
        if len(accepted) >= n:
            break
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
    for split in fmt.SPLITS:
        rows = [t for t in accepted if t.metadata["split"] == split]
        (out / f"{split}.jsonl").write_bytes(fmt.to_jsonl(rows))
        (out / f"{split}.parquet").write_bytes(fmt.tasks_to_parquet(rows))
    await model.aclose()
    await judge.aclose()
    return len(accepted)


# -- gymflow: the workflow on a dev server and a worker process ---------------------------------


async def gymflow(
    client: Any, queue: str, corpus: Path, out: Path, *, n: int, options: GenerationOptions, batch: int, window: int
) -> tuple[int, dict[str, Any]]:
    from gymflow.activities.names import dataset_queue
    from gymflow.activities.schema import DatasetInput
    from gymflow.workflows.dataset import DatasetGenerationWorkflow

    input = DatasetInput(source=DatasetSource(kind="corpus", location=str(corpus)), n=n, out=str(out),
                         options=options, batch_size=batch, window=window)  # fmt: skip
    result = await client.execute_workflow(
        DatasetGenerationWorkflow.run, input, id=f"bench-ds-{uuid.uuid4().hex[:8]}", task_queue=dataset_queue(queue)
    )
    return result.accepted, {"rejected": result.rejected, "calls_made": result.calls_made}


def serve_model(port: int, delay_ms: float) -> None:
    """The scripted model (tests/dataset_support.py) as its own process."""
    import uvicorn

    sys.path.insert(0, str(ROOT / "tests"))
    from dataset_support import ScriptedModel

    uvicorn.run(ScriptedModel(delay_s=delay_ms / 1000).app(), host="127.0.0.1", port=port, log_level="warning")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from gymflow.workers.client import connect

    work = Path(tempfile.mkdtemp(prefix="bench-dataset-"))
    corpus = work / "corpus"
    write_sample_corpus(corpus, docs=args.docs, seed=0)
    procs = Procs()
    report: dict[str, Any] = {"docs": args.docs, "n": args.n, "repeats": args.repeats, "delay_ms": args.delay_ms,
                              "batch": args.batch, "window": args.window, "load_start": load(), "runs": []}  # fmt: skip
    try:
        address = await start_server(procs, work / "server", extra_args=[])
        port = free_port()
        procs.spawn(
            "model",
            [sys.executable, "-m", "bench.dataset", "--serve-model", str(port), "--delay-ms", str(args.delay_ms)],
            cwd=ROOT,
        )
        url = f"http://127.0.0.1:{port}/v1"
        queue = f"bench-ds-{uuid.uuid4().hex[:6]}"
        env = {**os.environ, "GYMFLOW_TEMPORAL_ADDRESS": address, "GYMFLOW_TASK_QUEUE": queue,
               "GYMFLOW_DATA_DIR": str(work / "data"), "GYMFLOW_WORKSPACE_ROOT": str(work / "ws")}  # fmt: skip
        procs.spawn(
            "worker",
            [sys.executable, "-m", "gymflow.workers.cli", "worker"],
            cwd=ROOT,
            env=env,
            log=work / "worker.log",
        )
        client = await connect(address)
        await asyncio.sleep(0)  # the worker polls by the time the first workflow task is scheduled
        for generator in ("offline", "model"):
            options = options_for(generator, url)
            # Warm-up, not measured: imports, the worker's first workflow, connection pools.
            await direct(
                corpus, work / f"warm-{generator}-d", n=20, options=options, batch=args.batch, window=args.window
            )
            await gymflow(client, queue, corpus, work / f"warm-{generator}-g", n=20, options=options,
                          batch=args.batch, window=args.window)  # fmt: skip
            for repeat in range(args.repeats):
                order = ("direct", "gymflow") if repeat % 2 == 0 else ("gymflow", "direct")
                for runner in order:
                    out = work / f"{generator}-{runner}-{repeat}"
                    with measured(procs) as record:
                        extra: dict[str, Any] = {}
                        if runner == "direct":
                            accepted = await direct(
                                corpus, out, n=args.n, options=options, batch=args.batch, window=args.window
                            )
                        else:
                            accepted, extra = await gymflow(
                                client,
                                queue,
                                corpus,
                                out,
                                n=args.n,
                                options=options,
                                batch=args.batch,
                                window=args.window,
                            )
                    record |= {
                        "generator": generator,
                        "runner": runner,
                        "repeat": repeat,
                        "accepted": accepted,
                        **extra,
                    }
                    record["items_per_s"] = round(accepted / float(record["wall_s"]), 2)  # type: ignore[arg-type]
                    print(json.dumps(record), flush=True)
                    report["runs"].append(record)
    finally:
        procs.stop_all()
    summary = {}
    for generator in ("offline", "model"):
        runs = [x for x in report["runs"] if x["generator"] == generator]
        rates = {
            r: statistics.median(x["items_per_s"] for x in runs if x["runner"] == r) for r in ("direct", "gymflow")
        }
        # CPU per accepted item, the model server's left out (the same work for both): what the
        # pipeline costs, which a loaded machine's scheduling does not blur as it does wall time.
        cpu = {
            r: statistics.median(
                1000 * sum(v for k, v in x["cpu_s"].items() if k != "model") / x["accepted"]
                for x in runs
                if x["runner"] == r
            )
            for r in ("direct", "gymflow")
        }
        summary[f"{generator}_cpu_ms_per_item"] = {k: round(v, 2) for k, v in cpu.items()}
        summary[generator] = {
            **rates,
            "ratio": round(rates["gymflow"] / rates["direct"], 3) if rates["direct"] else math.nan,
        }
    report["summary"] = summary
    report["load_end"] = load()
    return report


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    generators = [g for g in report["summary"] if not g.endswith("_per_item")]
    width = 0.38
    for i, runner in enumerate(("direct", "gymflow")):
        values = [report["summary"][g][runner] for g in generators]
        bars = ax.bar([x + (i - 0.5) * width for x in range(len(generators))], values, width, label=runner)
        ax.bar_label(bars, fmt="%.1f")
    ax.set_xticks(range(len(generators)), [f"{g}\n{report['summary'][g]['ratio']:.2f}x" for g in generators])
    ax.set_ylabel("accepted items / s")
    ax.set_title(f"dataset generation, {report['docs']}-document corpus, n={report['n']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=20.0, help="scripted model latency per reply")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--serve-model", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_model:
        serve_model(args.serve_model, args.delay_ms)
        return
    report = asyncio.run(run(args))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "dataset.json").write_text(json.dumps(report, indent=2))
    plot(report, OUT / "dataset.png")
    print(json.dumps(report["summary"], indent=2))


if __name__ == "__main__":
    main()
