"""What to generate, in what order, and which split it lands in.

* Splits are by source group (a document, a trace session, an env task): groups are ranked by
  ``sha256(seed:group)`` and the first ``round(eval_fraction * groups)`` go to ``eval``. A
  candidate's sources all come from one split, so no source document is ever on both sides.
* Partners of the two-passage types, always in the anchor's split, `MAX_PARTNERS` per anchor
  passage and type at most:

  - ``multi_hop``: passage A is related to the passages of document B when A names B's title
    (an entity with an article of its own: the bridge a two-hop question walks). A corpus
    without such links has no multi-hop candidates (a bridge through anything but the second
    document's subject would not say which of its facts is meant).
  - ``comparison``: passages of other documents stating the same relation with a value
    (``<subject> was founded in <year>``), documents that share a rarer name with A's first
    (the same canal, the same architect: ``which of the towns on the X canal was founded
    earlier``).
  - ``paraphrase``: the other passages of A's own document that name its subject (A itself when
    none does), when A says something of its subject: the question names the subject through
    them.
* A run stops at its target, so the rows it accepted may all come from one split's documents
  although the other split has documents too (a small target, an eval document with nothing to
  ask). `fill_empty_split` then moves whole source components — rows linked by a shared
  document — to the empty split, so both splits have rows and still share no document.
* The plan interleaves the types round-robin over a seeded shuffle of each type's candidates, so
  any prefix of it (what a run that stops at its target used) is a mix of types and documents.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence

from gymflow.envs.datagen.corpus import Chunk, Document
from gymflow.envs.datagen.generate import PAIR_TYPES, Candidate, QuestionType
from gymflow.envs.datagen.text import NAME_RE, CorpusContext, facts, names_subject

Related = dict[str, dict[str, list[str]]]
"""Chunk id -> question type -> ids of the passages a two-passage question pairs it with."""

MAX_PARTNERS = 3
"""Partner passages per anchor passage and type at most."""
COMPARISON_POOL = 64
"""Passages of other documents sampled per relation before choosing comparison partners."""
RARE_SHARE = 0.1
"""A name in at most this share of the documents (and at least two) marks related documents."""
_LEAD_RE = re.compile(r"^(The|A|An)\s+")


def assign_splits(groups: Sequence[str], *, seed: int, eval_fraction: float) -> dict[str, str]:
    """``train`` or ``eval`` for each source group (see the module docstring)."""
    ranked = sorted(set(groups), key=lambda g: hashlib.sha256(f"{seed}:{g}".encode()).hexdigest())
    n_eval = round(eval_fraction * len(ranked))
    if eval_fraction > 0 and len(ranked) >= 2:
        n_eval = min(max(n_eval, 1), len(ranked) - 1)
    return {group: "eval" if i < n_eval else "train" for i, group in enumerate(ranked)}


def fill_empty_split(rows: Sequence[tuple[str, Sequence[str]]], *, seed: int, eval_fraction: float) -> list[str]:
    """The split of each row, one split no longer empty where that can be done without a shared source.

    Args:
        rows: (split, source groups) of each accepted row.
        seed: Seed of the ranking of components (as `assign_splits` ranks groups).
        eval_fraction: Share of the components the eval split gets when it was the empty one.

    Returns:
        The splits, in row order: unchanged unless one split had no row, `eval_fraction` > 0 and
        the rows form at least two components (rows sharing a group are one component).
    """
    splits = [split for split, _ in rows]
    if eval_fraction <= 0 or ("train" in splits and "eval" in splits):
        return splits
    parent: dict[str, str] = {}

    def root(group: str) -> str:
        while parent.setdefault(group, group) != group:
            parent[group] = parent[parent[group]]
            group = parent[group]
        return group

    for _, groups in rows:
        for group in groups[1:]:
            parent[root(group)] = root(groups[0])
    members: dict[str, list[str]] = {}
    for _, groups in rows:
        for group in groups:
            members.setdefault(root(group), []).append(group)
    components = sorted(members, key=lambda r: hashlib.sha256(f"{seed}:{min(members[r])}".encode()).hexdigest())
    if len(components) < 2 or not all(groups for _, groups in rows):
        return splits
    n_eval = min(max(round(eval_fraction * len(components)), 1), len(components) - 1)
    to_eval = set(components[:n_eval])
    return [
        ("eval" if root(groups[0]) in to_eval else "train") if split in ("train", "eval") else split
        for split, groups in rows
    ]


def _key(name: str) -> str:
    return _LEAD_RE.sub("", name).casefold()


def partners(
    chunks: Sequence[Chunk], docs: Sequence[Document], *, seed: int, context: CorpusContext | None = None
) -> Related:
    """The partners of every passage, by type (see the module docstring).

    Args:
        chunks: Every passage of the corpus, with its split.
        docs: The documents.
        seed: Seed of the choices among more partners than `MAX_PARTNERS`.
        context: The corpus's `CorpusContext` (built from `chunks` when None).
    """
    context = context or CorpusContext(chunks)
    asks = {c.id for c in chunks if any(f.key for f in facts(c, context.nouns_of(c)))}  # say something of their subject
    bridges = _bridge_partners(chunks, docs, asks, seed=seed)
    compared = _comparison_partners(chunks, docs, context, seed=seed)
    by_doc: dict[str, list[Chunk]] = {}
    for chunk in chunks:
        by_doc.setdefault(chunk.doc_id, []).append(chunk)
    related: Related = {}
    named = {c.id for c in chunks if names_subject(c, context.nouns_of(c))}  # can name it in a clue
    for chunk in chunks:
        own = [c.id for c in by_doc[chunk.doc_id] if c.id != chunk.id and c.id in named]
        random.Random(f"{seed}:paraphrase:{chunk.id}").shuffle(own)
        related[chunk.id] = {
            "multi_hop": bridges.get(chunk.id, []),
            "comparison": compared.get(chunk.id, []),
            "paraphrase": (own[:MAX_PARTNERS] or [chunk.id]) if chunk.id in asks and (own or chunk.id in named) else [],
        }
    return related


def _bridge_partners(
    chunks: Sequence[Chunk], docs: Sequence[Document], asks: set[str], *, seed: int
) -> dict[str, list[str]]:
    by_title: dict[str, str] = {}
    for doc in docs:
        by_title.setdefault(_key(doc.title), doc.id)
    by_doc: dict[str, list[Chunk]] = {}
    for chunk in chunks:
        by_doc.setdefault(chunk.doc_id, []).append(chunk)
    related: dict[str, list[str]] = {}
    for chunk in chunks:
        found: list[str] = []
        for match in NAME_RE.finditer(chunk.text):
            doc_id = by_title.get(_key(match.group(0)))
            if doc_id is None or doc_id == chunk.doc_id:
                continue
            for other in by_doc.get(doc_id, []):
                if other.split == chunk.split and other.id in asks and other.id not in found:
                    found.append(other.id)
        rng = random.Random(f"{seed}:partners:{chunk.id}")
        rng.shuffle(found)
        related[chunk.id] = found[:MAX_PARTNERS]
    return related


def _comparison_partners(
    chunks: Sequence[Chunk], docs: Sequence[Document], context: CorpusContext, *, seed: int
) -> dict[str, list[str]]:
    keys: dict[str, list[tuple[str, str]]] = {}
    holders: dict[tuple[str, str], list[Chunk]] = {}
    by_doc_key: dict[tuple[str, tuple[str, str]], list[Chunk]] = {}
    for chunk in chunks:
        found = {(f.key, f.kind) for f in facts(chunk, context.nouns_of(chunk)) if f.kind in ("year", "number")}
        keys[chunk.id] = sorted(k for k in found if k[0])
        for key in keys[chunk.id]:
            holders.setdefault(key, []).append(chunk)
            by_doc_key.setdefault((chunk.doc_id, key), []).append(chunk)
    names = _rare_names(docs)
    docs_by_name: dict[str, list[str]] = {}
    for doc_id, doc_names in names.items():
        for name in sorted(doc_names):
            docs_by_name.setdefault(name, []).append(doc_id)
    related: dict[str, list[str]] = {}
    for chunk in chunks:
        rng = random.Random(f"{seed}:compare:{chunk.id}")
        shared = sorted(names.get(chunk.doc_id, frozenset()))
        near: dict[str, Chunk] = {}
        far: dict[str, Chunk] = {}
        for key in keys[chunk.id]:
            # Documents sharing a rarer name first; then a sample of the others, which bounds the
            # work on a corpus where every document states the relation.
            for name in shared:
                holding = docs_by_name[name]
                for doc_id in rng.sample(holding, min(len(holding), COMPARISON_POOL)):
                    for other in by_doc_key.get((doc_id, key), []):
                        near.setdefault(other.id, other)
            pool = holders[key]
            for i in sorted(rng.sample(range(len(pool)), min(len(pool), COMPARISON_POOL))):
                far.setdefault(pool[i].id, pool[i])
        chosen: list[Chunk] = []
        for group in (near, far):
            ranked = sorted(group)
            rng.shuffle(ranked)
            for cid in ranked:
                other = group[cid]
                usable = other.doc_id != chunk.doc_id and other.split == chunk.split
                if usable and len(chosen) < MAX_PARTNERS and all(c.doc_id != other.doc_id for c in chosen):
                    chosen.append(other)
        related[chunk.id] = [c.id for c in chosen]
    return related


def _rare_names(docs: Sequence[Document]) -> dict[str, frozenset[str]]:
    """Document id -> the names it shares with a few other documents (not its title)."""
    found = {doc.id: {m.group(0) for m in NAME_RE.finditer(doc.text)} - {doc.title} for doc in docs}
    counts: dict[str, int] = {}
    for names in found.values():
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    limit = max(2, int(RARE_SHARE * len(docs)))
    return {doc: frozenset(n for n in names if 2 <= counts[n] <= limit) for doc, names in found.items()}


def corpus_plan(
    chunks: Sequence[Chunk],
    related: Related,
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
            pairs = related.get(chunk.id, {}).get(kind, [])
            if kind == "paraphrase":  # the other passage names the subject, the anchor has the answer
                sources = [[p, chunk.id] if p != chunk.id else [chunk.id] for p in pairs]
            elif kind in PAIR_TYPES:
                sources = [[chunk.id, p] for p in pairs]
            else:
                sources = [[chunk.id]]
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
