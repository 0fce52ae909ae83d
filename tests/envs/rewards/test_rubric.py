"""Rubric validation and the aggregate formula, checked by hand."""

import pytest
from pydantic import ValidationError

from gymflow.envs.contract import Reward
from gymflow.envs.rewards.rubric import aggregate
from gymflow.envs.wire.rubric import Criterion, Rubric, criterion_key


def _rubric(*criteria: Criterion) -> Rubric:
    return Rubric(criteria=list(criteria))


ACCURATE = Criterion(name="accurate", description="The answer is correct.", weight=3)
CLEAR = Criterion(name="clarity", description="Clear writing.", kind="ranged", scale_min=0, scale_max=5)
MADE_UP = Criterion(name="made_up_citation", description="Makes up a citation.", polarity="negative", weight=2)
RAMBLING = Criterion(
    name="rambling", description="Rambles.", kind="ranged", scale_min=1, scale_max=3, polarity="negative"
)


def test_positive_only_is_the_weighted_mean_in_unit_range() -> None:
    rubric = _rubric(ACCURATE, CLEAR)
    # (3 * 1 + 1 * 4/5) / (3 + 1) = 0.95
    reward = aggregate(rubric, {"accurate": 1, "clarity": 4})
    assert reward.total == pytest.approx(0.95)
    assert reward.components == {"accurate": 1.0, "clarity": 4.0}
    assert reward.info["normalized"] == {"accurate": 1.0, "clarity": pytest.approx(0.8)}
    assert "reasons" not in reward.info
    assert aggregate(rubric, {"accurate": 0, "clarity": 0}).total == 0.0
    assert aggregate(rubric, {"accurate": 1, "clarity": 5}).total == 1.0


def test_mixed_polarity_subtracts_flaws_in_units_of_the_positive_weight() -> None:
    rubric = _rubric(ACCURATE, CLEAR, MADE_UP, RAMBLING)
    # P = 3*1 + 1*1 = 4, W+ = 4; N = 2*1 + 1*(2-1)/(3-1) = 2.5 -> (4 - 2.5) / 4
    reward = aggregate(rubric, {"accurate": 1, "clarity": 5, "made_up_citation": 1, "rambling": 2})
    assert reward.total == pytest.approx(0.375)
    assert aggregate(rubric, {"accurate": 1, "clarity": 5, "made_up_citation": 0, "rambling": 1}).total == 1.0
    # The floor: nothing earned, every flaw at its worst: -(2 + 1) / 4
    worst = aggregate(rubric, {"accurate": 0, "clarity": 0, "made_up_citation": 1, "rambling": 3})
    assert worst.total == pytest.approx(-0.75)


def test_negative_only_scores_in_minus_one_to_zero() -> None:
    rubric = _rubric(MADE_UP, RAMBLING)
    assert aggregate(rubric, {"made_up_citation": 0, "rambling": 1}).total == 0.0
    assert str(aggregate(rubric, {"made_up_citation": 0, "rambling": 1}).total) == "0.0"  # not -0.0
    # -(2*1 + 1*0.5) / 3
    assert aggregate(rubric, {"made_up_citation": 1, "rambling": 2}).total == pytest.approx(-2.5 / 3)
    assert aggregate(rubric, {"made_up_citation": 1, "rambling": 3}).total == -1.0


def test_reasons_are_kept_in_info() -> None:
    reward = aggregate(_rubric(ACCURATE), {"accurate": True}, reasons={"accurate": "right", "other": "x"})
    assert reward.total == 1.0
    assert reward.info["reasons"] == {"accurate": "right"}
    assert Reward.model_validate_json(reward.model_dump_json()) == reward  # travels as JSON


@pytest.mark.parametrize(
    ("scores", "message"),
    [
        ({"accurate": 1}, "missing scores for clarity"),
        ({"accurate": 1, "clarity": 2, "extra": 1}, "unknown criteria extra"),
        ({"accurate": 0.5, "clarity": 2}, "must be 0 or 1"),
        ({"accurate": 1, "clarity": 6}, r"within 0\.\.5"),
        ({"accurate": 1, "clarity": float("nan")}, "finite"),
        ({"accurate": 1, "clarity": "3"}, "finite number"),
    ],
)
def test_invalid_scores(scores: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        aggregate(_rubric(ACCURATE, CLEAR), scores)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "x", "description": "d", "scale_max": 5}, "binary criterion's scale is 0..1"),
        ({"name": "x", "description": "d", "kind": "ranged", "scale_min": 3, "scale_max": 3}, "must exceed"),
        ({"name": "x", "description": "d", "weight": 0}, "greater than 0"),
        ({"name": "x", "description": "d", "weight": float("inf")}, "finite"),
        ({"name": "has space", "description": "d"}, "pattern"),
        ({"name": "x", "description": ""}, "at least 1 character"),
        ({"name": "x", "description": "d", "polarity": "neutral"}, "positive"),
    ],
)
def test_invalid_criteria(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Criterion.model_validate(fields)


def test_rubric_needs_distinct_names_and_a_criterion() -> None:
    with pytest.raises(ValidationError, match="same name"):
        _rubric(
            Criterion(name="Factual-Accuracy", description="d"), Criterion(name="factual_accuracy", description="e")
        )
    with pytest.raises(ValidationError, match="at least 1"):
        Rubric(criteria=[])


def test_criterion_key() -> None:
    assert criterion_key(" Factual accuracy! ") == "factual_accuracy"
    assert criterion_key("made-up.citation") == "made_up_citation"


def test_rubric_round_trips_as_json() -> None:
    rubric = _rubric(ACCURATE, CLEAR, MADE_UP)
    assert Rubric.model_validate_json(rubric.model_dump_json()) == rubric
    assert rubric.names == ["accurate", "clarity", "made_up_citation"]
