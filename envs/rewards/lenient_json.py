"""Reading the JSON that language models write: found inside prose, and repaired.

Models asked for JSON wrap it in code fences or prose, and write it loosely: single quotes,
trailing commas, Python's True/None, unquoted keys, comments, quotes left unescaped inside
strings. `json_candidates` finds the bracketed spans in a text and `loads_lenient` parses one
with those repairs, reporting which it needed.

Design decisions:

* A hand-written recursive-descent parser, not `ast.literal_eval` (which rejects JSON's
  ``true``/``null`` and recurses without a bound) nor a regex rewrite (which corrupts strings).
* Strict JSON parses to exactly what `json.loads` returns (lone surrogates become U+FFFD so the
  result can always be serialised again).
* A quote closes a string only when what follows it is ``,`` ``:`` ``}`` ``]`` or the end; any
  other quote is taken as part of the string (``"the "best" one"``; ``'it's'``).
* Bounded work on any input: nesting depth, number length and the number of spans tried are
  capped, and every failure is a `LenientJSONError`.
"""

from __future__ import annotations

import re
from typing import Any

MAX_DEPTH = 64
"""Deeper nesting is an error."""
MAX_SCANS = 32
"""`json_candidates` gives up on a text after this many openers that never close."""

_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_HEX4_RE = re.compile(r"[0-9a-fA-F]{4}")
_LOW_SURROGATE_RE = re.compile(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_WORD_RE = re.compile(r"[A-Za-z_$][\w$-]*")
_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_WORDS: dict[str, tuple[Any, str | None]] = {
    "true": (True, None),
    "false": (False, None),
    "null": (None, None),
    "True": (True, "python literals"),
    "False": (False, "python literals"),
    "None": (None, "python literals"),
    "NaN": (float("nan"), None),
    "Infinity": (float("inf"), None),
}
_CLOSERS = ",:}]"
_OPENERS = {"{": "}", "[": "]"}


class LenientJSONError(ValueError):
    """The text is not JSON, even loosely."""


def _string_end(text: str, pos: int) -> int:
    """Index just past the string opening at `pos`, by the closing-quote rule (or len(text))."""
    quote, i, n = text[pos], pos + 1, len(text)
    while i < n:
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == quote and _closes(text, i + 1):
            return i + 1
        i += 1
    return n


def _closes(text: str, pos: int) -> bool:
    """Whether a quote just before `pos` ends a string: next non-space is a closer or the end."""
    n = len(text)
    while pos < n and text[pos].isspace():
        pos += 1
    return pos == n or text[pos] in _CLOSERS


def json_candidates(text: str) -> list[tuple[int, int]]:
    """Spans of `text` that are balanced ``{...}`` or ``[...]`` blocks, left to right.

    Brackets inside strings do not count; a quote opens a string only where JSON expects a key
    or value (after ``{`` ``[`` ``,`` ``:``), so apostrophes in prose are harmless. Spans do not
    overlap: after a block is found the scan goes on after it.

    Args:
        text: Any text.

    Returns:
        ``(start, end)`` pairs, ``text[start:end]`` being one block.
    """
    spans: list[tuple[int, int]] = []
    pos, scans, n = 0, 0, len(text)
    while pos < n and scans < MAX_SCANS:
        start = _next_opener(text, pos)
        if start < 0:
            break
        end = _block_end(text, start)
        if end is None:
            scans += 1
            pos = start + 1
        else:
            spans.append((start, end))
            pos = end
    return spans


def _next_opener(text: str, pos: int) -> int:
    starts = [i for i in (text.find("{", pos), text.find("[", pos)) if i >= 0]
    return min(starts) if starts else -1


def _block_end(text: str, start: int) -> int | None:
    """End of the block opening at `start`, or None if it never closes (or closes mismatched)."""
    stack: list[str] = []
    previous = ""  # last non-space character outside strings
    i, n = start, len(text)
    while i < n:
        char = text[i]
        if char in "\"'" and previous in ("{", "[", ",", ":"):
            i = _string_end(text, i)
            previous = char
            continue
        if char in _OPENERS:
            stack.append(_OPENERS[char])
        elif char in "}]":
            if not stack or stack.pop() != char:
                return None
            if not stack:
                return i + 1
        if not char.isspace():
            previous = char
        i += 1
    return None


def loads_lenient(text: str) -> tuple[Any, list[str]]:
    """Parse loosely written JSON.

    Args:
        text: One JSON value, possibly with the repairs listed in the module docstring.

    Returns:
        The value, and the sorted names of the repairs that were needed (empty for strict JSON).

    Raises:
        LenientJSONError: Not JSON even loosely, nested deeper than `MAX_DEPTH`, or followed by
            other text.
    """
    parser = _Parser(text)
    value = parser.value(0)
    parser.skip_space()
    if parser.pos != len(text):
        raise parser.error("unexpected text after the JSON value")
    return value, sorted(parser.repairs)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.repairs: set[str] = set()

    def error(self, message: str) -> LenientJSONError:
        return LenientJSONError(f"{message} at character {self.pos}")

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_space(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            if text[self.pos].isspace():
                self.pos += 1
            elif text.startswith("//", self.pos) or text.startswith("#", self.pos):
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
                self.repairs.add("comments")
            elif text.startswith("/*", self.pos):
                end = text.find("*/", self.pos + 2)
                self.pos = n if end < 0 else end + 2
                self.repairs.add("comments")
            else:
                return

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise self.error(f"nested deeper than {MAX_DEPTH}")
        self.skip_space()
        char = self.peek()
        if char == "{":
            return self.container(depth, "}")
        if char == "[":
            return self.container(depth, "]")
        if char in ("'", '"'):
            return self.string()
        if char and char in "+-.0123456789":
            return self.number()
        word = _WORD_RE.match(self.text, self.pos)
        if word is None:
            raise self.error("expected a JSON value")
        self.pos = word.end()
        if word.group() in _WORDS:
            value, repair = _WORDS[word.group()]
            if repair:
                self.repairs.add(repair)
            return value
        self.repairs.add("unquoted strings")
        return word.group()

    def container(self, depth: int, closer: str) -> Any:
        self.pos += 1
        is_object = closer == "}"
        members: dict[str, Any] = {}
        items: list[Any] = []
        expect_comma = False
        while True:
            self.skip_space()
            char = self.peek()
            if not char:
                raise self.error(f"missing {closer!r}")
            if char == closer:
                self.pos += 1
                return members if is_object else items
            if char == ",":
                if not expect_comma:
                    self.repairs.add("extra commas")
                self.pos += 1
                self.skip_space()
                if self.peek() == closer:
                    self.repairs.add("trailing commas")
                expect_comma = False
                continue
            if expect_comma:
                self.repairs.add("missing commas")
            if is_object:
                key = self.key()
                self.skip_space()
                if self.peek() != ":":
                    raise self.error("expected ':' after an object key")
                self.pos += 1
                members[key] = self.value(depth + 1)
            else:
                items.append(self.value(depth + 1))
            expect_comma = True

    def key(self) -> str:
        if self.peek() in ("'", '"'):
            return self.string()
        word = _WORD_RE.match(self.text, self.pos)
        if word is None:
            raise self.error("expected an object key")
        self.pos = word.end()
        self.repairs.add("unquoted keys")
        return word.group()

    def string(self) -> str:
        text, n = self.text, len(self.text)
        quote = text[self.pos]
        if quote == "'":
            self.repairs.add("single quotes")
        self.pos += 1
        chars: list[str] = []
        while True:
            if self.pos >= n:
                raise self.error("unterminated string")
            char = text[self.pos]
            if char == quote:
                self.pos += 1
                if _closes(text, self.pos):
                    return "".join(chars)
                self.repairs.add("unescaped quotes")
                chars.append(char)
            elif char == "\\":
                chars.append(self.escape())
            else:
                chars.append(char)
                self.pos += 1

    def escape(self) -> str:
        text = self.text
        code = text[self.pos + 1 : self.pos + 2]
        if code in _ESCAPES:
            self.pos += 2
            return _ESCAPES[code]
        if code == "u" and _HEX4_RE.fullmatch(text[self.pos + 2 : self.pos + 6]):
            first = int(text[self.pos + 2 : self.pos + 6], 16)
            self.pos += 6
            low = text[self.pos : self.pos + 6]
            if 0xD800 <= first < 0xDC00 and _LOW_SURROGATE_RE.fullmatch(low):
                second = int(low[2:], 16)
                self.pos += 6
                return chr(0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00))
            return "\ufffd" if 0xD800 <= first < 0xE000 else chr(first)
        self.repairs.add("invalid escapes")
        self.pos += 1
        return "\\"

    def number(self) -> Any:
        text = self.text
        for sign in ("", "-", "+"):
            if text.startswith(sign + "Infinity", self.pos):
                self.pos += len(sign) + len("Infinity")
                return float("-inf") if sign == "-" else float("inf")
        match = _NUMBER_RE.match(text, self.pos)
        if match is None:
            raise self.error("expected a number")
        token = match.group()
        if len(token) > 100:
            raise self.error("number too long")
        self.pos = match.end()
        if token.startswith("+") or token.startswith(".") or token.endswith(".") or re.match(r"-?0\d", token):
            self.repairs.add("number formats")
        if re.fullmatch(r"[+-]?\d+", token):
            return int(token)
        return float(token)
