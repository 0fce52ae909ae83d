"""Search rewards: the answer (token F1, exact match) and the citation of a gold document.

The last assistant message answers in ``<answer>...</answer>`` and cites documents with
``<cite>DOC_ID</cite>`` (any number). The total is ``0.8 x F1 + 0.2 x citation``: F1 is
SQuAD's token F1 against the best reference (partial credit for a partly right span), citation is
1 when any cited document is a gold one. Exact match (SQuAD-normalised) is reported as a
component but not added: it is F1's special case. No answer tag scores 0 everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gymflow.envs.contract import Message, Reward
from gymflow.envs.rewards.extract import extract_answer, extract_tags
from gymflow.envs.rewards.text import normalized_match, token_f1
from gymflow.envs.wire.rubric import Criterion, Rubric

ANSWER_WEIGHT = 0.8
CITATION_WEIGHT = 0.2


def search_reward(completion: Sequence[Message], ground_truth: Any) -> Reward:
    """Score a search rollout (see the module docstring).

    Args:
        completion: The rollout's messages; the last assistant message is read.
        ground_truth: ``{"answers": [...], "doc_ids": [...]}`` (`gymflow.envs.builtin.search.data.SearchTruth`).
    """
    last = next((m for m in reversed(completion) if m.role == "assistant"), None)
    text = last.content if last is not None else ""
    answer = extract_answer(text)
    answers = [str(a) for a in ground_truth.get("answers", [])] if isinstance(ground_truth, dict) else []
    gold = {str(d) for d in ground_truth.get("doc_ids", [])} if isinstance(ground_truth, dict) else set()
    cited = [c.strip() for c in extract_tags(text, "cite")]
    f1 = token_f1(answer, answers) if answer is not None and answers else 0.0
    exact = float(answer is not None and bool(answers) and normalized_match(answer, answers))
    citation = float(answer is not None and any(c in gold for c in cited))
    return Reward(
        total=ANSWER_WEIGHT * f1 + CITATION_WEIGHT * citation,
        components={"f1": f1, "exact_match": exact, "citation": citation},
        info={"answer": answer, "cited": cited},
    )


def correctness_rubric() -> Rubric:
    """What an LLM judge scores when one is configured: the answer matches the reference."""
    return Rubric(
        criteria=[
            Criterion(
                name="correct",
                description="The final answer states the same fact as the reference answer (wording may differ).",
            ),
            Criterion(
                name="supported",
                description="The answer is backed by documents the assistant read through its tools.",
            ),
        ]
    )
