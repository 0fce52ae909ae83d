"""Reward functions the rescore tests name by file (`rescore_rewards.py:NAME`), as a user's would be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gymflow.envs.rewards import extract_answer


def brevity(completion: str, ground_truth: Any, **kwargs: Any) -> dict[str, float]:
    """Correctness of the <answer>, and a bonus for a short final message: other values than the env's."""
    del kwargs
    correct = float(extract_answer(completion) == str(ground_truth))
    return {"correct": correct, "brevity": round(1.0 / (1 + len(completion)), 6)}


def reads_workspace(completion: str, ground_truth: Any, workspace: Path, **kwargs: Any) -> float:
    """A reward that reads the rollout's files: it needs the live rollout."""
    del completion, ground_truth, kwargs
    return float((workspace / "answer.txt").is_file())


def needs_more(completion: str, ground_truth: Any, judge_url: str) -> float:
    """A reward whose signature cannot take the call (`judge_url` is never passed)."""
    del completion, ground_truth, judge_url
    return 0.0
