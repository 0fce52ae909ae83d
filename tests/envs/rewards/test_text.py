"""Exact and SQuAD-normalised match, token F1, set IoU."""

import pytest

from gymflow.envs.rewards.text import exact_match, normalize_answer, normalized_match, set_iou, split_items, token_f1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The  Eiffel-Tower!", "eiffeltower"),
        ("A cat, an apple and THE end.", "cat apple and end"),
        ("theory", "theory"),  # articles are whole words only
        ("  \t\n ", ""),
        ("Straße", "strasse"),  # casefold
        ("«Paris»", "paris"),  # Unicode punctuation
        ("\uff11\uff12\uff13", "123"),  # NFKC: full-width digits
        ("$5 + 3", "5 3"),  # ASCII punctuation includes symbols, as in SQuAD
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match() -> None:
    assert exact_match(" Paris\n", "Paris")
    assert not exact_match("paris", "Paris")
    assert exact_match("Rome", ["Paris", "Rome"])
    with pytest.raises(ValueError, match="reference"):
        exact_match("x", [])


def test_normalized_match() -> None:
    assert normalized_match("the Paris.", "paris")
    assert normalized_match("An Apple", ["pear", "apple"])
    assert not normalized_match("Paris, France", "Paris")
    assert normalized_match("", "the")  # both normalise to nothing


@pytest.mark.parametrize(
    ("pred", "truth", "f1"),
    [
        ("the cat sat", "cat sat", 1.0),
        ("cat", "cat sat", 2 * 1.0 * 0.5 / 1.5),
        ("cat cat dog", "cat mouse", 2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2)),  # multiset: one "cat" in common
        ("dog", "cat", 0.0),
        ("", "the", 1.0),  # both empty after normalisation (SQuAD v2)
        ("a", "cat", 0.0),
    ],
)
def test_token_f1(pred: str, truth: str, f1: float) -> None:
    assert token_f1(pred, truth) == pytest.approx(f1)


def test_token_f1_takes_the_best_reference() -> None:
    assert token_f1("new york city", ["york", "new york city"]) == 1.0
    assert token_f1("new york", ["york", "boston"]) == pytest.approx(2 / 3)


def test_split_items() -> None:
    assert split_items("Paris, Rome;  Oslo\n\n,") == ["Paris", "Rome", "Oslo"]
    assert split_items("a|b", separators="|") == ["a", "b"]
    assert split_items(" a,b ", separators="") == ["a,b"]
    assert split_items("  ") == []


@pytest.mark.parametrize(
    ("pred", "truth", "iou"),
    [
        (["Paris", "Rome"], ["rome", "the Paris"], 1.0),
        (["Paris", "Rome"], ["Paris", "Oslo"], 1 / 3),
        (["Paris", "paris", "PARIS."], ["Paris"], 1.0),  # a set: duplicates count once
        ([], [], 1.0),
        (["x"], [], 0.0),
        (["the", "!"], [], 1.0),  # items that normalise to nothing are dropped
    ],
)
def test_set_iou(pred: list[str], truth: list[str], iou: float) -> None:
    assert set_iou(pred, truth) == pytest.approx(iou)


def test_set_iou_without_normalisation() -> None:
    assert set_iou(["Paris "], ["paris"], normalize=False) == 0.0
    assert set_iou(["Paris "], ["Paris"], normalize=False) == 1.0
    assert set_iou(split_items("x, y, z"), split_items("z; y")) == pytest.approx(2 / 3)
    assert set_iou(split_items("a, b"), split_items("b")) == 1.0  # "a" is an article: dropped
