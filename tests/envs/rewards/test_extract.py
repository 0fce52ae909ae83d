"""Answer extraction and format checks."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gymflow.envs.builtin.math import rewards as math_rewards
from gymflow.envs.rewards import extract
from gymflow.envs.rewards.extract import (
    extract_answer,
    extract_boxed,
    extract_tag,
    extract_tags,
    follows_tag_format,
    matches_pattern,
    tag_format_score,
)


def test_math_env_reuses_the_library() -> None:
    assert math_rewards.extract_answer is extract.extract_answer


@pytest.mark.parametrize(
    ("text", "tag", "expected"),
    [
        ("<answer>42</answer>", "answer", ["42"]),
        ("<ANSWER> a </Answer> x <answer>b</answer>", "answer", ["a", "b"]),
        ("<final_answer>x &amp; y</final_answer>", "final_answer", ["x & y"]),
        ("<think>\nstep\n</think>", "think", ["step"]),
        ("<answer>unclosed", "answer", []),
        ("<answer>a<answer>b</answer>", "answer", ["a<answer>b"]),  # no nesting: up to the first close
        ("<answers>1</answers>", "answer", []),
    ],
)
def test_extract_tags(text: str, tag: str, expected: list[str]) -> None:
    assert extract_tags(text, tag) == expected


def test_extract_tag_last_or_first() -> None:
    text = "<answer>draft</answer> ... <answer>final</answer>"
    assert extract_tag(text) == "final"
    assert extract_tag(text, last=False) == "draft"
    assert extract_tag("no tag here") is None


@pytest.mark.parametrize("tag", ["", "a b", "<x>", "1abc", "a|b"])
def test_invalid_tag_names(tag: str) -> None:
    with pytest.raises(ValueError, match="invalid tag name"):
        extract_tag("<x>1</x>", tag)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{42}", "42"),
        (r"first \boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{a{b}c", None),
        ("nothing", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_extract_answer_with_other_tag_and_no_unwrap() -> None:
    assert extract_answer(r"<result>\boxed{7}</result>", "result") == "7"
    assert extract_answer(r"<answer>\boxed{7}</answer>", unwrap_boxed=False) == r"\boxed{7}"


def test_matches_pattern() -> None:
    assert matches_pattern("The answer is 42.", r"\d+")
    assert not matches_pattern("The answer is 42.", r"\d+", full=True)
    assert matches_pattern("ABC", "abc", full=True, flags=re.IGNORECASE)
    assert matches_pattern("x=1", re.compile(r"x=\d"))
    with pytest.raises(re.error):
        matches_pattern("x", "(")


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("<think>a</think><answer>b</answer>", 1.0),
        ("<answer>b</answer><think>a</think>", 1.0),  # order is not checked
        ("<think>a</think>", 0.5),
        ("<think>a</think><answer>b</answer><answer>c</answer>", 0.5),  # answer twice
        ("<think>a</think><answer>b", 0.5),
        ("plain", 0.0),
    ],
)
def test_tag_format_score(text: str, score: float) -> None:
    assert tag_format_score(text, ["think", "answer"]) == score


def test_tag_format_score_without_tags() -> None:
    assert tag_format_score("anything", []) == 1.0


@pytest.mark.parametrize(
    ("text", "allow_outside", "expected"),
    [
        ("<think>a</think>\n<answer>b</answer>", False, True),
        ("  <think>a</think> <answer>b</answer>\n", False, True),
        ("Sure! <think>a</think><answer>b</answer>", False, False),
        ("Sure! <think>a</think><answer>b</answer> Bye", True, True),
        ("<answer>b</answer><think>a</think>", True, False),  # wrong order
        ("<think>a <answer>b</answer></think>", True, False),  # nested
        ("<think>a</think>", True, False),
    ],
)
def test_follows_tag_format(text: str, allow_outside: bool, expected: bool) -> None:
    assert follows_tag_format(text, ["think", "answer"], allow_outside=allow_outside) is expected


def test_follows_tag_format_rejects_repeated_tags() -> None:
    with pytest.raises(ValueError, match="repeated"):
        follows_tag_format("", ["answer", "Answer"])


@given(st.text(alphabet=st.sampled_from(list("<>/answer{}\\boxed &;lt")), max_size=60))
def test_extraction_never_raises_on_model_text(text: str) -> None:
    extract_answer(text)
    tag_format_score(text, ["answer"])
    follows_tag_format(text, ["answer"], allow_outside=False)
