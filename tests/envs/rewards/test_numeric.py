"""Numeric tolerance and the math equivalence the math env re-exports."""

from fractions import Fraction

import pytest

from gymflow.envs.builtin.math import rewards as math_rewards
from gymflow.envs.rewards import numeric
from gymflow.envs.rewards.numeric import math_equivalent, numeric_close


def test_math_env_reuses_the_library() -> None:
    assert math_rewards.math_equivalent is numeric.math_equivalent
    assert math_rewards.parse_number is numeric.parse_number


@pytest.mark.parametrize(
    ("pred", "truth", "kwargs", "expected"),
    [
        ("3.14", "3.14159", {"rel_tol": 1e-3}, True),
        ("3.14", "3.14159", {}, False),
        ("1,000", 1000, {}, True),
        ("50%", 0.5, {}, True),
        (0.1 + 0.2, "0.3", {}, True),
        (Fraction(1, 3), "0.333333", {}, False),
        (Fraction(1, 3), "0.333333", {"rel_tol": 1e-5}, True),
        ("0.001", 0, {"abs_tol": 0.01}, True),
        ("0.001", 0, {"abs_tol": 0.0, "rel_tol": 0.5}, False),  # relative to the larger: |0.001|/0.001 = 1
        ("12 apples", 12, {}, False),
        ("nan", "nan", {}, False),
        (float("inf"), float("inf"), {}, False),
        (True, 1, {}, False),  # booleans are not numbers
    ],
)
def test_numeric_close(pred: object, truth: object, kwargs: dict[str, float], expected: bool) -> None:
    assert numeric_close(pred, truth, **kwargs) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"rel_tol": -1.0}, {"abs_tol": float("nan")}, {"rel_tol": float("inf")}])
def test_numeric_close_rejects_bad_tolerances(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="tolerances"):
        numeric_close(1, 1, **kwargs)


def test_math_equivalence_lives_in_the_library() -> None:
    assert math_equivalent(r"\frac{\sqrt{2}}{2}", "1/sqrt(2)")
    assert not math_equivalent("9**9**9**9", "1")
