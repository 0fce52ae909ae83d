"""The rule that turns a judge's scores of a rubric (gymflow.envs.wire.rubric) into a Reward.

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
from collections.abc import Mapping

from gymflow.envs.wire.models import Reward
from gymflow.envs.wire.rubric import Criterion, Rubric


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
