"""The forgiving JSON reader: strict JSON unchanged, common model mistakes repaired, bounded."""

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gymflow.envs.rewards.lenient_json import MAX_DEPTH, LenientJSONError, json_candidates, loads_lenient

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**18), max_value=10**18)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES, st.booleans(), st.sampled_from([None, 2]))
def test_strict_json_parses_as_json_loads_does(value: Any, ascii_only: bool, indent: int | None) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert loads_lenient(text) == (json.loads(text), [])


@given(st.text(max_size=200))
def test_any_text_parses_or_raises_the_documented_error(text: str) -> None:
    with contextlib.suppress(LenientJSONError):
        loads_lenient(text)
    for start, end in json_candidates(text):
        assert text[start] in "{[" and text[end - 1] in "}]"


@given(st.text(alphabet=st.sampled_from(list("{}[]\"':,\\ abtrue0123.-/*#\nnul")), max_size=120))
def test_json_like_noise_parses_or_raises_the_documented_error(text: str) -> None:
    with contextlib.suppress(LenientJSONError):
        loads_lenient(text)
    json_candidates(text)


@pytest.mark.parametrize(
    ("text", "value", "repairs"),
    [
        ("{'a': 'b'}", {"a": "b"}, ["single quotes"]),
        ('{"a": [1, 2,],}', {"a": [1, 2]}, ["trailing commas"]),
        ('{"a": True, "b": None}', {"a": True, "b": None}, ["python literals"]),
        ('{score: 3, "x-y": 1}', {"score": 3, "x-y": 1}, ["unquoted keys"]),
        ('{"a": yes}', {"a": "yes"}, ["unquoted strings"]),
        ('{"a": "the "best" one"}', {"a": 'the "best" one'}, ["unescaped quotes"]),
        ("{'reason': 'it's fine'}", {"reason": "it's fine"}, ["single quotes", "unescaped quotes"]),
        ('{"a": 1 "b": 2}', {"a": 1, "b": 2}, ["missing commas"]),
        ('{"a": 1, // note\n "b": /* x */ 2}', {"a": 1, "b": 2}, ["comments"]),
        ('{"a": .5, "b": +1, "c": 5.}', {"a": 0.5, "b": 1, "c": 5.0}, ["number formats"]),
        ('{"path": "C:\\d"}', {"path": "C:\\d"}, ["invalid escapes"]),
        ('{"a": "line\nbreak"}', {"a": "line\nbreak"}, []),  # a raw newline in a string is accepted
        ('"\\ud83d\\ude00 \\ud800"', "\U0001f600 \ufffd", []),  # pairs joined, lone surrogates replaced
        ("[NaN, Infinity, -Infinity]", None, []),
    ],
)
def test_repairs(text: str, value: Any, repairs: list[str]) -> None:
    parsed, applied = loads_lenient(text)
    if value is not None:
        assert parsed == value
    assert applied == repairs


def test_non_finite_numbers_are_read() -> None:
    parsed, _ = loads_lenient("[NaN, Infinity, -Infinity]")
    assert parsed[1:] == [float("inf"), float("-inf")]
    assert parsed[0] != parsed[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected a JSON value"),
        ('{"a": 1', "missing '}'"),
        ("{a 1}", "expected ':'"),
        ('{"a" 1}', "unterminated string"),  # a quote before anything but , : } ] is content
        ('"open', "unterminated string"),
        ('{"a": 1} extra', "unexpected text"),
        ("[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2), "nested deeper"),
        ("1" * 101, "number too long"),
        ("{1: 2}", "expected an object key"),
    ],
)
def test_errors(text: str, message: str) -> None:
    with pytest.raises(LenientJSONError, match=message):
        loads_lenient(text)


@pytest.mark.parametrize(
    ("text", "blocks"),
    [
        ('Here: {"a": {"b": 1}} and [1, 2].', ['{"a": {"b": 1}}', "[1, 2]"]),
        ('```json\n{"a": "}"}\n```', ['{"a": "}"}']),  # brackets inside strings do not count
        ("I don't {think} so", ["{think}"]),  # an apostrophe in prose opens no string
        ('{ draft without end {"a": 1}', ['{"a": 1}']),
        ("{]", []),
        ("no blocks", []),
    ],
)
def test_json_candidates(text: str, blocks: list[str]) -> None:
    assert [text[start:end] for start, end in json_candidates(text)] == blocks
