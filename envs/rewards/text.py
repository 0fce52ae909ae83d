"""Comparing short text answers: exact and normalised match, token F1, set overlap.

Design decisions:

* Normalisation is SQuAD's (`normalize_answer`): lower case, punctuation deleted, the articles
  "a", "an", "the" removed, whitespace collapsed. Two extensions for non-English text: Unicode
  NFKC first (full-width digits become ASCII) and Unicode punctuation (category P*) deleted as
  well as ASCII's; case folding uses `str.casefold`. On ASCII text the result is SQuAD's, so
  scores compare with published EM/F1 numbers.
* Several references: the best score over them (SQuAD's rule).
* Token F1 follows SQuAD v2: tokens are the normalised text split on whitespace, counted as a
  multiset; when either side has no tokens the score is 1 if both have none, else 0.
"""

from __future__ import annotations

import functools
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCTUATION = frozenset(string.punctuation)


@functools.lru_cache(maxsize=4096)
def _is_punctuation(char: str) -> bool:
    return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")


def normalize_answer(text: str) -> str:
    """SQuAD-style normal form: casefolded, no punctuation, no articles, single spaces.

    Args:
        text: An answer.

    Returns:
        The normalised text, e.g. ``"The  Eiffel-Tower!"`` -> ``"eiffeltower"``.
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(char for char in text if not _is_punctuation(char))
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


def _references(truth: str | Sequence[str]) -> list[str]:
    references = [truth] if isinstance(truth, str) else list(truth)
    if not references:
        raise ValueError("at least one reference answer is needed")
    return references


def exact_match(pred: str, truth: str | Sequence[str]) -> bool:
    """Whether `pred` equals a reference exactly, ignoring only surrounding whitespace.

    Args:
        pred: The model's answer.
        truth: The reference answer, or several.

    Returns:
        True when it equals any reference.

    Raises:
        ValueError: `truth` is an empty sequence.
    """
    return any(pred.strip() == reference.strip() for reference in _references(truth))


def normalized_match(pred: str, truth: str | Sequence[str]) -> bool:
    """Whether `pred` equals a reference after `normalize_answer` (SQuAD's exact match).

    Args:
        pred: The model's answer.
        truth: The reference answer, or several.

    Returns:
        True when the normal forms of `pred` and any reference are equal.

    Raises:
        ValueError: `truth` is an empty sequence.
    """
    normal = normalize_answer(pred)
    return any(normal == normalize_answer(reference) for reference in _references(truth))


def _f1(pred_tokens: list[str], truth_tokens: list[str]) -> float:
    if not pred_tokens or not truth_tokens:
        return float(pred_tokens == truth_tokens)
    common = sum((Counter(pred_tokens) & Counter(truth_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(pred: str, truth: str | Sequence[str]) -> float:
    """SQuAD's token F1 between `pred` and the best-matching reference.

    Args:
        pred: The model's answer.
        truth: The reference answer, or several.

    Returns:
        The harmonic mean of token precision and recall over normalised tokens, in [0, 1].

    Raises:
        ValueError: `truth` is an empty sequence.
    """
    pred_tokens = normalize_answer(pred).split()
    return max(_f1(pred_tokens, normalize_answer(reference).split()) for reference in _references(truth))


def split_items(text: str, separators: str = ",;\n") -> list[str]:
    """Split a list-like answer (``"Paris, Rome; Oslo"``) into stripped, non-empty items.

    Args:
        text: The answer.
        separators: Characters that separate items.

    Returns:
        The items in order.
    """
    if not separators:
        return [text.strip()] if text.strip() else []
    parts = re.split("[" + re.escape(separators) + "]", text)
    return [part.strip() for part in parts if part.strip()]


def set_iou(pred: Iterable[str], truth: Iterable[str], *, normalize: bool = True) -> float:
    """Jaccard overlap ``|P & T| / |P | T|`` of two sets of answer items.

    Args:
        pred: The model's items (see `split_items` for list-like text).
        truth: The reference items.
        normalize: Compare items by `normalize_answer` (items that normalise to nothing are
            dropped); False compares them stripped, case-sensitively.

    Returns:
        A value in [0, 1]; 1.0 when both sets are empty.
    """

    def items(values: Iterable[str]) -> set[str]:
        keys = (normalize_answer(v) if normalize else v.strip() for v in values)
        return {key for key in keys if key}

    p, t = items(pred), items(truth)
    union = p | t
    return len(p & t) / len(union) if union else 1.0
