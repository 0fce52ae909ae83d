"""Math rewards: read the answer out of a completion and check it against the ground truth.

Design decisions:

* The answer is the last ``<answer>...</answer>`` of the last assistant message (case-insensitive,
  XML entities unescaped); a ``\\boxed{...}`` inside the tag is unwrapped. No tag means format 0
  and correct 0: the format is part of what is trained.
* Equivalence is numeric first (exact Fractions, then `rel_tol`/`abs_tol`), then symbolic with
  sympy for forms like ``2*sqrt(2)`` vs ``sqrt(8)`` or ``\\frac{1}{2}`` vs ``0.5``.
* The extraction and equivalence helpers live in the reward library (`gymflow.envs.rewards.extract`,
  `gymflow.envs.rewards.numeric`, where the safety rules for untrusted model text are documented); they
  are re-exported here, so ``from gymflow.envs.builtin.math.rewards import extract_answer`` keeps working.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gymflow.envs.contract import Message, Reward
from gymflow.envs.rewards.extract import extract_answer
from gymflow.envs.rewards.numeric import MAX_MAGNITUDE_DIGITS, MAX_SYMBOLIC_CHARS, math_equivalent, parse_number

__all__ = [
    "MAX_MAGNITUDE_DIGITS",
    "MAX_SYMBOLIC_CHARS",
    "answer_reward",
    "extract_answer",
    "math_equivalent",
    "parse_number",
]


def answer_reward(completion: Sequence[Message], ground_truth: Any) -> Reward:
    """Score a math rollout by its final answer.

    Args:
        completion: The rollout's messages; the answer is read from the last assistant message.
        ground_truth: The expected answer (a string or a number).

    Returns:
        ``Reward(total=correct, components={"correct": 0|1, "format": 0|1},
        info={"extracted": answer or None})``.
    """
    last = next((m for m in reversed(completion) if m.role == "assistant"), None)
    extracted = extract_answer(last.content) if last is not None else None
    correct = 0.0
    if extracted is not None and ground_truth is not None and not isinstance(ground_truth, bool):
        truth = ground_truth if isinstance(ground_truth, str) else str(ground_truth)
        correct = 1.0 if math_equivalent(extracted, truth) else 0.0
    fmt = 0.0 if extracted is None else 1.0
    return Reward(total=correct, components={"correct": correct, "format": fmt}, info={"extracted": extracted})
