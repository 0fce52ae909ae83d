"""Reading answers out of model text, and checking the text's format.

Design decisions:

* Tags are XML-like, matched case-insensitively and without nesting: the content of a tag is
  everything between ``<tag>`` and the next ``</tag>``. When a tag occurs several times the last
  complete one wins by default, because models draft and restate before their final answer.
* Extracted content is stripped and XML-entity-unescaped (``&lt;`` becomes ``<``); a
  ``\\boxed{...}`` inside an answer is unwrapped with balanced braces (LaTeX answers nest them).
* Model text never makes these functions raise: a missing tag is None or False. Only the caller's
  own mistakes raise (an invalid tag name, a malformed regular expression).
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Sequence

_TAG_NAME_RE = re.compile(r"[A-Za-z_][\w.-]*")


@functools.lru_cache(maxsize=128)
def _tag_patterns(tag: str) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """(pair, opening, closing) patterns of `tag`."""
    if not _TAG_NAME_RE.fullmatch(tag):
        raise ValueError(f"invalid tag name {tag!r}: use letters, digits, '_', '-' or '.'")
    name = re.escape(tag)
    flags = re.IGNORECASE | re.DOTALL
    return (
        re.compile(rf"<{name}>(.*?)</{name}>", flags),
        re.compile(rf"<{name}>", flags),
        re.compile(rf"</{name}>", flags),
    )


def extract_tags(text: str, tag: str) -> list[str]:
    """The contents of every complete ``<tag>...</tag>`` in `text`, in order.

    Args:
        text: Model output.
        tag: The tag name, e.g. ``"answer"`` (matched case-insensitively).

    Returns:
        Each content stripped and entity-unescaped; empty when the tag never closes.

    Raises:
        ValueError: `tag` is not a valid tag name.
    """
    pair, _, closing = _tag_patterns(tag)
    if closing.search(text) is None:  # never closes: skip the scan from every opening
        return []
    return [html.unescape(content).strip() for content in pair.findall(text)]


def extract_tag(text: str, tag: str = "answer", *, last: bool = True) -> str | None:
    """The content of the last (or first) complete ``<tag>...</tag>`` in `text`.

    Args:
        text: Model output.
        tag: The tag name (matched case-insensitively).
        last: Take the last occurrence (the default) rather than the first.

    Returns:
        The stripped, entity-unescaped content, or None when there is no complete tag.

    Raises:
        ValueError: `tag` is not a valid tag name.
    """
    contents = extract_tags(text, tag)
    if not contents:
        return None
    return contents[-1] if last else contents[0]


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in `text`, braces balanced.

    Args:
        text: Model output, typically LaTeX.

    Returns:
        The content (unstripped), or None when there is no complete ``\\boxed{``.
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i]
    return None


def extract_answer(text: str, tag: str = "answer", *, unwrap_boxed: bool = True) -> str | None:
    """The final answer of a message: the last ``<tag>...</tag>``, with ``\\boxed{}`` unwrapped.

    Args:
        text: A model message.
        tag: The answer tag's name.
        unwrap_boxed: When the tag holds a ``\\boxed{...}``, return only the boxed content.

    Returns:
        The stripped, entity-unescaped answer, or None when there is no complete tag.

    Raises:
        ValueError: `tag` is not a valid tag name.
    """
    answer = extract_tag(text, tag)
    if answer is None or not unwrap_boxed:
        return answer
    boxed = extract_boxed(answer)
    return boxed.strip() if boxed is not None else answer


def matches_pattern(text: str, pattern: str | re.Pattern[str], *, full: bool = False, flags: int = 0) -> bool:
    """Whether `text` matches a regular expression (anywhere, or as a whole with `full`).

    Args:
        text: Model output.
        pattern: A regular expression (a string, or a compiled pattern when `flags` is 0).
        full: Require the whole text to match (`re.fullmatch`) instead of any part (`re.search`).
        flags: `re` flags for a string pattern.

    Returns:
        True on a match.

    Raises:
        re.error: `pattern` is not a valid regular expression.
    """
    compiled = re.compile(pattern, flags)
    return (compiled.fullmatch(text) if full else compiled.search(text)) is not None


def _single_span(text: str, tag: str) -> tuple[int, int] | None:
    """The span of the tag's only ``<tag>...</tag>``; None unless it opens and closes exactly once."""
    pair, opening, closing = _tag_patterns(tag)
    if len(opening.findall(text)) != 1 or len(closing.findall(text)) != 1:
        return None
    match = pair.search(text)
    return match.span() if match else None


def tag_format_score(text: str, tags: Sequence[str]) -> float:
    """The fraction of `tags` that occur exactly once, opened and then closed.

    A soft format reward: ``<think>..</think>`` without ``<answer>`` scores 0.5 for
    ``("think", "answer")``. Order is not checked; see `follows_tag_format`.

    Args:
        text: Model output.
        tags: Tag names that must each appear once.

    Returns:
        A value in [0, 1]; 1.0 when `tags` is empty.

    Raises:
        ValueError: A tag name is invalid.
    """
    if not tags:
        return 1.0
    return sum(_single_span(text, tag) is not None for tag in tags) / len(tags)


def follows_tag_format(text: str, tags: Sequence[str], *, allow_outside: bool = True) -> bool:
    """Whether every tag occurs exactly once, in the given order, without overlapping.

    Args:
        text: Model output.
        tags: Tag names in their required order, e.g. ``("think", "answer")``.
        allow_outside: Allow text outside the tags; False allows only whitespace there.

    Returns:
        True when the format is followed.

    Raises:
        ValueError: A tag name is invalid or repeated.
    """
    if len({tag.casefold() for tag in tags}) != len(tags):
        raise ValueError(f"repeated tag names in {list(tags)!r}")
    spans = []
    for tag in tags:
        span = _single_span(text, tag)
        if span is None:
            return False
        spans.append(span)
    position = 0
    for start, end in spans:
        if start < position or (not allow_outside and text[position:start].strip()):
            return False
        position = end
    return allow_outside or not text[position:].strip()
