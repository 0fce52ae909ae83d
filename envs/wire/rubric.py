"""A rubric: named criteria a judge scores (`Criterion`, `Rubric`), a wire type of the env contract.

`BaseEnv.rubric(task)` returns one and a rollout's judge settings may carry one, so it sits beside the
other wire models; the rule that turns the judge's scores into a `Reward` is
gymflow.envs.rewards.rubric (`aggregate`).
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gymflow.envs.wire.models import Wire

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
