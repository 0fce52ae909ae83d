"""Offline questions over two passages: a bridge, a comparison, a paraphrase.

Each is a question a single lexical search does not settle, written without a model:

* ``multi_hop`` (bridge, two documents): passage A mentions E, passage B is about E (E is B's
  title, or the name B's sentence starts with) and relates it to an answer X. The question quotes
  A with E blanked and asks for what B says, so X needs A first, then B:
  ``Take the name that fills the blank in "Corton is twinned with ____." That one was founded in
  what year?``
* ``comparison`` (two documents): both say the same relation of their subjects with a year or a
  number (``Ashfield was founded in 1236``, ``Brel was founded in 1302``); the question quotes
  both with the values blanked and asks for the earlier / later year or the larger / smaller
  number, so it needs both documents: the answer is one value, which one depends on the other.
* ``paraphrase`` (one document, two passages where it has them): the answer sentence is never
  quoted. Its subject is named only through another sentence of the document with the subject
  blanked, and its relation words are reworded where `gymflow.envs.datagen.text.SYNONYMS` knows one:
  ``Take the name that fills the blank in "Since 1961 ____ has been twinned with Quenton." That
  one's principal export is what?``

A quote that another document has with the same blank (`CorpusContext.unique`), or that holds no
name or number only its documents have (`CorpusContext.identifies`: another document may say the
same in other words), is never used: the blank would have several fills, the question several
answers. Values that tie are not compared.
Every writer returns ``(question, answer)`` or why it has none, and picks among its options by
the candidate's id and variant, so generation is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence

from gymflow.envs.datagen.corpus import Chunk
from gymflow.envs.datagen.text import (
    CorpusContext,
    Fact,
    facts,
    mentions,
    numeric,
    pick,
    resolve,
    reword,
    sentences,
    title_of,
)

Written = tuple[str, str] | str
"""(question, answer), or why no question was written."""


def _that_one(blank: str, asked: str) -> str:
    joiner = "" if asked.startswith("'s") else " "
    return f'Take the name that fills the blank in "{blank}" That one{joiner}{asked}?'


def bridge(a: Chunk, b: Chunk, context: CorpusContext, *, key: str, variant: int) -> Written:
    """A ``multi_hop`` question from passage `a` through passage `b` (see the module docstring)."""
    title_b = title_of(b)
    targets = [f for f in facts(b, context.nouns_of(b)) if f.key]
    if not title_b or not targets:
        return "no sentence of the second passage relating its subject to a value"
    bridges = []
    for sentence in sorted(_plain_sentences(a, context)):
        at = mentions(sentence, title_b)
        if at < 0:
            continue
        blank = sentence[:at] + "____" + sentence[at + len(title_b) :]
        if not context.unique(blank, a.doc_id) or not context.identifies(blank, [a.doc_id, b.doc_id]):
            continue
        bridges += [(blank, f.asked, f.answer) for f in targets if mentions(sentence, f.answer) < 0]
    if not bridges:
        return "no sentence of the first passage names the second one's subject unambiguously"
    blank, asked, answer = pick(sorted(bridges), key, variant)
    return _that_one(blank, asked), answer


def _plain_sentences(chunk: Chunk, context: CorpusContext) -> set[str]:
    """The passage's sentences, its subject named where it was referred to."""
    return {resolve(s, title_of(chunk), context.nouns_of(chunk)) for s in sentences(chunk)}


def _quote(fact: Fact) -> str:
    """The subject, its relation, the blanked value and the words after it: ``Brel was founded in ____``."""
    end = fact.end + len(fact.tail) + (1 if fact.tail else 0)
    return (fact.sentence[fact.subject_at : fact.start] + "____" + fact.sentence[fact.end : end]).strip()


def comparison(a: Chunk, b: Chunk, context: CorpusContext, *, key: str, variant: int) -> Written:
    """A ``comparison`` question over passages of two documents (see the module docstring)."""
    if a.doc_id == b.doc_id:
        return "both passages are of one document"
    pairs = []
    facts_b = [f for f in facts(b, context.nouns_of(b)) if f.key and f.kind in ("year", "number")]
    for fa in facts(a, context.nouns_of(a)):
        if not fa.key or fa.kind not in ("year", "number"):
            continue
        for fb in facts_b:
            va, vb = numeric(fa.answer), numeric(fb.answer)
            if fb.kind == fa.kind and fb.key == fa.key and va is not None and vb is not None and va != vb:
                pairs.append((fa, fb, va, vb))
    if not pairs:
        return "no relation both passages state with a value"
    fa, fb, va, vb = pick(pairs, key, variant)
    first = variant % 2 == 0  # earlier / larger on even variants, later / smaller on odd ones
    a_wins = (va < vb) if fa.kind == "year" else (va > vb)
    winner = fa if a_wins == first else fb
    if fa.kind == "year":
        ask = f"which of the two years is {'earlier' if first else 'later'}? Answer with that year."
    else:
        ask = f"which of the two numbers is {'larger' if first else 'smaller'}? Answer with that number."
    return f'Compare "{_quote(fa)}" with "{_quote(fb)}": {ask}', winner.answer


def paraphrase(chunks: Sequence[Chunk], context: CorpusContext, *, key: str, variant: int) -> Written:
    """A ``paraphrase`` question: the answer from the last passage, the subject named through a
    sentence of the others (of the same document; itself when it is the only one)."""
    answer_chunk = chunks[-1]
    title = title_of(answer_chunk)
    if not title or any(c.doc_id != answer_chunk.doc_id for c in chunks):
        return "no subject, or passages of several documents"
    targets = [f for f in facts(answer_chunk, context.nouns_of(answer_chunk)) if f.key]
    if not targets:
        return "no sentence relating the subject to a value"
    clues = []
    others = [c for c in chunks if c.id != answer_chunk.id] or [answer_chunk]
    for chunk in others:
        for sentence in sorted(_plain_sentences(chunk, context)):
            at = mentions(sentence, title)
            if at < 0:
                continue
            blank = sentence[:at] + "____" + sentence[at + len(title) :]
            if context.unique(blank, answer_chunk.doc_id) and context.identifies(blank, [answer_chunk.doc_id]):
                clues.append((sentence, blank))
    options = []
    for target in targets:
        asked, _ = reword(target.asked)
        for sentence, blank in clues:
            if sentence != target.sentence and mentions(sentence, target.answer) < 0:
                options.append((blank, asked, target.answer))
    if not options:
        return "no other sentence names the subject unambiguously"
    blank, asked, answer = pick(sorted(options), key, variant)
    return _that_one(blank, asked), answer
