"""The dataset boundary: sources in, candidates generated and filtered, a dataset written to storage.

Four activities, each over many items (DESIGN: never one activity per item):

* `scan_dataset_source` reads the whole source once — corpus files (or an S3 prefix), a trace
  file, an env's generator — rejects what cannot be used (with reasons), assigns splits by
  source group, chunks documents and writes the plan of candidates to storage.
* `generate_dataset_batch` turns one slice of the plan into drafts (offline, or model calls
  through `gymflow.activities.dataset_calls`, recorded so no completed call is made twice) and runs the
  per-item filters: guards, too-easy retrieval, the grounding judge. It writes a batch file.
* `merge_dataset_batch` applies what spans batches, in batch order: the target, per-type quotas
  and near-duplicate removal (MinHash over everything accepted so far).
* `finalize_dataset` writes the splits (JSONL + Parquet), the corpus, every rejection and the
  manifest (`gymflow.envs.datagen.format`).

Every output is keyed by the workflow id (``<out>/work/<id>/...``) and batch index and is a pure
function of the inputs and the recorded model replies, so a retried activity rewrites the same
bytes: a crash anywhere loses nothing and duplicates nothing. The merge keeps its dedup state in
memory between batches of a run and rebuilds it from the accepted files of the earlier batches
when another worker (or a restarted one) takes over.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from typing import Any

from temporalio import activity

from gymflow.activities import errors
from gymflow.activities.dataset_calls import CallFailed, CallStore, endpoints
from gymflow.activities.dataset_finalize import write_dataset
from gymflow.activities.dataset_models import (
    BatchInput,
    BatchRecord,
    BatchSummary,
    FinalizeInput,
    FinalizeResult,
    MergeInput,
    MergeSummary,
    ScanInput,
    ScanResult,
    work_prefix,
)
from gymflow.activities.dataset_scan import scan
from gymflow.activities.heartbeat import with_heartbeats
from gymflow.activities.storage import Store, open_store
from gymflow.envs.contract import Task
from gymflow.envs.datagen import format as fmt
from gymflow.envs.datagen.corpus import Chunk, Rejection, reject
from gymflow.envs.datagen.filters import MinHashDedup, answer_in, guard
from gymflow.envs.datagen.generate import (
    Candidate,
    Draft,
    generation_messages,
    json_object,
    judge_messages,
    offline_draft,
    parse_generation,
    parse_judge,
)
from gymflow.envs.datagen.index import Bm25Index
from gymflow.envs.datagen.plan import task_id
from gymflow.envs.datagen.text import CorpusContext
from gymflow.envs.datagen.traces import TraceTurn, dedup_text, label_messages, load_redactor, turn_task
from gymflow.envs.errors import StorageError

_CACHED_RUNS = 8


class DatasetActivities:
    """Activities of `DatasetGenerationWorkflow` (`gymflow.workflows.dataset`).

    Args:
        default_uri: Store of datasets whose input names no `out`.
        s3_endpoint_url: S3 API endpoint for non-AWS stores (MinIO, moto).
        default_model_url: Generation endpoint when the options name none.
        default_judge_url: Judge endpoint when the options name none.
        model_api_key: Worker configuration, never input.
        judge_api_key: Worker configuration, never input.
    """

    def __init__(
        self,
        *,
        default_uri: str,
        s3_endpoint_url: str | None = None,
        default_model_url: str | None = None,
        default_judge_url: str | None = None,
        model_api_key: str | None = None,
        judge_api_key: str | None = None,
    ) -> None:
        self.default_uri = default_uri
        self.s3_endpoint_url = s3_endpoint_url
        self.default_model_url = default_model_url
        self.default_judge_url = default_judge_url
        self._model, self._judge = endpoints(model_api_key=model_api_key, judge_api_key=judge_api_key)
        self._corpora: OrderedDict[str, tuple[dict[str, Chunk], list[Chunk], Bm25Index, CorpusContext]] = OrderedDict()
        self._dedup: OrderedDict[tuple[str, int], MinHashDedup] = OrderedDict()
        self._plans: OrderedDict[str, list[bytes]] = OrderedDict()

    async def aclose(self) -> None:
        await self._model.aclose()
        await self._judge.aclose()

    def store(self, out: str) -> Store:
        try:
            return open_store(out, s3_endpoint_url=self.s3_endpoint_url)
        except StorageError as exc:
            raise errors.non_retryable(str(exc), type=errors.INVALID_INPUT) from exc

    async def _get(self, store: Store, uri: str) -> bytes:
        try:
            return await store.get(uri)
        except StorageError as exc:  # a file an earlier step wrote is gone: retrying may find it
            raise errors.retryable(str(exc), type=errors.STORAGE_ERROR) from exc

    # -- scan ---------------------------------------------------------------------------------
    @activity.defn(name="scan_dataset_source")
    async def scan_dataset_source(self, input: ScanInput) -> ScanResult:
        """Read and check the source, assign splits, write the plan (see the module docstring)."""
        out = input.out or fmt.join(self.default_uri, work_prefix(input.workflow_id).replace("work/", "datasets/", 1))
        return await with_heartbeats(scan(input, self.store(out), out, s3_endpoint_url=self.s3_endpoint_url))

    # -- generate -----------------------------------------------------------------------------
    @activity.defn(name="generate_dataset_batch")
    async def generate_dataset_batch(self, input: BatchInput) -> BatchSummary:
        """Generate and filter one slice of the plan; write its batch file."""
        store = self.store(input.out)
        info = activity.info()
        calls = CallStore(
            store,
            f"{work_prefix(input.workflow_id)}/calls",
            model=self._model,
            judge=self._judge,
            default_model_url=self.default_model_url,
            default_judge_url=self.default_judge_url,
            final_attempt=info.attempt >= input.options.call_attempts,
            retried=info.attempt > 1,
            limit=input.options.concurrency,
        )
        plan = (await self._plan(store, input.plan_uri))[input.offset : input.offset + input.limit]
        if input.kind == "corpus":
            records = await with_heartbeats(self._corpus_batch(input, store, plan, calls))
        elif input.kind == "traces":
            records = await with_heartbeats(_trace_batch(input, plan, calls))
        else:
            records = [_env_record(Task.model_validate_json(line)) for line in plan]
        if calls.pending_error is not None:  # recorded what completed; Temporal retries the rest
            raise calls.pending_error
        key = f"{work_prefix(input.workflow_id)}/batch-{input.index:06d}.jsonl"
        uri = await store.put(key, b"".join(r.model_dump_json().encode() + b"\n" for r in records))
        return BatchSummary(
            index=input.index,
            uri=uri,
            candidates=len(records),
            passed=sum(r.task is not None for r in records),
            calls_made=calls.made,
            calls_reused=calls.reused,
        )

    async def _plan(self, store: Store, uri: str) -> list[bytes]:
        if uri not in self._plans:
            self._plans[uri] = (await self._get(store, uri)).splitlines()
            while len(self._plans) > 2:
                self._plans.popitem(last=False)
        return self._plans[uri]

    async def _corpus(self, store: Store, uri: str) -> tuple[dict[str, Chunk], list[Chunk], Bm25Index, CorpusContext]:
        if uri not in self._corpora:
            chunks = [Chunk.model_validate_json(line) for line in (await self._get(store, uri)).splitlines()]
            index = await asyncio.to_thread(Bm25Index, [c.text for c in chunks])
            context = await asyncio.to_thread(CorpusContext, chunks)
            self._corpora[uri] = ({c.id: c for c in chunks}, chunks, index, context)
            while len(self._corpora) > 2:
                self._corpora.popitem(last=False)
        return self._corpora[uri]

    async def _corpus_batch(
        self, input: BatchInput, store: Store, plan: list[bytes], calls: CallStore
    ) -> list[BatchRecord]:
        by_id, chunks, index, context = await self._corpus(store, input.chunks_uri or "")
        options = input.options
        candidates = [Candidate.model_validate_json(line) for line in plan]
        sources = [[by_id[i] for i in c.chunk_ids] for c in candidates]

        async def draft(candidate: Candidate, passages: list[Chunk]) -> Draft | Rejection:
            if options.generator == "offline":
                return offline_draft(candidate, passages, context)
            try:
                text, model = await calls.complete(
                    "generate", candidate.id, options.model, generation_messages(candidate, passages), role="model"
                )
            except CallFailed as exc:
                return reject(candidate.id, "generate", exc.reason, exc.detail)
            return parse_generation(candidate, text, model=model)

        drafts = await asyncio.gather(*(draft(c, s) for c, s in zip(candidates, sources, strict=True)))
        outcomes: list[Draft | Rejection] = []
        for item, passages in zip(drafts, sources, strict=True):
            failed = guard(item, [p.text for p in passages], options.guards) if isinstance(item, Draft) else None
            outcomes.append(failed or item)
        if options.applies("too_easy"):
            outcomes = await asyncio.to_thread(_too_easy, outcomes, chunks, index)
        if options.judge is not None:
            outcomes = list(
                await asyncio.gather(
                    *(self._grounded(o, s, options.judge, calls) for o, s in zip(outcomes, sources, strict=True))
                )
            )
        return [_corpus_record(c, o) for c, o in zip(candidates, outcomes, strict=True)]

    async def _grounded(
        self, item: Draft | Rejection, passages: list[Chunk], judge: Any, calls: CallStore
    ) -> Draft | Rejection:
        if not isinstance(item, Draft):
            return item
        try:
            text, _ = await calls.complete(
                "judge", item.candidate_id, judge, judge_messages(item, passages), role="judge"
            )
        except CallFailed as exc:  # a failed judge call is not a verdict: never "unsupported"
            return reject(item.candidate_id, "judge", exc.reason, exc.detail)
        verdict = parse_judge(text)
        if verdict is None:
            return reject(item.candidate_id, "judge", "judge_unparseable", " ".join(text.split())[:200])
        if not verdict:
            return reject(item.candidate_id, "judge", "not_grounded", (json_object(text) or {}).get("reason", "")[:200])
        return item

    # -- merge --------------------------------------------------------------------------------
    @activity.defn(name="merge_dataset_batch")
    async def merge_dataset_batch(self, input: MergeInput) -> MergeSummary:
        """Target, quotas and near-duplicates for one batch, in batch order."""
        store = self.store(input.out)
        prefix = work_prefix(input.workflow_id)
        dedup = self._dedup.pop((input.workflow_id, input.index), None)
        if dedup is None:
            dedup = await self._rebuild_dedup(store, prefix, input.index, input.dedup_threshold)
        if input.batch_uri is not None:
            records = [
                BatchRecord.model_validate_json(line) for line in (await self._get(store, input.batch_uri)).splitlines()
            ]
        else:
            records = [
                BatchRecord(candidate=f"batch-{input.index}/{i}", type="", rejection=reject(
                    f"batch-{input.index}/{i}", "batch", "batch_failed", input.failed[:300]))
                for i in range(input.failed_candidates)
            ]  # fmt: skip
        accepted: list[BatchRecord] = []
        rejected: list[Rejection] = []
        by_type = Counter(input.accepted_by_type)
        for record in records:
            rejection = record.rejection
            if rejection is None:
                rejection = _merge_check(record, input, len(accepted), by_type, dedup)
            if rejection is not None:
                rejected.append(rejection)
                continue
            by_type[record.type] += 1
            accepted.append(record)
        await store.put(f"{prefix}/accepted-{input.index:06d}.jsonl", fmt.to_jsonl(accepted))
        await store.put(f"{prefix}/rejected-{input.index:06d}.jsonl", fmt.to_jsonl(rejected))
        self._dedup[(input.workflow_id, input.index + 1)] = dedup
        while len(self._dedup) > _CACHED_RUNS:
            self._dedup.popitem(last=False)
        return MergeSummary(
            index=input.index,
            accepted=len(accepted),
            by_type=dict(Counter(r.type for r in accepted)),
            candidates=len(records),
            rejections=dict(Counter(f"{r.stage}/{r.reason}" for r in rejected)),
        )

    async def _rebuild_dedup(self, store: Store, prefix: str, index: int, threshold: float) -> MinHashDedup:
        dedup = MinHashDedup(threshold=threshold)
        for earlier in range(index):
            data = await self._get(store, store.uri(f"{prefix}/accepted-{earlier:06d}.jsonl"))
            for line in data.splitlines():
                record = BatchRecord.model_validate_json(line)
                if record.task is not None:
                    dedup.add(record.task.id, record.dedup)
        return dedup

    # -- finalize -----------------------------------------------------------------------------
    @activity.defn(name="finalize_dataset")
    async def finalize_dataset(self, input: FinalizeInput) -> FinalizeResult:
        """Write the splits, the corpus, the rejections and the manifest."""
        store = self.store(input.out)
        return await with_heartbeats(write_dataset(input, store, read=lambda uri: self._get(store, uri)))


def _too_easy(outcomes: list[Draft | Rejection], chunks: list[Chunk], index: Bm25Index) -> list[Draft | Rejection]:
    drafts = [o for o in outcomes if isinstance(o, Draft)]
    tops = dict(
        zip((d.candidate_id for d in drafts), index.search_many([d.question for d in drafts], k=1), strict=True)
    )
    out: list[Draft | Rejection] = []
    for item in outcomes:
        hits = tops.get(item.candidate_id if isinstance(item, Draft) else "", [])
        if isinstance(item, Draft) and hits and answer_in(chunks[hits[0].position].text, item.answer):
            out.append(reject(item.candidate_id, "too_easy", "answer_in_top1", chunks[hits[0].position].id))
        else:
            out.append(item)
    return out


def _corpus_record(candidate: Candidate, outcome: Draft | Rejection) -> BatchRecord:
    if isinstance(outcome, Rejection):
        return BatchRecord(candidate=candidate.id, type=candidate.type, rejection=outcome)
    task = Task(
        id=task_id(candidate.id),
        prompt=outcome.question,
        ground_truth={"answers": [outcome.answer], "doc_ids": outcome.doc_ids},
        metadata={
            "type": outcome.type,
            "split": outcome.split,
            "doc_ids": outcome.doc_ids,
            "chunk_ids": outcome.chunk_ids,
            "generator": outcome.generator,
            "candidate": candidate.id,
        },
    )
    return BatchRecord(candidate=candidate.id, type=candidate.type, task=task, dedup=outcome.question)


async def _trace_batch(input: BatchInput, plan: list[bytes], calls: CallStore) -> list[BatchRecord]:
    try:
        redact = load_redactor(input.options.redact)
    except (ValueError, TypeError) as exc:
        raise errors.non_retryable(str(exc), type=errors.INVALID_INPUT) from exc
    judge = input.options.judge

    async def one(line: bytes) -> BatchRecord:
        turn = TraceTurn.model_validate_json(line)
        task = turn_task(turn, redact, source=input.plan_uri)
        reference = task.ground_truth["reference"]
        if not reference.get("content", "").strip() and not reference.get("tool_calls"):
            return BatchRecord(
                candidate=turn.id, type="assistant_turn", rejection=reject(turn.id, "guard", "empty_reference")
            )
        if judge is not None:
            try:
                text, _ = await calls.complete("label", turn.id, judge, label_messages(task), role="judge")
            except CallFailed as exc:
                return BatchRecord(
                    candidate=turn.id, type="assistant_turn", rejection=reject(turn.id, "judge", exc.reason, exc.detail)
                )
            score = (json_object(text) or {}).get("score")
            if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
                unusable = reject(turn.id, "judge", "judge_unparseable", " ".join(text.split())[:200])
                return BatchRecord(candidate=turn.id, type="assistant_turn", rejection=unusable)
            task.metadata["reward_label"] = float(score)
        return BatchRecord(candidate=turn.id, type="assistant_turn", task=task, dedup=dedup_text(task))

    return list(await asyncio.gather(*(one(line) for line in plan)))


def _env_record(task: Task) -> BatchRecord:
    prompt = task.prompt if isinstance(task.prompt, str) else "\n".join(m.content for m in task.prompt)
    return BatchRecord(candidate=task.id, type=str(task.metadata.get("type", "task")), task=task, dedup=prompt)


def _merge_check(
    record: BatchRecord, input: MergeInput, new: int, by_type: Counter[str], dedup: MinHashDedup
) -> Rejection | None:
    if input.accepted + new >= input.target:
        return reject(record.candidate, "target", "over_target", f"target {input.target} reached")
    cap = input.caps.get(record.type)
    if cap is not None and by_type[record.type] >= cap:
        return reject(record.candidate, "quota", f"quota_{record.type}", f"cap {cap}")
    duplicate = dedup.admit(record.task.id if record.task else record.candidate, record.dedup)  # remembered if new
    if duplicate is not None:
        return reject(record.candidate, "dedup", "near_duplicate", f"{duplicate[1]:.2f} similar to {duplicate[0]}")
    return None
