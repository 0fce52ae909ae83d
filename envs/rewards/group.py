"""Rewards of a group: several rollouts of the same prompt, scored relative to each other.

Three pure, deterministic tools a group workflow (or `BaseEnv.compute_group_reward`) combines:

* `rank_rewards`: the rank of each reward in its group, scaled to [0, 1]. Ties share the mean of
  the ranks they span (fractional ranking)::

      rank_reward_i = (mean rank of r_i, 1-based, ascending - 1) / (n - 1)

  so the best gets 1, the worst 0, a tie of everyone (or a group of one) 0.5.
* `grpo_advantages`: GRPO's group-relative advantage ``A_i = (r_i - mean(r)) / (std(r) + eps)``
  (Shao et al. 2024), ``std`` being the group's population standard deviation (``ddof=0``: a
  0/1 group of half successes gets advantages of about +1 and -1; TRL and verl divide by the
  sample standard deviation, ``ddof=1``, an option here). ``scale_by_std=False`` gives Dr.
  GRPO's ``A_i = r_i - mean(r)`` (Liu et al. 2025), which does not up-weight groups whose rewards
  barely differ. A group whose rewards are all equal, or a group of one, has advantages of
  exactly 0. `group_advantages` does the same over a group with infra failures (None rewards),
  which are left out of the statistics and get None.
* `diversity_scale`: near-duplicate completions share their reward. Each completion becomes the
  set of its word 3-grams (casefolded ``\\w+`` words; a text shorter than 3 words is one shingle
  of all its words). Two completions are near-duplicates when the Jaccard similarity of their
  sets is at least `threshold` (0.8). Clusters are the connected components of that relation
  (single linkage, so A~B and B~C put A, B and C together whatever the order). Then::

      scaled_i = r_i / k_i ** power    if r_i > 0     (k_i: size of i's cluster, power 1)
      scaled_i = r_i                   otherwise

  With power 1, k copies of one answer together earn what one would: sampling the same answer
  again brings no new reward. Zero and negative rewards are kept: shrinking a penalty towards 0
  would reward repeating a bad answer.

Inputs are validated (finite numbers, equal lengths); nothing depends on set or dict iteration
order, so the same group always gets the same result.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gymflow.envs.contract import Message

_WORD_RE = re.compile(r"\w+")


def _finite(rewards: Sequence[float]) -> list[float]:
    values = [float(r) for r in rewards]
    bad = [r for r in values if not math.isfinite(r)]
    if bad:
        raise ValueError(f"group rewards must be finite, got {bad!r}")
    return values


def rank_rewards(rewards: Sequence[float]) -> list[float]:
    """Each reward's rank within the group, scaled to [0, 1] (ties share their mean rank).

    Args:
        rewards: The group's rewards (higher is better).

    Returns:
        One value per reward: 1 for the best, 0 for the worst, 0.5 for a full tie or a group of
        one; empty for an empty group.

    Raises:
        ValueError: A reward is not finite.
    """
    values = _finite(rewards)
    n = len(values)
    if n == 1:
        return [0.5]
    order = sorted(range(n), key=lambda i: (values[i], i))
    ranked = [0.0] * n
    start = 0
    while start < n:
        end = start
        while end + 1 < n and values[order[end + 1]] == values[order[start]]:
            end += 1
        mean_position = (start + end) / 2  # 0-based mean rank of the tie
        for position in range(start, end + 1):
            ranked[order[position]] = mean_position / (n - 1)
        start = end + 1
    return ranked


def grpo_advantages(
    rewards: Sequence[float], *, scale_by_std: bool = True, eps: float = 1e-6, ddof: int = 0
) -> list[float]:
    """Group-relative advantages: ``(r - mean) / (std + eps)``, or ``r - mean`` (Dr. GRPO).

    Args:
        rewards: The group's rewards.
        scale_by_std: Divide by the group's standard deviation (GRPO); False keeps the mean-centred
            rewards (Dr. GRPO).
        eps: Added to the standard deviation to avoid dividing by 0.
        ddof: Delta degrees of freedom of the standard deviation: 0 for the population standard
            deviation, 1 for the sample one (as TRL and verl compute it).

    Returns:
        One advantage per reward; all exactly 0 when the rewards are all equal or there is one.

    Raises:
        ValueError: A reward is not finite, `eps` is negative, or `ddof` is not 0 or 1.
    """
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")
    values = _finite(rewards)
    n = len(values)
    if n <= 1 or min(values) == max(values):
        return [0.0] * n
    mean = math.fsum(values) / n
    centred = [v - mean for v in values]
    if not scale_by_std:
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / (n - ddof))
    return [c / (std + eps) for c in centred]


def group_advantages(
    rewards: Sequence[float | None], *, scale_by_std: bool = True, eps: float = 1e-6, ddof: int = 0
) -> list[float | None]:
    """`grpo_advantages` over the scored members of a group; None (an infra failure) stays None.

    Infra-failed rollouts are left out of the mean and the standard deviation: they are dropped
    by the trainer, never counted as reward 0.

    Args:
        rewards: The group's rewards, None for rollouts without one.
        scale_by_std: Divide by the standard deviation (GRPO) or not (Dr. GRPO).
        eps: Added to the standard deviation.
        ddof: 0 for the population standard deviation, 1 for the sample one.

    Returns:
        One advantage per reward, None where the reward is None.

    Raises:
        ValueError: As `grpo_advantages`.
    """
    scored = [r for r in rewards if r is not None]
    advantages = iter(grpo_advantages(scored, scale_by_std=scale_by_std, eps=eps, ddof=ddof))
    return [None if r is None else next(advantages) for r in rewards]


def completion_text(messages: Sequence[Message]) -> str:
    """The text a rollout's model wrote: its assistant messages' content, one per line."""
    return "\n".join(m.content for m in messages if m.role == "assistant" and m.content)


def word_ngrams(text: str, n: int = 3) -> frozenset[tuple[str, ...]]:
    """The set of word n-grams (shingles) of `text`, words casefolded (NFKC first).

    Args:
        text: Any text.
        n: Words per shingle.

    Returns:
        The shingles; a text of fewer than `n` words is one shingle of all of them, a text with no
        words has none.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    words = _WORD_RE.findall(unicodedata.normalize("NFKC", text).casefold())
    if len(words) < n:
        return frozenset({tuple(words)}) if words else frozenset()
    return frozenset(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def jaccard(a: frozenset[tuple[str, ...]], b: frozenset[tuple[str, ...]]) -> float:
    """``|a & b| / |a | b|``; 1.0 when both are empty."""
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def near_duplicate_clusters(texts: Sequence[str], *, n: int = 3, threshold: float = 0.8) -> list[int]:
    """Cluster texts whose word n-gram Jaccard similarity is at least `threshold` (single linkage).

    Args:
        texts: The completions.
        n: Words per shingle.
        threshold: Similarity from which two texts are near-duplicates, in (0, 1].

    Returns:
        For each text, its cluster's label: the smallest index in the cluster.

    Raises:
        ValueError: `threshold` is outside (0, 1] or `n` < 1.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    shingles = [word_ngrams(text, n) for text in texts]
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            if jaccard(shingles[i], shingles[j]) >= threshold:
                a, b = root(i), root(j)
                parent[max(a, b)] = min(a, b)  # the root is always the smallest index
    return [root(i) for i in range(len(texts))]


@dataclass(frozen=True)
class DiversityScaling:
    """What `diversity_scale` did to a group's rewards."""

    rewards: list[float]
    """The scaled rewards."""
    factors: list[float]
    """The factor each positive reward was multiplied by, ``1 / k ** power``."""
    clusters: list[int]
    """Cluster label of each completion (the smallest index in its cluster)."""


def diversity_scale(
    rewards: Sequence[float],
    completions: Sequence[str],
    *,
    n: int = 3,
    threshold: float = 0.8,
    power: float = 1.0,
) -> DiversityScaling:
    """Scale down the positive rewards of near-duplicate completions (rule in the module docstring).

    Args:
        rewards: The group's rewards.
        completions: The text of each rollout (see `completion_text`), in the same order.
        n: Words per shingle.
        threshold: Jaccard similarity from which two completions are near-duplicates.
        power: How hard duplicates are penalised: a reward is divided by ``k ** power`` for a
            cluster of k; 0 turns scaling off.

    Returns:
        The scaled rewards with their factors and clusters.

    Raises:
        ValueError: Lengths differ, a reward is not finite, or a parameter is out of range.
    """
    if len(rewards) != len(completions):
        raise ValueError(f"{len(rewards)} rewards but {len(completions)} completions")
    if not (math.isfinite(power) and power >= 0):
        raise ValueError(f"power must be finite and >= 0, got {power!r}")
    values = _finite(rewards)
    clusters = near_duplicate_clusters(completions, n=n, threshold=threshold)
    sizes = Counter(clusters)
    factors = [1.0 / sizes[label] ** power for label in clusters]
    scaled = [v * f if v > 0 else v for v, f in zip(values, factors, strict=True)]
    return DiversityScaling(rewards=scaled, factors=factors, clusters=clusters)
