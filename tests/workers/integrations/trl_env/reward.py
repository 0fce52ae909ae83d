"""The TRL test env's reward: the share of digits in the final answer, in [0, 1]."""

from typing import Any


def digits(completion: str, **kwargs: Any) -> float:
    del kwargs
    return sum(ch.isdigit() for ch in completion) / len(completion) if completion else 0.0
