"""The offline generator on a plain corpus of 200 town articles (tests/town_corpus.py): every question
it writes has the answer the corpus gives, the two-passage types survive the too-easy filter at a
useful rate, and the same corpus gives the same questions in every process."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from town_corpus import Town, write_corpus

from gymflow.envs.datagen.corpus import Chunk, Document, chunk_document, decode_document
from gymflow.envs.datagen.filters import GuardConfig, answer_in, guard
from gymflow.envs.datagen.generate import QUESTION_TYPES, Candidate, Draft, offline_draft
from gymflow.envs.datagen.index import Bm25Index
from gymflow.envs.datagen.plan import assign_splits, corpus_plan, fill_empty_split, partners
from gymflow.envs.datagen.text import CorpusContext, resolve
from gymflow.envs.rewards.text import normalize_answer

ROOT = Path(__file__).parents[3]
QUOTE_RE = re.compile(r'fills the blank in "(.*)" That one(.*)\?$')
COMPARE_RE = re.compile(r'^Compare "(.*)" with "(.*)": which of the two (years|numbers) is (\w+)\?')


@dataclass
class Generated:
    towns: dict[str, Town]
    """Document id -> the facts of its town."""
    texts: dict[str, str]
    drafts: list[tuple[Draft, bool]]
    """Every draft that passed the guards, and whether the too-easy filter let it through."""
    planned: Counter[str]


def generate(root: Path, *, flat: bool) -> Generated:
    facts = write_corpus(root, 200, flat=flat)
    docs = []
    for path in sorted(root.iterdir()):
        doc = decode_document(path.name, path.read_bytes())
        assert isinstance(doc, Document)
        docs.append(doc)
    splits = assign_splits([d.id for d in docs], seed=0, eval_fraction=0.2)
    chunks = [c.model_copy(update={"split": splits[d.id]}) for d in docs for c in chunk_document(d)]
    context = CorpusContext(chunks)
    plan = corpus_plan(chunks, partners(chunks, docs, seed=0, context=context), types=QUESTION_TYPES, variants=2,
                       seed=0)  # fmt: skip
    by_id = {c.id: c for c in chunks}
    drafts = []
    for candidate in plan:
        draft = offline_draft(candidate, [by_id[i] for i in candidate.chunk_ids], context)
        if isinstance(draft, Draft) and guard(draft, [by_id[i].text for i in draft.chunk_ids], GuardConfig()) is None:
            drafts.append(draft)
    tops = Bm25Index([c.text for c in chunks]).search_many([d.question for d in drafts], k=1)
    kept = [
        not (hits and answer_in(chunks[hits[0].position].text, d.answer)) for d, hits in zip(drafts, tops, strict=True)
    ]
    return Generated(
        towns={t.path: t for t in facts},
        texts={d.id: d.text for d in docs},
        drafts=list(zip(drafts, kept, strict=True)),
        planned=Counter(c.type for c in plan),
    )


@pytest.fixture(scope="module", params=[False, True], ids=["sections", "flat"])
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Generated:
    return generate(tmp_path_factory.mktemp("towns"), flat=request.param)


def values(town: Town) -> dict[str, str]:
    """Attribute -> its value as the articles write it."""
    return {
        "founded": str(town.founded), "founder": town.founder, "export": town.export, "canal": town.canal,
        "hall_year": str(town.hall_year), "architect": town.architect, "style": town.style,
        "census_year": str(town.census_year), "population": f"{town.population:,}",
        "households": f"{town.households:,}", "twin": town.twin or "-", "region": town.region,
    }  # fmt: skip


# What a question must say to ask for an attribute (independent of the generator's wording rules).
ASKS = {
    "founded": r"founded|established|dates from|founding",
    "founder": r"(founded|established|founding).* by",
    "export": r"export|product|sold abroad",
    "canal": r"towpath|canal|by way of|lies on|situated on",
    "hall_year": r"town hall|council",
    "architect": r"town hall|designed|planned",
    "style": r"town hall",
    "census_year": r"census",
    "population": r"inhabitants|people|residents|population",
    "households": r"households",
    "twin": r"twinned",
    "region": r"part of the county",
}


def also_fits(subject: Town, text: str, towns: dict[str, Town]) -> list[str]:
    """Other towns the facts `text` states of `subject` are true of (the wording aside)."""
    mine = values(subject)
    stated = [
        a for a, v in mine.items() if v != "-" and re.search(rf"(?<!\w)(?<!\d,){re.escape(v)}(?!\w)(?!,\d)", text)
    ]
    return [t.name for t in towns.values() if t is not subject and all(values(t)[a] == mine[a] for a in stated)]


def asked_attribute(town: Town, answer: str, asked: str) -> str:
    """The attribute of `town` the answer is, checked against what the question asks."""
    found = [name for name, value in values(town).items() if value == answer]
    assert found, f"{answer!r} is no fact of {town.name}"
    matching = [name for name in found if re.search(ASKS[name], asked)]
    assert matching, f"{asked!r} does not ask for {found} of {town.name}"
    return matching[0]


def resolved_article(town: Town, text: str) -> str:
    """The article with its subject named where it said "the town" or "It" (written for this check)."""
    text = re.sub(r"\bthe town's\b", f"{town.name}'s", text, flags=re.IGNORECASE)
    text = re.sub(r"\b[Tt]he town (?!hall)", f"{town.name} ", text)
    text = re.sub(r"\bthe town\.", f"{town.name}.", text)
    return re.sub(r"(^|\. )Its ", rf"\1{town.name}'s ", text, flags=re.MULTILINE)


def norm(text: str) -> str:
    return normalize_answer(text.replace("____", " blankmark ").replace("'s", " 's"))


def fills(quote: str, resolved: dict[str, str]) -> set[tuple[str, str]]:
    """(article, word) wherever the quote occurs in an article with that word in its blank."""
    left, _, right = norm(quote).partition("blankmark")
    pattern = re.compile(r"(?<!\w)" + re.escape(left) + r"(\w+)" + re.escape(right) + r"(?!\w)")
    return {(doc, word) for doc, text in resolved.items() for word in pattern.findall(text)}


def test_every_question_has_the_answer_the_corpus_gives(corpus: Generated) -> None:
    resolved = {doc: norm(resolved_article(corpus.towns[doc], text)) for doc, text in corpus.texts.items()}
    checked: Counter[str] = Counter()
    for draft, _ in corpus.drafts:
        towns = [corpus.towns[d] for d in draft.doc_ids]
        if draft.type == "comparison":
            first, second, _unit, direction = COMPARE_RE.match(draft.question).groups()  # type: ignore[union-attr]
            a, b = towns
            winner = next(t for t in towns if draft.answer in values(t).values())
            loser = b if winner is a else a
            attribute = asked_attribute(winner, draft.answer, first if winner is a else second)
            mine, other = (float(values(t)[attribute].replace(",", "")) for t in (winner, loser))
            assert mine != other and (mine < other) == (direction in ("earlier", "smaller")), draft.question
            for quote, town in ((first, a), (second, b)):  # each quote is its town's, with its value
                assert norm(quote.replace("____", values(town)[attribute])) in resolved[town.path], draft.question
        elif draft.type in ("multi_hop", "paraphrase"):
            quote, asked = QUOTE_RE.search(draft.question).groups()  # type: ignore[union-attr]
            holder, subject = towns[0], towns[-1]  # the quote's article; the town it leads to
            asked_attribute(subject, draft.answer, asked)
            if draft.type == "multi_hop":
                assert holder.twin == subject.name  # the corpus's links between articles: twin towns
            # The quote leads to one town: it occurs in one article, with that town in its blank,
            # and what it says of its subject is true of no other town, however worded.
            assert fills(quote, resolved) == {(holder.path, subject.name.lower())}, draft.question
            if draft.type == "paraphrase":
                assert not also_fits(subject, quote, corpus.towns), draft.question
            assert subject.name not in draft.question
        else:
            [town] = towns
            assert answer_in(corpus.texts[town.path], draft.answer)
            about = re.match(r"^(?:About|Fill in the blank about) ([^:]+):", draft.question)
            if about:
                assert about.group(1) == town.name
            elif draft.answer == town.name:  # asks for its subject: no other town fits the sentence
                assert not also_fits(town, draft.question, corpus.towns), draft.question
                if draft.type == "cloze":
                    assert fills(draft.question.removeprefix("Fill in the blank: "), resolved) == {
                        (town.path, town.name.lower())
                    }, draft.question
            else:
                assert town.name in draft.question, draft.question  # names its subject
        checked[draft.type] += 1
    assert set(checked) == set(QUESTION_TYPES), checked


def test_questions_that_need_two_passages_survive_the_too_easy_filter(corpus: Generated) -> None:
    kept = Counter(d.type for d, ok in corpus.drafts if ok)
    written = Counter(d.type for d, _ in corpus.drafts)
    unique = {d.question for d, ok in corpus.drafts if ok}
    # A search for the question's words alone does not find the answer for most comparisons and
    # bridges (the answer is in the other document, or its value decides the comparison); a
    # single-fact question that names its subject is found at once (too easy, rightly).
    assert kept["comparison"] >= 0.3 * written["comparison"] and kept["multi_hop"] >= 0.5 * written["multi_hop"]
    assert kept["extractive"] + kept["cloze"] <= 0.1 * (written["extractive"] + written["cloze"])
    assert len(unique) >= 200, kept  # a target of 200 can be met with every filter on


def test_paraphrases_keep_away_from_the_answer_sentence(tmp_path: Path) -> None:
    generated = generate(tmp_path, flat=False)
    paraphrases = [(d, ok) for d, ok in generated.drafts if d.type == "paraphrase"]
    assert sum(ok for _, ok in paraphrases) >= 0.3 * len(paraphrases)
    for draft, _ in paraphrases:
        [town] = (generated.towns[d] for d in draft.doc_ids)
        assert town.name not in draft.question and draft.answer not in draft.question


def test_sentences_name_their_subject_and_ambiguous_blanks_are_refused() -> None:
    nouns = frozenset({"town"})
    assert resolve("The town had 5,736 inhabitants.", "Ashby", nouns) == "Ashby had 5,736 inhabitants."
    assert resolve("The town hall opened in 1802.", "Ashby", nouns) == "The town hall opened in 1802."
    assert resolve("Its main export is salt.", "Ashby", nouns) == "Ashby's main export is salt."
    assert resolve("Barges leave the town's wharf.", "Ashby", nouns) == "Barges leave Ashby's wharf."

    def chunk(doc: str, body: str) -> Chunk:
        return Chunk(id=f"{doc}#0", doc_id=doc, index=0, heading=doc.title(), text=f"{doc.title()}\n{body}",
                     char_start=0, split="train")  # fmt: skip

    market = "A market is held every Monday."
    chunks = [
        chunk("ashby", f"Ashby is a market town. {market} Barges reach Ashby by way of the Tamber Canal."),
        chunk("brel", f"Brel is a market town. {market} Brel lies on the Tamber Canal."),
    ]
    context = CorpusContext(chunks)
    questions = set()
    for variant in range(12):
        for kind in ("extractive", "cloze"):
            candidate = Candidate(id=f"{kind}:{variant}", type=kind, chunk_ids=["ashby#0"], doc_ids=["ashby"],
                                  split="train", variant=variant)  # fmt: skip
            draft = offline_draft(candidate, chunks[:1], context)
            assert isinstance(draft, Draft)
            questions.add((draft.question, draft.answer))
    # Said of both towns: asked about Ashby by name. The town itself is never asked for: "Barges reach
    # ____ by way of the Tamber Canal" is Ashby's sentence alone, but Brel is on that canal too.
    assert ("About Ashby: A market is held every what?", "Monday") in questions
    assert all(answer != "Ashby" for _, answer in questions), questions


def test_the_same_corpus_gives_the_same_questions_in_every_process(tmp_path: Path) -> None:
    write_corpus(tmp_path / "towns", 60)
    script = f"""
import hashlib, sys
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests")!r}, {str(Path(__file__).parent)!r}]
from test_offline_questions import generate_from
print(generate_from({str(tmp_path / "towns")!r}))
"""
    digests = {
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120,
                       env={**os.environ, "PYTHONHASHSEED": seed}, cwd=ROOT).stdout.strip()
        for seed in ("1", "2")
    }  # fmt: skip
    assert len(digests) == 1 and generate_from(str(tmp_path / "towns")) in digests


def generate_from(root: str) -> str:
    """A digest of the plan and every draft of the corpus at `root` (what determinism compares)."""
    docs = [decode_document(p.name, p.read_bytes()) for p in sorted(Path(root).iterdir())]
    docs = [d for d in docs if isinstance(d, Document)]
    splits = assign_splits([d.id for d in docs], seed=7, eval_fraction=0.2)
    chunks = [c.model_copy(update={"split": splits[d.id]}) for d in docs for c in chunk_document(d)]
    context = CorpusContext(chunks)
    plan = corpus_plan(chunks, partners(chunks, docs, seed=7), types=QUESTION_TYPES, variants=2, seed=7)
    by_id = {c.id: c for c in chunks}
    out = hashlib.sha256()
    for candidate in plan:
        out.update(
            offline_draft(candidate, [by_id[i] for i in candidate.chunk_ids], context).model_dump_json().encode()
        )
    return f"{len(plan)}:{out.hexdigest()}"


def test_an_empty_split_is_filled_with_whole_source_components() -> None:
    rows = [("train", ["a"]), ("train", ["a", "b"]), ("train", ["c"]), ("train", ["d"]), ("train", ["d"])]
    splits = fill_empty_split(rows, seed=0, eval_fraction=0.2)
    assert "eval" in splits and "train" in splits
    by_group: dict[str, set[str]] = {}
    for (_, groups), split in zip(rows, splits, strict=True):
        for group in groups:
            by_group.setdefault(group, set()).add(split)
    assert all(len(s) == 1 for s in by_group.values())  # no source on both sides
    assert splits[0] == splits[1]  # "a" links its rows with "b"'s
    # Symmetric: an empty train split is filled too, with the other components.
    assert set(fill_empty_split([(("eval"), g) for _, g in rows], seed=0, eval_fraction=0.2)) == {"train", "eval"}
    # Left alone: both splits have rows, no eval wanted, or one component only.
    assert fill_empty_split([("train", ["a"]), ("eval", ["b"])], seed=0, eval_fraction=0.2) == ["train", "eval"]
    assert fill_empty_split(rows, seed=0, eval_fraction=0.0) == ["train"] * 5
    assert fill_empty_split([("train", ["a"]), ("train", ["a", "b"])], seed=0, eval_fraction=0.5) == ["train"] * 2
