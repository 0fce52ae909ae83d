"""Rubrics: named criteria a judge scores, and the rule that turns the scores into a Reward.

A criterion is binary (met: 1, not met: 0) or ranged (any value on a scale such as 0..5). Its
polarity says which way it counts: a positive criterion ("cites the statute") adds when met, a
negative one ("makes up a citation") subtracts when met. Each has a weight > 0.

The aggregate (`aggregate`), with every score first mapped to ``s = (score - min) / (max - min)``
in [0, 1]::

    P = sum(w * s over positive criteria)      W+ = sum(w over positive criteria)
    N = sum(w * s over negative criteria)      W- = sum(w over negative criteria)

    total = (P - N) / W+     when the rubric has a positive criterion
    total = -N / W-          when every criterion is negative

So a positive-only rubric scores in [0, 1] (the weighted mean); a mixed rubric scores in
[-W-/W+, 1], where a perfect response without flaws scores 1 and each flaw present costs its
weight in units of the positive total (a flaw weighing as much as all positive criteria together
cancels a perfect response); a negative-only rubric scores in [-1, 0].

Everything here is pure and deterministic, so a workflow may aggregate scores itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gymflow.envs.contract import Reward, Wire

_KEY_RE = re.compile(r"[^0-9a-z]+")


def criterion_key(name: str) -> str:
    """The loose form of a criterion name (casefolded, non-alphanumerics as ``_``) used to match
    the names a judge writes (``"Factual accuracy"`` matches ``factual_accuracy``)."""
    return _KEY_RE.sub("_", name.casefold()).strip("_")


class Criterion(Wire):
    """One thing the judge scores."""

    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=64)
    """Identifier, the component name in the Reward (letters, digits, ``_``, ``-``, ``.``)."""
    description: str = Field(min_length=1)
    """What the judge checks, phrased so that "met" or a high score means the thing is present."""
    kind: Literal["binary", "ranged"] = "binary"
    """``binary``: 1 met, 0 not met. ``ranged``: any value from `scale_min` to `scale_max`."""
    scale_min: float = 0.0
    """Lowest score of a ranged criterion (0 for binary)."""
    scale_max: float = 1.0
    """Highest score of a ranged criterion (1 for binary)."""
    weight: float = Field(default=1.0, gt=0)
    """Relative importance."""
    polarity: Literal["positive", "negative"] = "positive"
    """``negative``: a flaw; when met (or scored high) it subtracts from the total."""

    @model_validator(mode="after")
    def _valid_scale(self) -> Criterion:
        if not all(math.isfinite(v) for v in (self.scale_min, self.scale_max, self.weight)):
            raise ValueError(f"criterion {self.name!r}: scale and weight must be finite")
        if self.kind == "binary" and (self.scale_min, self.scale_max) != (0.0, 1.0):
            raise ValueError(f"criterion {self.name!r}: a binary criterion's scale is 0..1")
        if self.scale_max <= self.scale_min:
            raise ValueError(f"criterion {self.name!r}: scale_max must exceed scale_min")
        return self

    def normalized(self, score: float) -> float:
        """`score` mapped from the criterion's scale to [0, 1]."""
        return (score - self.scale_min) / (self.scale_max - self.scale_min)


class Rubric(Wire):
    """Criteria scored by a judge, aggregated by `aggregate` (see the module docstring)."""

    criteria: list[Criterion] = Field(min_length=1, max_length=64)
    """The criteria, in the order the judge sees them."""
    instructions: str = ""
    """Extra guidance for the judge (what counts as correct, how strict to be)."""

    @field_validator("criteria")
    @classmethod
    def _distinct_names(cls, criteria: list[Criterion]) -> list[Criterion]:
        seen: dict[str, str] = {}
        for criterion in criteria:
            key = criterion_key(criterion.name)
            if key in seen:
                raise ValueError(f"criteria {seen[key]!r} and {criterion.name!r} have the same name")
            seen[key] = criterion.name
        return criteria

    @property
    def names(self) -> list[str]:
        """Criterion names in order."""
        return [criterion.name for criterion in self.criteria]


def check_score(criterion: Criterion, score: float) -> float:
    """`score` as a float, validated against the criterion's scale.

    Raises:
        ValueError: The score is not a finite number, a binary score is not 0 or 1, or a ranged
            score is outside the scale.
    """
    if isinstance(score, bool):
        score = float(score)
    if not isinstance(score, int | float) or not math.isfinite(score):
        raise ValueError(f"score of {criterion.name!r} must be a finite number, got {score!r}")
    value = float(score)
    if criterion.kind == "binary" and value not in (0.0, 1.0):
        raise ValueError(f"score of binary criterion {criterion.name!r} must be 0 or 1, got {value!r}")
    if not criterion.scale_min <= value <= criterion.scale_max:
        raise ValueError(
            f"score of {criterion.name!r} must be within {criterion.scale_min:g}..{criterion.scale_max:g}, "
            f"got {value!r}"
        )
    return value


def aggregate(rubric: Rubric, scores: Mapping[str, float], *, reasons: Mapping[str, str] | None = None) -> Reward:
    """Combine per-criterion scores into a Reward (formula in the module docstring).

    Args:
        rubric: The rubric that was scored.
        scores: One score per criterion, by exact name, on the criterion's own scale.
        reasons: Optional explanations per criterion, kept in ``info["reasons"]``.

    Returns:
        ``Reward(total=..., components={name: score as given}, info={"normalized": {name: s},
        "reasons": {...}})``; ``reasons`` is present only when given.

    Raises:
        ValueError: A criterion has no score, a score names no criterion, or a score is invalid
            (see `check_score`); the message names the criteria.
    """
    names = set(rubric.names)
    missing = [name for name in rubric.names if name not in scores]
    unknown = sorted(set(scores) - names)
    if missing or unknown:
        problems = []
        if missing:
            problems.append("missing scores for " + ", ".join(missing))
        if unknown:
            problems.append("scores for unknown criteria " + ", ".join(unknown))
        raise ValueError("; ".join(problems))
    components: dict[str, float] = {}
    normalized: dict[str, float] = {}
    positive: list[tuple[float, float]] = []  # (weight, normalised score)
    negative: list[tuple[float, float]] = []
    for criterion in rubric.criteria:
        value = check_score(criterion, scores[criterion.name])
        components[criterion.name] = value
        normalized[criterion.name] = criterion.normalized(value)
        bucket = positive if criterion.polarity == "positive" else negative
        bucket.append((criterion.weight, normalized[criterion.name]))
    earned = math.fsum(w * s for w, s in positive)
    lost = math.fsum(w * s for w, s in negative)
    if positive:
        total = (earned - lost) / math.fsum(w for w, _ in positive)
    else:
        total = -lost / math.fsum(w for w, _ in negative) if lost else 0.0  # no -0.0 in results
    info: dict[str, object] = {"normalized": normalized}
    if reasons is not None:
        info["reasons"] = {name: reasons[name] for name in rubric.names if name in reasons}
    return Reward(total=total, components=components, info=info)
