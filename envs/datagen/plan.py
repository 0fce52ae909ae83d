"""What to generate, in what order, and which split it lands in.

* Splits are by source group (a document, a trace session, an env task): groups are ranked by
  ``sha256(seed:group)`` and the first ``round(eval_fraction * groups)`` go to ``eval``. A
  candidate's sources all come from one split (a multi-hop partner is looked for in its anchor's
  split only), so no source document is ever on both sides.
* Multi-hop partners: passage A is related to the passages of document B when A names B's title
  (an entity with an article of its own: the bridge a two-hop question walks); a corpus without
  such links falls back to the passage of another document that BM25 finds most similar to A.
* The plan interleaves the types round-robin over a seeded shuffle of each type's candidates, so
  any prefix of it (what a run that stops at its target used) is a mix of types and documents.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence

from envs.datagen.corpus import Chunk, Document
from envs.datagen.generate import _NAME_RE, Candidate, QuestionType
from envs.datagen.index import Bm25Index

MAX_PARTNERS = 3
"""Partner passages per anchor passage at most."""
_LEAD_RE = re.compile(r"^(The|A|An)\s+")


def assign_splits(groups: Sequence[str], *, seed: int, eval_fraction: float) -> dict[str, str]:
    """``train`` or ``eval`` for each source group (see the module docstring)."""
    ranked = sorted(set(groups), key=lambda g: hashlib.sha256(f"{seed}:{g}".encode()).hexdigest())
    n_eval = round(eval_fraction * len(ranked))
    if eval_fraction > 0 and len(ranked) >= 2:
        n_eval = min(max(n_eval, 1), len(ranked) - 1)
    return {group: "eval" if i < n_eval else "train" for i, group in enumerate(ranked)}


def _key(name: str) -> str:
    return _LEAD_RE.sub("", name).casefold()


def partners(chunks: Sequence[Chunk], docs: Sequence[Document], *, seed: int) -> dict[str, list[str]]:
    """Chunk id -> ids of related passages of other documents in the same split."""
    by_title: dict[str, str] = {}
    for doc in docs:
        by_title.setdefault(_key(doc.title), doc.id)
    by_doc: dict[str, list[Chunk]] = {}
    for chunk in chunks:
        by_doc.setdefault(chunk.doc_id, []).append(chunk)
    related: dict[str, list[str]] = {}
    unlinked: list[Chunk] = []
    for chunk in chunks:
        found: list[str] = []
        for match in _NAME_RE.finditer(chunk.text):
            doc_id = by_title.get(_key(match.group(0)))
            if doc_id is None or doc_id == chunk.doc_id:
                continue
            for other in by_doc.get(doc_id, []):
                if other.split == chunk.split and other.id not in found:
                    found.append(other.id)
        rng = random.Random(f"{seed}:partners:{chunk.id}")
        rng.shuffle(found)
        related[chunk.id] = found[:MAX_PARTNERS]
        if not found:
            unlinked.append(chunk)
    if unlinked:
        index = Bm25Index([c.text for c in chunks])
        for chunk, hits in zip(unlinked, index.search_many([c.text for c in unlinked], k=8), strict=True):
            for hit in hits:
                other = chunks[hit.position]
                if other.doc_id != chunk.doc_id and other.split == chunk.split:
                    related[chunk.id] = [other.id]
                    break
    return related


def corpus_plan(
    chunks: Sequence[Chunk],
    related: dict[str, list[str]],
    *,
    types: Sequence[QuestionType],
    variants: int,
    seed: int,
) -> list[Candidate]:
    """Every candidate of a corpus, interleaved by type (see the module docstring)."""
    by_id = {chunk.id: chunk for chunk in chunks}
    per_type: dict[str, list[Candidate]] = {kind: [] for kind in types}
    for chunk in chunks:
        for kind in types:
            sources = [[chunk.id]] if kind != "multi_hop" else [[chunk.id, p] for p in related.get(chunk.id, [])]
            for ids in sources:
                for variant in range(variants):
                    per_type[kind].append(
                        Candidate(
                            id=f"{kind}:{'+'.join(ids)}:v{variant}",
                            type=kind,
                            chunk_ids=ids,
                            doc_ids=list(dict.fromkeys(by_id[i].doc_id for i in ids)),
                            split=chunk.split,
                            variant=variant,
                        )
                    )
    for name, items in per_type.items():
        random.Random(f"{seed}:plan:{name}").shuffle(items)
    plan: list[Candidate] = []
    for i in range(max((len(v) for v in per_type.values()), default=0)):
        plan += [per_type[kind][i] for kind in types if i < len(per_type[kind])]
    return plan


def task_id(candidate_id: str) -> str:
    """The dataset id of an accepted candidate: short, stable, unique per candidate."""
    return "q-" + hashlib.sha256(candidate_id.encode()).hexdigest()[:16]
