"""Filters between a generated question and the dataset: guards, too-easy, near-duplicates, quotas.

* `guard`: deterministic checks of one draft — lengths, no reference to "the text" (a question
  must stand alone: the agent never sees the passage), the answer not given away by the
  question, and for extractive types the answer present in the source passages (normalised as
  SQuAD does, `gymflow.envs.rewards.text.normalize_answer`).
* `too_easy`: plain lexical retrieval (BM25, `gymflow.envs.datagen.index`) of the question over the whole
  corpus; when the top-1 passage already contains the answer, a search agent learns nothing from
  the question.
* `MinHashDedup`: near-duplicate questions, by MinHash over word 2-grams with LSH banding
  (16 bands x 4 rows: pairs over ~0.5 Jaccard become candidates, then the signature estimate must
  reach `threshold`). Hashes are blake2b of the shingles and a seeded universal family, never
  Python's salted `hash`, so the same questions give the same decisions in every process.
* `quota_caps`: the most items of each type a dataset of n may hold.

Three of them can be skipped (`FILTERS`, ``--skip-filter NAME``): too-easy, near-duplicates
(exact duplicates are still dropped) and quotas. The guards cannot: a question they reject is
malformed or not answerable from its sources, not merely easy or similar.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from pydantic import Field

from gymflow.envs.contract import Wire
from gymflow.envs.datagen.corpus import Rejection, reject
from gymflow.envs.datagen.generate import Draft
from gymflow.envs.rewards.group import word_ngrams
from gymflow.envs.rewards.text import normalize_answer

_SELF_REFERENCE_RE = re.compile(
    r"\b(according to (the|this) (text|passage|document|article|excerpt|context)|"
    r"(in|from) (the|this) (given |above )?(text|passage|document|excerpt|context)|"
    r"the (text|passage|document|excerpt) (says|states|mentions)|mentioned (above|in the text))\b",
    re.IGNORECASE,
)
EXTRACTIVE_TYPES = frozenset({"extractive", "cloze", "multi_hop", "comparison", "paraphrase"})

FilterName = Literal["too_easy", "dedup", "quota"]
FILTERS: dict[FilterName, str] = {
    "too_easy": "rejects questions whose answer is in the top-1 BM25 passage for the question",
    "dedup": "rejects near-duplicate questions (identical ones are dropped all the same)",
    "quota": "caps each question type at its share of the target",
}
"""The filters a run may skip, and what each does."""


class GuardConfig(Wire):
    """Limits of the deterministic guards."""

    min_question_words: int = Field(default=4, ge=1)
    max_question_chars: int = Field(default=400, ge=20)
    max_answer_words: int = Field(default=12, ge=1)
    max_answer_chars: int = Field(default=120, ge=1)


def guard(draft: Draft, sources: Sequence[str], config: GuardConfig) -> Rejection | None:
    """The first guard `draft` fails, or None.

    Args:
        draft: The generated question.
        sources: The text of its source passages.
        config: The limits.
    """
    question, answer = draft.question, draft.answer
    item = draft.candidate_id
    if len(question.split()) < config.min_question_words:
        return reject(item, "guard", "question_too_short", question[:200])
    if len(question) > config.max_question_chars:
        return reject(item, "guard", "question_too_long", f"{len(question)} chars")
    if len(answer.split()) > config.max_answer_words or len(answer) > config.max_answer_chars:
        return reject(item, "guard", "answer_too_long", answer[:200])
    if _SELF_REFERENCE_RE.search(question):
        return reject(item, "guard", "refers_to_text", question[:200])
    normal = normalize_answer(answer)
    if not normal:
        return reject(item, "guard", "empty_answer", answer[:200])
    if _contains(normalize_answer(question), normal):
        return reject(item, "guard", "answer_in_question", f"{answer!r} in {question[:200]!r}")
    if draft.type in EXTRACTIVE_TYPES and not any(_contains(normalize_answer(s), normal) for s in sources):
        return reject(item, "guard", "answer_not_in_source", answer[:200])
    return None


def _contains(text: str, phrase: str) -> bool:
    """Whether `phrase` occurs in `text` on word boundaries (both normalised)."""
    return f" {phrase} " in f" {text} "


def answer_in(text: str, answer: str) -> bool:
    """Whether the normalised `answer` occurs in the normalised `text`."""
    return _contains(normalize_answer(text), normalize_answer(answer))


class MinHashDedup:
    """Near-duplicate detection over the questions accepted so far.

    Args:
        threshold: Estimated Jaccard similarity (word 2-grams) from which a question duplicates one
            already accepted.
        seed: Seed of the hash family (fixed: signatures must agree across processes).
    """

    BANDS = 16
    ROWS = 4
    _PRIME = (1 << 31) - 1
    """Hashes and coefficients stay below 2^31, so ``a * x + b`` is exact in uint64."""

    def __init__(self, *, threshold: float = 0.8, seed: int = 1) -> None:
        self.threshold = threshold
        rng = np.random.default_rng(seed)
        perms = self.BANDS * self.ROWS
        self._a = rng.integers(1, self._PRIME, size=(perms, 1), dtype=np.uint64)
        self._b = rng.integers(0, self._PRIME, size=(perms, 1), dtype=np.uint64)
        self._buckets: dict[tuple[int, bytes], list[int]] = {}
        self._signatures: list[np.ndarray] = []
        self.ids: list[str] = []

    def signature(self, text: str) -> np.ndarray:
        """The MinHash signature of a question."""
        shingles = word_ngrams(normalize_answer(text), 2) or frozenset({("",)})
        digests = b"".join(hashlib.blake2b(" ".join(s).encode(), digest_size=4).digest() for s in shingles)
        values = np.frombuffer(digests, dtype="<u4").astype(np.uint64) % self._PRIME
        return np.asarray(((self._a * values + self._b) % self._PRIME).min(axis=1), dtype=np.uint32)

    def duplicate_of(self, text: str) -> tuple[str, float] | None:
        """(id, estimated similarity) of an accepted question `text` nearly duplicates, or None."""
        return self._match(self.signature(text))

    def admit(self, item_id: str, text: str) -> tuple[str, float] | None:
        """Remember `text` unless it nearly duplicates an accepted one; returns that one, or None."""
        signature = self.signature(text)
        duplicate = self._match(signature)
        if duplicate is None:
            self.add_signature(item_id, signature)
        return duplicate

    def _match(self, signature: np.ndarray) -> tuple[str, float] | None:
        seen: set[int] = set()
        best: tuple[str, float] | None = None
        for key in self._keys(signature):
            for index in self._buckets.get(key, ()):
                if index in seen:
                    continue
                seen.add(index)
                similarity = int(np.count_nonzero(self._signatures[index] == signature)) / signature.size
                if similarity >= self.threshold and (best is None or similarity > best[1]):
                    best = (self.ids[index], similarity)
        return best

    def add(self, item_id: str, text: str) -> None:
        """Remember an accepted question."""
        self.add_signature(item_id, self.signature(text))

    def add_signature(self, item_id: str, signature: np.ndarray) -> None:
        index = len(self.ids)
        self.ids.append(item_id)
        self._signatures.append(signature)
        for key in self._keys(signature):
            self._buckets.setdefault(key, []).append(index)

    def _keys(self, signature: np.ndarray) -> list[tuple[int, bytes]]:
        return [(band, signature[band * self.ROWS : (band + 1) * self.ROWS].tobytes()) for band in range(self.BANDS)]


def quota_caps(quotas: Mapping[str, float], n: int) -> dict[str, int]:
    """The most items of each type among `n` (``ceil(share * n)``); types not named: no cap."""
    return {kind: math.ceil(share * n) for kind, share in sorted(quotas.items())}
