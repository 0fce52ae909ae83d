"""Inputs and results of the dataset activities, and the generation options they share.

Kept apart from the activities so the workflow side (`gymflow.activities.schema`, the sandbox) imports
plain models only.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from pydantic import Field, field_validator

from gymflow.activities.model import ModelConfig
from gymflow.envs.contract import Task, Wire
from gymflow.envs.datagen.corpus import DEFAULT_MAX_BYTES, Rejection
from gymflow.envs.datagen.filters import FilterName, GuardConfig
from gymflow.envs.datagen.generate import QUESTION_TYPES, QuestionType

SourceKind = Literal["corpus", "traces", "env"]
DEFAULT_ENV = {"corpus": "search", "traces": "traces"}
"""The env a source's rows are for, unless the input names one (env sources: the env itself)."""


class DatasetSource(Wire):
    """Where the items come from."""

    kind: SourceKind
    location: str = Field(min_length=1, max_length=4096)
    """corpus: a directory, file:///dir or s3://bucket/prefix; traces: a JSONL path or s3:// URI;
    env: a registered env name with a task generator (`load_dataset("generated")`)."""

    @classmethod
    def parse(cls, text: str) -> DatasetSource:
        """``corpus:DIR``, ``traces:FILE`` or ``env:NAME`` (the CLI's --source)."""
        kind, sep, location = text.partition(":")
        if not sep or kind not in ("corpus", "traces", "env"):
            raise ValueError(f"--source must be corpus:DIR, traces:FILE or env:NAME, not {text!r}")
        return cls.model_validate({"kind": kind, "location": location})


class GenerationOptions(Wire):
    """How candidates are made and filtered."""

    generator: Literal["offline", "model"] = "offline"
    """``offline``: extractive / cloze / bridge questions without a model; ``model``: an
    OpenAI-compatible model writes them (`model`)."""
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(temperature=0.7, max_tokens=512))
    """Generation endpoint (base_url None: the worker's GYMFLOW_MODEL_URL)."""
    judge: ModelConfig | None = None
    """Grounding judge for corpus questions, reward labeller for trace rows; None: no judge
    (base_url None: the worker's GYMFLOW_JUDGE_URL)."""
    types: list[QuestionType] = Field(default_factory=lambda: list(QUESTION_TYPES), min_length=1)
    """Question types to plan (corpus sources)."""
    quotas: dict[str, float] = Field(default_factory=lambda: {"extractive": 0.4, "cloze": 0.3, "multi_hop": 1.0})
    """Largest share of the target each type may take (types not named: no cap)."""
    variants: int = Field(default=2, ge=1, le=16)
    """Candidates per passage and type."""
    chunk_tokens: int = Field(default=200, ge=16, le=8192)
    overlap_tokens: int = Field(default=40, ge=0, le=4096)
    max_file_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=1, le=1 << 34)
    """Corpus files larger than this are rejected unread."""
    guards: GuardConfig = Field(default_factory=GuardConfig)
    too_easy: bool = True
    """Reject questions whose answer is in the top-1 BM25 passage for the question (also off when
    `skip_filters` names ``too_easy``)."""
    skip_filters: list[FilterName] = Field(default_factory=list)
    """Filters not applied (`gymflow.envs.datagen.filters.FILTERS`): ``too_easy``, ``dedup`` (near-duplicates;
    exact duplicates are still dropped), ``quota`` (the per-type caps of `quotas`)."""
    dedup_threshold: float = Field(default=0.8, gt=0, le=1)
    """Estimated Jaccard similarity (word 2-grams) from which a question is a near-duplicate."""
    eval_fraction: float = Field(default=0.2, ge=0, lt=1)
    """Share of source groups (documents, sessions, tasks) in the eval split."""
    redact: str | None = "builtin"
    """Trace redaction hook: ``builtin``, ``none`` or ``module:function`` (importable on workers)."""
    call_attempts: int = Field(default=3, ge=1, le=20)
    """Attempts of a batch's model calls (a batch activity's attempts): retryable failures are
    retried this often, then become the candidate's rejection."""
    concurrency: int = Field(default=16, ge=1, le=512)
    """Model calls in flight per batch."""
    heartbeat_s: float = Field(default=30.0, ge=1, le=3600)
    """Heartbeat timeout of the batch activities: how soon a dead worker's batch moves on."""

    def applies(self, name: FilterName) -> bool:
        """Whether the filter `name` runs."""
        return name not in self.skip_filters and (name != "too_easy" or self.too_easy)

    @field_validator("quotas")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not 0 <= v <= 1}
        if bad:
            raise ValueError(f"quota shares must be within [0, 1], got {bad}")
        return value


def work_prefix(workflow_id: str) -> str:
    """``work/<id>``: where one run keeps its intermediate files (a storage-safe name)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", workflow_id)[:80].strip("._") or "run"
    return f"work/{safe}-{hashlib.sha256(workflow_id.encode()).hexdigest()[:8]}"


class ScanInput(Wire):
    workflow_id: str
    source: DatasetSource
    out: str | None
    """Dataset URI; None: the worker's store, under datasets/<workflow id>."""
    seed: int
    n: int
    options: GenerationOptions


class ScanResult(Wire):
    """What the source holds, as planned candidates in storage."""

    out: str
    """The dataset URI every later step writes under."""
    plan_uri: str
    plan_size: int
    chunks_uri: str | None = None
    corpus_uri: str | None = None
    digests_uri: str
    rejected_uri: str
    groups: dict[str, int]
    """Source groups per split."""
    rejections: dict[str, int]
    """``scan/reason`` -> count."""
    items: int
    """Documents (or trace lines, or generated tasks) read."""


class BatchInput(Wire):
    workflow_id: str
    out: str
    kind: SourceKind
    index: int
    offset: int
    limit: int
    plan_uri: str
    chunks_uri: str | None
    options: GenerationOptions


class BatchSummary(Wire):
    index: int
    uri: str
    candidates: int
    passed: int
    calls_made: int
    calls_reused: int


class BatchRecord(Wire):
    """One candidate's outcome in a batch file: a task waiting for the merge, or a rejection."""

    candidate: str
    type: str
    task: Task | None = None
    dedup: str = ""
    """The text near-duplicate detection compares."""
    rejection: Rejection | None = None


class MergeInput(Wire):
    workflow_id: str
    out: str
    index: int
    batch_uri: str | None
    """None: the batch failed for good (`failed` says why); its candidates are rejected."""
    failed: str = ""
    failed_candidates: int = 0
    target: int
    accepted: int
    """Accepted before this batch."""
    accepted_by_type: dict[str, int]
    caps: dict[str, int]
    dedup_threshold: float


class MergeSummary(Wire):
    index: int
    accepted: int
    """Accepted from this batch."""
    by_type: dict[str, int]
    candidates: int
    rejections: dict[str, int]


class FinalizeInput(Wire):
    workflow_id: str
    out: str
    env: str
    merged: int
    """Merged batches: their accepted files are the dataset."""
    source: DatasetSource
    config: dict[str, object]
    seed: int
    target: int
    scan: ScanResult
    counts: dict[str, int]
    rejections: dict[str, int]
    accepted_by_type: dict[str, int]
    created_at: str
    eval_fraction: float = 0.0
    """Share of source groups in eval: when > 0 and one split has no row, rows move (`fill_empty_split`)."""


class FinalizeResult(Wire):
    uri: str
    manifest_uri: str
    splits: dict[str, int]
