"""Sentence analysis for the offline question generator: sentences, answer spans, subjects, facts.

* A passage's subject is its document's title (the first part of its heading trail). A sentence
  that names the subject by a leading pronoun (``It was founded ...``) or by the document's kind
  noun (``the town``, the noun of a defining sentence ``Ashfield is a market town ...``) is
  rewritten to name it, so a question written from the sentence says what it is about. The kind
  noun is replaced only where it stands alone (``the town had``, ``of the town.``), never as a
  modifier (``the town hall``): the word after it must be a function word or punctuation.
* A `Fact` is an answer span of such a sentence (a year, a number, a name) and, when the subject
  comes first, the words relating it to the span (``was founded in``): two documents' facts with
  the same relation can be compared, and a relation can be asked about a subject named otherwise.
* `CorpusContext` is what a question about one document must know of the others. Every blank a
  question can be made of — a sentence with an answer span, its subject or its leading name
  replaced by ``____`` — is indexed with the documents that have it; a blanked sentence that
  another document has too is ambiguous (``A weekly market is held on ____``, said of every
  town), so a question must not rest on it alone. A sentence that stands for its subject (a
  question asking for the subject, a quote naming it by a blank) must also hold an identifying
  span — a name or number no document outside the question's own has, besides the document
  about that name — since another document may say the same thing in other words
  (``Barges reach ____ by way of the Tamber Canal.`` fits every town on that canal).

Everything here is a pure function of the text: the same corpus gives the same facts everywhere.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gymflow.envs.datagen.corpus import Chunk
from gymflow.envs.rewards.text import normalize_answer

SENTENCE_RE = re.compile(r"[^.!?\n]+(?:[.!?]+|$)")
YEAR_RE = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})\b")
NUMBER_RE = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")
NAME_RE = re.compile(r"\b[A-Z][\w'-]+(?:\s+(?:of\s+|de\s+|the\s+|van\s+)?[A-Z][\w'-]+)*")
PRONOUN_RE = re.compile(r"^(It|He|She|They|This|Its|His|Her|Their)\b")
LEAD_WORDS = frozenset({"The", "A", "An", "In", "On", "At", "By", "For", "From", "During", "After", "Before", "Since"})
_DEFINITION_RE = (
    r"^{title}\s+(?:is|was|are|were)\s+(?:a|an|the|one of the)\s+((?:[\w-]+\s+){{0,3}}?[a-z][\w-]*)\b"
    r"(?=\s+(?:in|on|of|at|near|by|from|with|and|that|which|founded|located|situated)\b|\s*[,.;]|\s*$)"
)
_FUNCTION_WORDS = frozenset(
    re.findall(
        r"\w+",
        "is was are were has had have will would can could may might must shall should does did do became becomes "
        "remains remained and or but in on of at by to for from with since until into onto near after before as "
        "which that who whose where when grew lies lay stands stood",
    )
)
_ARTICLES = frozenset({"a", "an", "the", "s"})
# "<subject>'s main export is smoked herring.": a short lowercase object after a copula ends the sentence.
_THING_RE = re.compile(
    r"^((?:'s)?(?:\s+[\w'-]+){0,4}?\s+(?:is|are|was|were))"
    r"\s+(?!(?:a|an|the)\b)([a-z][a-z-]*(?:\s+[a-z][a-z-]*){0,2})\s*[.!]?$"
)
_RELATION_MAX_WORDS = 6
_TAIL_MAX_WORDS = 6


def title_of(chunk: Chunk) -> str:
    """The passage's subject: the first part of its heading trail ('' when it has none)."""
    return chunk.heading.split(" > ")[0] if chunk.heading else ""


def sentences(chunk: Chunk) -> list[str]:
    """Sentences of a passage (its heading line left out) of at least four words."""
    body = chunk.text.split("\n", 1)[1] if chunk.heading and "\n" in chunk.text else chunk.text
    return [s.strip() for s in SENTENCE_RE.findall(body) if len(s.split()) >= 4]


def answer_spans(sentence: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of answer candidates in a sentence: years, numbers, names."""
    spans: list[tuple[int, int, str]] = [(m.start(), m.end(), "year") for m in YEAR_RE.finditer(sentence)]
    taken = [(s, e) for s, e, _ in spans]
    for m in NUMBER_RE.finditer(sentence):
        if not any(s <= m.start() < e for s, e in taken):
            spans.append((m.start(), m.end(), "number"))
    for m in NAME_RE.finditer(sentence):
        start, text = m.start(), m.group(0)
        first, _, rest = text.partition(" ")
        if first in LEAD_WORDS or (start == 0 and not rest):
            if not rest:
                continue
            start, text = start + len(first) + 1, rest
        if start == 0 or PRONOUN_RE.match(text):
            continue
        if text.endswith("'s"):  # a possessive: the name without its ending
            text = text[:-2]
        spans.append((start, start + len(text), "name"))
    return sorted(spans)


def wh(kind: str) -> str:
    """The question phrase asking for a span of `kind`."""
    return {"year": "what year", "number": "how many"}.get(kind, "what")


def as_question(text: str) -> str:
    """A sentence as a question: capitalised, its final punctuation replaced by ``?``."""
    text = text.strip().rstrip(".!?;:, ")
    return text[:1].upper() + text[1:] + "?"


def pick(items: Sequence[Any], key: str, variant: int) -> Any:
    """The `variant`-th item of a seeded (by `key`) order of `items`."""
    order = sorted(range(len(items)), key=lambda i: hashlib.sha256(f"{key}:{i}".encode()).digest())
    return items[order[variant % len(items)]]


def mentions(sentence: str, name: str) -> int:
    """Where `name` occurs in `sentence` as whole words (-1: nowhere)."""
    if not name:
        return -1
    match = re.search(rf"(?<![\w'-]){re.escape(name)}(?![\w-])", sentence)
    return match.start() if match else -1


def kind_nouns(texts: Iterable[str], title: str) -> frozenset[str]:
    """Nouns a document calls its subject by, from sentences defining it (``X is a market town``)."""
    if not title:
        return frozenset()
    pattern = re.compile(_DEFINITION_RE.format(title=re.escape(title)))
    found = set()
    for text in texts:
        for sentence in SENTENCE_RE.findall(text):
            match = pattern.match(sentence.strip())
            if match:
                found.add(match.group(1).split()[-1].lower())
    return frozenset(found)


def resolve(sentence: str, title: str, nouns: frozenset[str] = frozenset()) -> str:
    """`sentence` with a leading pronoun and the standalone kind noun replaced by `title`."""
    if not title:
        return sentence
    match = PRONOUN_RE.match(sentence)
    if match:
        word = match.group(1)
        sentence = (f"{title}'s" if word in {"Its", "His", "Her", "Their"} else title) + sentence[match.end() :]
    for noun in sorted(nouns):

        def named(m: re.Match[str]) -> str:
            following = m.group(1)
            if following.startswith("'s"):
                return title + following
            word = following.strip().split(" ")[0] if following.strip() else ""
            standalone = not word or not word[0].isalnum() or word.lower() in _FUNCTION_WORDS
            return title + following if standalone else m.group(0)

        sentence = re.sub(rf"\b[Tt]he {re.escape(noun)}\b('s\b|\s*[^\s]*|$)", named, sentence)
    return sentence


@dataclass(frozen=True)
class Fact:
    """An answer span of a (resolved) sentence, and how the sentence relates its subject to it."""

    sentence: str
    start: int
    end: int
    kind: str
    """``year``, ``number``, ``name``, or ``thing``: the short lowercase object that ends a
    sentence about its subject (``Ashfield's main export is rope.``)."""
    subject_at: int
    """Where the subject (the title) is in the sentence; -1: not named."""
    relation: str
    """The words from the subject to the span (``was founded in``) when the sentence starts with
    its subject; '' when it does not, or they are more than a few words or a clause apart."""
    tail: str
    """The words after the span up to the next punctuation (a few at most)."""

    @property
    def answer(self) -> str:
        return self.sentence[self.start : self.end]

    def blanked(self) -> str:
        return self.sentence[: self.start] + "____" + self.sentence[self.end :]

    @property
    def key(self) -> str:
        """What the sentence says of its subject, in words that mean something: the relation
        (``was founded in ____``), with the tail's first word when the relation alone is only
        function words (``had ____ inhabitants``); '' when neither says anything."""
        if not self.relation:
            return ""
        if _has_content(self.relation):
            return f"{self.relation.lower()} ____"
        first = self.tail.split(" ")[0] if self.tail else ""
        return f"{self.relation.lower()} ____ {first.lower()}" if _has_content(first) else ""

    @property
    def asked(self) -> str:
        """The relation as a question asks it, the tail kept when the relation needs it
        (``had how many inhabitants at the last census``); '' without a `key`."""
        if not self.key:
            return ""
        if _has_content(self.relation):
            return f"{self.relation} {wh(self.kind)}"
        return f"{self.relation} {wh(self.kind)} {self.tail}"


def _has_content(text: str) -> bool:
    return any(w.lower() not in _FUNCTION_WORDS and w.lower() not in _ARTICLES for w in re.findall(r"[A-Za-z]+", text))


def facts(chunk: Chunk, nouns: frozenset[str] = frozenset()) -> list[Fact]:
    """Every answer span of the passage's sentences, its subject named where it was referred to."""
    title = title_of(chunk)
    out = []
    for raw in sentences(chunk):
        sentence = resolve(raw, title, nouns)
        at = mentions(sentence, title)
        for start, end, kind in answer_spans(sentence):
            if at >= 0 and start < at + len(title) and at < end and mentions(raw, title) < 0:
                continue  # the subject, named only by the rewrite: the sentence never said it
            relation = ""
            if at == 0 and len(title) < start:
                gap = sentence[at + len(title) : start]
                if 1 <= len(gap.split()) <= _RELATION_MAX_WORDS and not re.search(r"[,;:()\"]", gap):
                    relation = gap.strip()
            tail = re.split(r"[,;:.!?()\"]", sentence[end:], maxsplit=1)[0].split()
            out.append(Fact(sentence, start, end, kind, at, relation, " ".join(tail[:_TAIL_MAX_WORDS])))
        thing = _THING_RE.match(sentence[len(title) :]) if at == 0 else None
        if thing and _has_content(thing.group(1)):
            start = len(title) + thing.start(2)
            out.append(Fact(sentence, start, start + len(thing.group(2)), "thing", 0, thing.group(1).strip(), ""))
    return out


def names_subject(chunk: Chunk, nouns: frozenset[str] = frozenset()) -> bool:
    """Whether a sentence of the passage names its subject (or refers to it by pronoun or kind noun)."""
    title = title_of(chunk)
    return any(mentions(resolve(s, title, nouns), title) >= 0 for s in sentences(chunk))


def frame(text: str) -> str:
    """A blanked sentence in the form `CorpusContext` compares them (case, punctuation, spacing)."""
    return normalize_answer(text.replace("____", " blankmark "))


class CorpusContext:
    """Titles, kind nouns and every blanked sentence of a corpus (see the module docstring).

    Args:
        chunks: The corpus's passages (all of them: what is ambiguous depends on the others).
    """

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        by_doc: dict[str, list[Chunk]] = {}
        for chunk in chunks:
            by_doc.setdefault(chunk.doc_id, []).append(chunk)
        self.titles = {doc: title_of(parts[0]) for doc, parts in by_doc.items()}
        self.nouns = {doc: kind_nouns((c.text for c in parts), self.titles[doc]) for doc, parts in by_doc.items()}
        self._frames: dict[str, set[str]] = {}
        self._spans: dict[str, set[str]] = {}
        self._about = {normalize_answer(title): doc for doc, title in sorted(self.titles.items(), reverse=True)}
        for doc, parts in by_doc.items():
            title = self.titles[doc]
            for chunk in parts:
                for raw in sentences(chunk):
                    sentence = resolve(raw, title, self.nouns[doc])
                    for start, end in blanks(sentence, title):
                        self._frames.setdefault(frame(sentence[:start] + "____" + sentence[end:]), set()).add(doc)
                    for span, _ in identifiers(sentence):
                        self._spans.setdefault(span, set()).add(doc)

    @classmethod
    def of(cls, chunks: Sequence[Chunk]) -> CorpusContext:
        """A context knowing only `chunks` (a generator called without the corpus: no ambiguity known)."""
        return cls(chunks)

    def nouns_of(self, chunk: Chunk) -> frozenset[str]:
        return self.nouns.get(chunk.doc_id, frozenset())

    def unique(self, blanked: str, doc_id: str) -> bool:
        """Whether no document other than `doc_id` has the blanked sentence `blanked`."""
        return self._frames.get(frame(blanked), set()) <= {doc_id}

    def identifies(self, text: str, doc_ids: Iterable[str]) -> bool:
        """Whether `text` holds a span only `doc_ids` have (the document about it aside)."""
        allowed = set(doc_ids)
        for span, leading in identifiers(text.replace("____", " ")):
            if leading and span not in self._about:
                continue  # a capitalised first word is no name unless a document is about it
            holders = self._spans.get(span, set()) - {self._about.get(span, "")}
            if holders and holders <= allowed:
                return True
        return False


def identifiers(sentence: str) -> set[tuple[str, bool]]:
    """The names and numbers of a sentence, normalised, and whether each is a lone capitalised
    first word (``Barges reach ...``: a name only if it is some document's title)."""
    found = {(normalize_answer(m.group(0)), False) for m in NUMBER_RE.finditer(sentence)}
    for m in NAME_RE.finditer(sentence):
        words = m.group(0).removesuffix("'s").split(" ")
        if words[0] in LEAD_WORDS or PRONOUN_RE.match(words[0]):
            words = words[1:]
        if words:
            found.add((normalize_answer(" ".join(words)), m.start() == 0 and len(words) == 1))
    return {(span, leading) for span, leading in found if span}


def blanks(sentence: str, title: str) -> list[tuple[int, int]]:
    """The spans a question may blank in a sentence: answer spans, its subject, its leading name."""
    spans = [(s, e) for s, e, _ in answer_spans(sentence)]
    at = mentions(sentence, title)
    if at >= 0:
        spans.append((at, at + len(title)))
    lead = NAME_RE.match(sentence)
    if lead and lead.group(0).split(" ")[0] not in LEAD_WORDS:
        spans.append((0, lead.end()))
    return sorted(set(spans))


# Words a paraphrase may swap for another (a small, general table: no model, no thesaurus).
SYNONYMS = {
    "founded": "established",
    "established": "founded",
    "built": "constructed",
    "constructed": "built",
    "completed": "finished",
    "finished": "completed",
    "opened": "inaugurated",
    "designed": "planned",
    "planned": "designed",
    "main": "principal",
    "principal": "main",
    "chief": "main",
    "largest": "biggest",
    "biggest": "largest",
    "located": "situated",
    "situated": "located",
    "lies": "is situated",
    "runs": "passes",
    "named": "called",
    "called": "named",
    "began": "started",
    "started": "began",
    "inhabitants": "residents",
    "residents": "inhabitants",
    "people": "inhabitants",
    "population": "number of inhabitants",
    "export": "product sold abroad",
    "famous": "well known",
    "known": "renowned",
    "moved": "relocated",
    "granted": "given",
    "produces": "makes",
    "produced": "made",
}


def reword(text: str) -> tuple[str, int]:
    """`text` with the words `SYNONYMS` knows swapped; and how many were."""
    count = 0

    def swap(match: re.Match[str]) -> str:
        nonlocal count
        word = match.group(0)
        other = SYNONYMS.get(word.lower())
        if other is None:
            return word
        count += 1
        return other[:1].upper() + other[1:] if word[:1].isupper() else other

    return re.sub(r"[A-Za-z]+", swap, text), count


def numeric(text: str) -> float | None:
    """The value of a year or number span (``12,480`` -> 12480.0), None if it is none."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None
