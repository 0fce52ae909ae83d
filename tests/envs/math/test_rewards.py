"""Answer extraction, number parsing, equivalence and the math reward."""

import time
from fractions import Fraction

import pytest

from gymflow.envs.builtin.math.rewards import answer_reward, extract_answer, math_equivalent, parse_number
from gymflow.envs.contract import Message, ToolCall


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>42</answer>", "42"),
        ("<answer> 1 </answer> then <ANSWER>\n 2 \n</Answer>", "2"),
        ("<answer>a &lt; b &amp; c</answer>", "a < b & c"),
        (r"<answer>\boxed{\frac{1}{2}}</answer>", r"\frac{1}{2}"),
        (r"<answer>The result is \boxed{7}.</answer>", "7"),
        ("<answer></answer>", ""),
        ("42", None),
        (r"\boxed{42}", None),
        ("<answer>42", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", Fraction(42)),
        (" -2.5 ", Fraction(-5, 2)),
        ("1,234", Fraction(1234)),
        ("-1,234,567.25", Fraction(-123456725, 100)),
        ("3/4", Fraction(3, 4)),
        ("50%", Fraction(1, 2)),
        ("1e3", Fraction(1000)),
        ("2.5E-1", Fraction(1, 4)),
        ("$12", Fraction(12)),
        ("42.", Fraction(42)),
        ("\u22123", Fraction(-3)),
        ("1e-400", 0.0),
        ("1,23", None),
        ("12 apples", None),
        ("3 / 4", None),
        ("1/0", None),
        ("inf", None),
        ("nan", None),
        ("1e400", None),
        ("", None),
        ("x", None),
    ],
)
def test_parse_number(text: str, expected: Fraction | float | None) -> None:
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    ("pred", "truth"),
    [
        ("42", "42"),
        ("42.0", "42"),
        ("1,000", "1000"),
        ("0.3333333333", "1/3"),
        ("1.0000001", "1"),
        ("2*sqrt(2)", "sqrt(8)"),
        ("2sqrt(2)", "sqrt(8)"),
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac{\sqrt{3}}{2}", "sqrt(3)/2"),
        (r"\sqrt[3]{8}", "2"),
        (r"2 \cdot 3", "6"),
        ("2^10", "1024"),
        ("pi", "3.14159265359"),
        ("(x+1)**2", "x**2 + 2*x + 1"),
        ("10**400", "10**400 + 1"),
        ("50%", "0.5"),
    ],
)
def test_equivalent(pred: str, truth: str) -> None:
    assert math_equivalent(pred, truth)
    assert math_equivalent(truth, pred)


@pytest.mark.parametrize(
    ("pred", "truth"),
    [
        ("41", "42"),
        ("0.33", "1/3"),
        ("", "0"),
        ("unknown", "3"),
        ("x", "y"),
        ("12 apples", "12"),
        ("1/0", "1"),
        ("log(0)", "0"),
        ("sqrt(2)", "1.41"),
    ],
)
def test_not_equivalent(pred: str, truth: str) -> None:
    assert not math_equivalent(pred, truth)


def test_tolerances_are_configurable() -> None:
    assert not math_equivalent("1.01", "1")
    assert math_equivalent("1.01", "1", rel_tol=0.02)
    assert math_equivalent("0.001", "0", abs_tol=0.01)


@pytest.mark.parametrize(
    "hostile",
    [
        "9**9**9**9",
        "10**10**10",
        "exp(exp(100))",
        "2**(2**(2**(2**(2**2))))",
        "(" * 150 + "2" + ")" * 150,
        "1" * 10_000,
        "__import__('os').system('echo pwned')",
        "(1).__class__.__bases__",
        "lambda: 1",
        "x.y",
        "Symbol('a')",
        "eval('1')",
        "1e999999999",
        "factorial(100000)",
        "5!",
    ],
)
def test_hostile_answers_are_rejected_quickly(hostile: str) -> None:
    start = time.monotonic()
    assert not math_equivalent(hostile, "1")
    assert time.monotonic() - start < 5


def _completion(*contents: str) -> list[Message]:
    messages = [Message(role="user", content="Compute 2 + 2")]
    messages += [Message(role="assistant", content=c) for c in contents]
    return messages


def test_answer_reward_correct() -> None:
    reward = answer_reward(_completion("<answer>4</answer>"), "4")
    assert reward.total == 1.0
    assert reward.components == {"correct": 1.0, "format": 1.0}
    assert reward.info == {"extracted": "4"}


def test_answer_reward_wrong_and_numeric_ground_truth() -> None:
    assert answer_reward(_completion("<answer>5</answer>"), 4).components == {"correct": 0.0, "format": 1.0}
    assert answer_reward(_completion("<answer>0.5</answer>"), 0.5).total == 1.0


def test_answer_reward_missing_tag() -> None:
    reward = answer_reward(_completion("It is 4."), "4")
    assert reward.total == 0.0
    assert reward.components == {"correct": 0.0, "format": 0.0}
    assert reward.info == {"extracted": None}


def test_answer_reward_reads_the_last_assistant_message() -> None:
    messages = [
        *_completion("<answer>4</answer>"),
        Message(role="assistant", tool_calls=[ToolCall(id="c", name="add", arguments={"a": 2, "b": 2})]),
        Message(role="tool", content="4", tool_call_id="c"),
        Message(role="assistant", content="I am done."),
    ]
    assert answer_reward(messages, "4").components == {"correct": 0.0, "format": 0.0}
    assert answer_reward([Message(role="user", content="<answer>4</answer>")], "4").total == 0.0
    assert answer_reward(_completion("<answer>4</answer>"), None).total == 0.0
