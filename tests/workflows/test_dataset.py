"""DatasetGenerationWorkflow end to end on a real dev server: corpus (local and S3), traces and
env-generator sources, bad inputs as counted rejections, splits by source, HF `datasets` reads it."""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from pathlib import Path

import boto3
import datasets
import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from town_corpus import write_corpus

from gymflow.activities import names
from gymflow.activities.dataset_models import DatasetSource, GenerationOptions
from gymflow.activities.schema import DatasetInput, DatasetResult
from gymflow.envs.builtin.search.data import load_split, validate_task
from gymflow.envs.datagen import format as fmt
from gymflow.envs.datagen.filters import FilterName
from gymflow.envs.datagen.plan import assign_splits
from gymflow.workers.worker import RunningWorker, running_worker
from gymflow.workflows.dataset import DatasetGenerationWorkflow
from support import make_settings

SAMPLE = Path(__file__).parents[2] / "envs" / "builtin" / "search" / "sample_corpus"


async def run_dataset(client: Client, queue: str, input: DatasetInput, workflow_id: str | None = None) -> DatasetResult:
    return await client.execute_workflow(
        DatasetGenerationWorkflow.run,
        input,
        id=workflow_id or f"ds-{uuid.uuid4().hex[:8]}",
        task_queue=names.dataset_queue(queue),
    )


def corpus_input(location: str, out: str, n: int, **fields: object) -> DatasetInput:
    return DatasetInput(source=DatasetSource(kind="corpus", location=location), n=n, out=out, **fields)  # type: ignore[arg-type]


def rows(out: Path) -> dict[str, list[fmt.Task]]:
    return {split: fmt.tasks_from_jsonl((out / f"{split}.jsonl").read_bytes()) for split in fmt.SPLITS}


async def test_offline_corpus_dataset(client: Client, worker: RunningWorker, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    input = corpus_input(str(SAMPLE), str(out), 40, batch_size=16, window=2, max_batches_per_run=3)
    result = await run_dataset(client, worker.task_queue, input)
    assert result.accepted == 40 and result.target_met and result.env == "search"
    assert result.runs >= 1  # continued as new on the way
    manifest = fmt.Manifest.model_validate_json((out / "manifest.json").read_bytes())
    assert manifest.accepted == 40 and manifest.counts["accepted"] == 40
    assert manifest.counts["processed"] == manifest.counts["accepted"] + sum(manifest.rejections.values())
    assert len(manifest.source_digests) == 60 and manifest.corpus == "corpus.jsonl"
    split_rows = rows(out)
    assert sum(len(r) for r in split_rows.values()) == 40
    assert {s: len(r) for s, r in split_rows.items()} == {s: i.rows for s, i in manifest.splits.items()}
    # Split by source document: no document on both sides.
    docs = {split: {d for t in r for d in t.metadata["doc_ids"]} for split, r in split_rows.items()}
    assert docs["train"] and docs["eval"] and not docs["train"] & docs["eval"]
    # Every row is a search task whose answer is in its gold documents.
    corpus = {d["id"]: d["text"] for d in map(json.loads, (out / "corpus.jsonl").read_text().splitlines())}
    for task in split_rows["train"] + split_rows["eval"]:
        truth = validate_task(task)
        assert any(truth.answers[0] in corpus[d] for d in truth.doc_ids)
    assert len({t.id for r in split_rows.values() for t in r}) == 40
    # HF datasets reads the Parquet files; they hold the same rows.
    loaded = datasets.load_dataset(
        "parquet", data_files={s: str(out / p) for s, p in manifest.data_files.items()}, cache_dir=str(tmp_path / "hf")
    )
    assert {s: loaded[s].num_rows for s in fmt.SPLITS} == {s: len(r) for s, r in split_rows.items()}
    assert [fmt.task_from_record(r) for r in loaded["train"]] == split_rows["train"]
    assert load_split(out.as_uri(), "eval") == split_rows["eval"]
    # Every rejection kept, with its reason.
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert Counter(f"{r['stage']}/{r['reason']}" for r in rejected) == Counter(manifest.rejections)


async def test_same_seed_same_dataset_other_seed_other_split(
    client: Client, worker: RunningWorker, tmp_path: Path
) -> None:
    results = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        out = tmp_path / name
        await run_dataset(client, worker.task_queue, corpus_input(str(SAMPLE), str(out), 20, seed=seed, batch_size=32))
        results[name] = {s: [t.model_dump(exclude={"init_args"}) for t in r] for s, r in rows(out).items()}
    assert results["a"] == results["b"]
    assert results["a"] != results["c"]


async def test_bad_corpus_files_are_counted_rejections(client: Client, worker: RunningWorker, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in sorted(SAMPLE.rglob("*.md"))[:12]:
        (corpus / path.name).write_bytes(path.read_bytes())
    (corpus / "binary.md").write_bytes(bytes(range(256)) * 8)
    (corpus / "empty.txt").write_bytes(b"   \n\n")
    (corpus / "latin1.md").write_bytes("# Caf\xe9\n\nLe caf\xe9 de Mar\xeda est fameux depuis 1890.".encode("latin-1"))
    (corpus / "paper.pdf").write_bytes(b"%PDF-1.7\n%binary")
    (corpus / "image.png").write_bytes(b"\x89PNG\r\n")
    with (corpus / "huge.md").open("wb") as handle:  # 50 MB: rejected by its size, never read
        handle.truncate(50 * 1024 * 1024)
    out = tmp_path / "ds"
    result = await run_dataset(client, worker.task_queue, corpus_input(str(corpus), str(out), 5, batch_size=16))
    assert result.accepted >= 1
    scan = {k: v for k, v in result.rejections.items() if k.startswith("scan/")}
    assert scan == {
        "scan/binary": 1, "scan/empty": 1, "scan/not_utf8": 1, "scan/pdf_binary": 1,
        "scan/unsupported_type": 1, "scan/too_large": 1,
    }  # fmt: skip
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    by_item = {r["item"]: r["reason"] for r in rejected if r["stage"] == "scan"}
    assert by_item["huge.md"] == "too_large" and by_item["latin1.md"] == "not_utf8"
    assert "offset" in next(r["detail"] for r in rejected if r["item"] == "latin1.md")


async def test_a_corpus_with_no_usable_file_fails_with_invalid_input(
    client: Client, worker: RunningWorker, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "blob.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(WorkflowFailureError) as info:
        await run_dataset(client, worker.task_queue, corpus_input(str(corpus), str(tmp_path / "ds"), 5))
    cause = info.value.cause
    assert (
        isinstance(cause, ApplicationError) and cause.type == "InvalidInput" and "no usable document" in cause.message
    )


async def test_invalid_input_names_the_field(client: Client, worker: RunningWorker, tmp_path: Path) -> None:
    input = corpus_input(
        str(SAMPLE), str(tmp_path / "ds"), 5, options=GenerationOptions(chunk_tokens=32, overlap_tokens=32)
    )
    with pytest.raises(WorkflowFailureError) as info:
        await run_dataset(client, worker.task_queue, input)
    assert isinstance(info.value.cause, ApplicationError) and "options.overlap_tokens" in info.value.cause.message


async def test_skipped_filters_and_an_eval_split_that_would_be_empty(
    client: Client, worker: RunningWorker, tmp_path: Path
) -> None:
    corpus = tmp_path / "towns"
    facts = write_corpus(corpus, 10)
    # The one eval document (seed 0, a tenth of ten) has nothing to ask: every row comes from train
    # documents, and without the fill the eval split would be empty.
    splits = assign_splits([t.path for t in facts], seed=0, eval_fraction=0.1)
    [empty] = [doc for doc, split in splits.items() if split == "eval"]
    (corpus / empty).write_text("# Nowhere\n\nnothing is known about this place at all.\n")
    out = tmp_path / "ds"
    options = GenerationOptions(
        types=["extractive", "cloze"],
        eval_fraction=0.1,
        skip_filters=["too_easy", "quota", "dedup"],
        dedup_threshold=0.5,
    )
    result = await run_dataset(client, worker.task_queue, corpus_input(str(corpus), str(out), 40, options=options))
    assert result.accepted == 40 and result.target == 40
    assert not [k for k in result.rejections if k.startswith(("too_easy/", "quota/"))], result.rejections
    split_rows = rows(out)
    docs = {split: {d for t in r for d in t.metadata["doc_ids"]} for split, r in split_rows.items()}
    assert split_rows["train"] and split_rows["eval"] and not docs["train"] & docs["eval"] and empty not in docs["eval"]
    assert all(t.metadata["split"] == split for split, r in split_rows.items() for t in r)
    manifest = fmt.Manifest.model_validate_json((out / "manifest.json").read_bytes())
    assert manifest.moved_rows == len(split_rows["eval"]) and manifest.splits["eval"].groups == 1

    # A filter skipped is really skipped: with it on, its rejections are back (near-duplicates that
    # are not identical: identical questions are dropped either way).
    async def rejections(name: str, skip: list[FilterName]) -> list[dict[str, str]]:
        options = GenerationOptions(types=["extractive", "cloze"], eval_fraction=0.1, skip_filters=skip,
                                    dedup_threshold=0.5)  # fmt: skip
        await run_dataset(client, worker.task_queue, corpus_input(str(corpus), str(tmp_path / name), 40,
                                                                  options=options))  # fmt: skip
        return [json.loads(line) for line in (tmp_path / name / "rejected.jsonl").read_text().splitlines()]

    def similarities(rejected: list[dict[str, str]]) -> set[str]:
        return {r["detail"].split()[0] for r in rejected if r["reason"] == "near_duplicate"}

    skipped = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    deduplicated = await rejections("dedup", ["too_easy", "quota"])
    assert similarities(skipped) <= {"1.00"} and similarities(deduplicated) - {"1.00"}
    assert any(r["stage"] == "too_easy" for r in await rejections("all", []))


def trace_lines() -> list[str]:
    tools = [
        {"type": "function", "function": {"name": "lookup", "description": "find", "parameters": {"type": "object"}}}
    ]
    good = []
    for i in range(12):
        messages = [
            {"role": "system", "content": "You help customers."},
            {"role": "user", "content": f"Order {i}: where is it? Mail me at user{i}@example.com"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"order": i})}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"order {i}: shipped"},
            {"role": "assistant", "content": f"Order {i} has shipped; call +1 415 555 01{i:02d} for help."},
        ]  # fmt: skip
        good.append(json.dumps({"session_id": f"s{i % 6}", "messages": messages, "tools": tools}))
    broken = [
        "{not json",
        "[1, 2, 3]",
        json.dumps({"messages": []}),
        json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}),
        json.dumps({"messages": [{"role": "user", "content": "hello?"}]}),
    ]
    return good[:6] + broken + good[6:]


async def test_traces_to_training_rows(client: Client, worker: RunningWorker, tmp_path: Path) -> None:
    traces = tmp_path / "traces.jsonl"
    traces.write_text("\n".join(trace_lines()) + "\n")
    out = tmp_path / "ds"
    input = DatasetInput(source=DatasetSource(kind="traces", location=str(traces)), n=100, out=str(out), batch_size=8)
    result = await run_dataset(client, worker.task_queue, input)
    assert result.env == "traces" and not result.target_met  # the file is exhausted first
    # Two assistant turns per good line; the near-identical ones (only the order number differs
    # once redacted) are near-duplicates.
    assert result.accepted + result.rejections.get("dedup/near_duplicate", 0) == 24 and result.accepted >= 12
    scan = {k: v for k, v in result.rejections.items() if k.startswith("scan/")}
    assert scan == {"scan/not_json": 1, "scan/not_an_object": 1, "scan/no_messages": 1, "scan/bad_messages": 1,
                    "scan/no_assistant_turn": 1}  # fmt: skip
    split_rows = rows(out)
    sessions = {s: {t.metadata["session"] for t in r} for s, r in split_rows.items()}
    assert sessions["train"] and sessions["eval"] and not sessions["train"] & sessions["eval"]
    task = next(t for t in split_rows["train"] if t.metadata["turn"] == 1)
    assert isinstance(task.prompt, list) and [m.role for m in task.prompt] == ["system", "user", "assistant", "tool"]
    assert task.metadata["tools"][0]["function"]["name"] == "lookup"
    text = json.dumps([t.model_dump(mode="json") for r in split_rows.values() for t in r])
    assert "@example.com" not in text and "555 01" not in text and "[EMAIL]" in text and "[PHONE]" in text


async def test_env_generator_source(client: Client, worker: RunningWorker, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    input = DatasetInput(source=DatasetSource(kind="env", location="math"), n=30, out=str(out), batch_size=8, seed=5)
    result = await run_dataset(client, worker.task_queue, input)
    assert result.env == "math" and result.accepted == 30
    split_rows = rows(out)
    ids = [t.id for r in split_rows.values() for t in r]
    assert len(ids) == len(set(ids)) == 30 and all(t.ground_truth is not None for t in split_rows["train"])


async def test_s3_corpus_to_s3_dataset(
    client: Client, tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": s3_endpoint}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="corpus")
    s3.create_bucket(Bucket="data")
    for path in sorted(SAMPLE.rglob("*")):
        if path.is_file():
            s3.put_object(Bucket="corpus", Key=f"wiki/{path.relative_to(SAMPLE).as_posix()}", Body=path.read_bytes())
    s3.put_object(Bucket="corpus", Key="wiki/broken.md", Body=b"\xff\xfe\x00\x01")
    settings = make_settings(tmp_path, s3_endpoint_url=s3_endpoint)
    async with running_worker(client, settings):
        result = await run_dataset(
            client, settings.task_queue, corpus_input("s3://corpus/wiki", "s3://data/sets/wiki-qa", 20, batch_size=32)
        )
    assert result.uri == "s3://data/sets/wiki-qa" and result.accepted == 20
    assert result.rejections["scan/binary"] == 1
    manifest = fmt.Manifest.model_validate_json(
        s3.get_object(Bucket="data", Key="sets/wiki-qa/manifest.json")["Body"].read()
    )
    assert manifest.accepted == 20 and len(manifest.source_digests) == 60
    eval_rows = load_split("s3://data/sets/wiki-qa", "eval")  # the search env reads it from S3
    assert eval_rows and all(t.init_args["corpus"] == "s3://data/sets/wiki-qa/corpus.jsonl" for t in eval_rows)
    assert os.environ["AWS_ENDPOINT_URL"] == s3_endpoint


async def test_search_attributes_progress_and_raw_input(client: Client, worker: RunningWorker, tmp_path: Path) -> None:
    workflow_id = f"ds-sa-{uuid.uuid4().hex[:8]}"
    await run_dataset(client, worker.task_queue, corpus_input(str(SAMPLE), str(tmp_path / "ds"), 8), workflow_id)
    handle = client.get_workflow_handle(workflow_id)
    attributes = (await handle.describe()).typed_search_attributes
    assert attributes.get(names.SA_ENV) == "search" and attributes.get(names.SA_STATUS) == "completed"
    assert attributes.get(names.SA_RUN) == workflow_id
    progress = await handle.query(DatasetGenerationWorkflow.progress)
    assert (
        progress["stage"] == "done"
        and progress["accepted"] == 8
        and progress["rejected"] == sum(progress["rejections"].values())
    )
    # Input as `temporal workflow start --input` would send it: a missing field fails at once, named.
    with pytest.raises(WorkflowFailureError) as info:
        await client.execute_workflow(
            names.DATASET_WORKFLOW,
            {"n": 5},
            id=f"ds-raw-{uuid.uuid4().hex[:8]}",
            task_queue=names.dataset_queue(worker.task_queue),
        )
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput" and "source" in cause.message
