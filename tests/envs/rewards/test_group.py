"""Group rewards: ranks, GRPO / Dr. GRPO advantages, near-duplicate diversity scaling."""

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gymflow.envs.contract import Message
from gymflow.envs.rewards.group import (
    completion_text,
    diversity_scale,
    group_advantages,
    grpo_advantages,
    jaccard,
    near_duplicate_clusters,
    rank_rewards,
    word_ngrams,
)


@pytest.mark.parametrize(
    ("rewards", "ranks"),
    [
        ([0.2, 0.9, 0.5], [0.0, 1.0, 0.5]),
        ([3, 1, 3, 2], [(2 + 3) / 2 / 3, 0.0, (2 + 3) / 2 / 3, 1 / 3]),  # the two 3s share ranks 2 and 3
        ([1, 1, 1], [0.5, 0.5, 0.5]),
        ([7], [0.5]),
        ([], []),
        ([-1.0, -5.0], [1.0, 0.0]),
    ],
)
def test_rank_rewards(rewards: list[float], ranks: list[float]) -> None:
    assert rank_rewards(rewards) == pytest.approx(ranks)


def test_rank_rewards_rejects_nan() -> None:
    with pytest.raises(ValueError, match="finite"):
        rank_rewards([1.0, math.nan])


def test_grpo_advantages_by_hand() -> None:
    # mean 0.5, population std 0.5
    assert grpo_advantages([1, 0, 0, 1], eps=0) == [1.0, -1.0, -1.0, 1.0]
    assert grpo_advantages([1, 0, 0, 1]) == pytest.approx([1, -1, -1, 1], rel=1e-5)
    # sample std sqrt(1/3)
    half = 0.5 * math.sqrt(3)
    assert grpo_advantages([1, 0, 0, 1], eps=0, ddof=1) == pytest.approx([half, -half, -half, half])
    # mean 2, population std sqrt(2/3)
    assert grpo_advantages([1, 2, 3], eps=0) == pytest.approx([-math.sqrt(1.5), 0, math.sqrt(1.5)])


def test_dr_grpo_only_centres() -> None:
    assert grpo_advantages([1, 2, 3, 6], scale_by_std=False) == [-2.0, -1.0, 0.0, 3.0]


@pytest.mark.parametrize("rewards", [[0.1, 0.1, 0.1], [5.0], []])
def test_no_signal_means_zero_advantage(rewards: list[float]) -> None:
    assert grpo_advantages(rewards) == [0.0] * len(rewards)
    assert grpo_advantages(rewards, scale_by_std=False) == [0.0] * len(rewards)


def test_advantage_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="eps"):
        grpo_advantages([1, 2], eps=-1)
    with pytest.raises(ValueError, match="ddof"):
        grpo_advantages([1, 2], ddof=2)
    with pytest.raises(ValueError, match="finite"):
        grpo_advantages([1, math.inf])


def test_group_advantages_leave_infra_failures_out() -> None:
    assert group_advantages([1.0, None, 0.0], eps=0) == [1.0, None, -1.0]
    assert group_advantages([None, 1.0, 1.0]) == [None, 0.0, 0.0]
    assert group_advantages([None, None]) == [None, None]
    assert group_advantages([3.0, None, 1.0], scale_by_std=False) == [1.0, None, -1.0]


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=2, max_size=16))
def test_advantages_are_centred_and_order_free(rewards: list[float]) -> None:
    advantages = grpo_advantages(rewards)
    assert abs(math.fsum(advantages)) <= 1e-6 * len(rewards)
    shuffled = list(range(len(rewards)))
    random.Random(0).shuffle(shuffled)
    again = grpo_advantages([rewards[i] for i in shuffled])
    assert again == pytest.approx([advantages[i] for i in shuffled], abs=1e-9)


def test_word_ngrams_and_jaccard() -> None:
    assert word_ngrams("The cat sat on") == {("the", "cat", "sat"), ("cat", "sat", "on")}
    assert word_ngrams("Hi, you!") == {("hi", "you")}  # shorter than n: one shingle
    assert word_ngrams("...") == frozenset()
    a, b = word_ngrams("a b c d"), word_ngrams("a b c e")
    assert jaccard(a, b) == pytest.approx(1 / 3)  # {abc, bcd} vs {abc, bce}
    assert jaccard(frozenset(), frozenset()) == 1.0
    with pytest.raises(ValueError, match="n must be"):
        word_ngrams("x", 0)


def test_clusters_are_single_linkage_and_labelled_by_smallest_index() -> None:
    base = "one two three four five six seven eight nine ten"
    texts = [
        "something else entirely, nothing alike at all here",
        base,
        base.replace("ten", "eleven"),  # 7 of 9 shingles shared with base: J = 7/9 ~ 0.78
        base + "!",  # same words as base: J = 1
    ]
    assert near_duplicate_clusters(texts, threshold=0.75) == [0, 1, 1, 1]
    assert near_duplicate_clusters(texts, threshold=0.8) == [0, 1, 2, 1]
    # A~B and B~C (J = 7/9 each) but not A~C (J = 6/10): still one cluster, in any order
    chain = [base, base.replace("ten", "eleven"), base.replace("ten", "eleven").replace("one", "zero")]
    assert jaccard(word_ngrams(chain[0]), word_ngrams(chain[2])) == pytest.approx(0.6)
    assert near_duplicate_clusters(chain, threshold=0.7) == [0, 0, 0]
    assert near_duplicate_clusters(list(reversed(chain)), threshold=0.7) == [0, 0, 0]
    with pytest.raises(ValueError, match="threshold"):
        near_duplicate_clusters(texts, threshold=0)


def test_diversity_scale_by_hand() -> None:
    answer = "the answer is 42 because six times seven is 42"
    completions = [answer, answer.upper(), "I believe it is 41 after all", answer + ".", "no idea"]
    rewards = [1.0, 1.0, 1.0, 0.0, -0.5]
    result = diversity_scale(rewards, completions)
    assert result.clusters == [0, 0, 2, 0, 4]
    assert result.factors == pytest.approx([1 / 3, 1 / 3, 1.0, 1 / 3, 1.0])
    # three copies share one reward; the 0 and the penalty are left alone
    assert result.rewards == pytest.approx([1 / 3, 1 / 3, 1.0, 0.0, -0.5])
    assert diversity_scale(rewards, completions, power=0.5).rewards[0] == pytest.approx(3**-0.5)
    assert diversity_scale(rewards, completions, power=0).rewards == rewards


def test_diversity_scale_validates() -> None:
    with pytest.raises(ValueError, match="2 rewards but 1 completions"):
        diversity_scale([1, 2], ["x"])
    with pytest.raises(ValueError, match="power"):
        diversity_scale([1], ["x"], power=-1)
    with pytest.raises(ValueError, match="finite"):
        diversity_scale([math.nan], ["x"])


@given(st.lists(st.sampled_from(["a b c d", "a b c e", "x y z", "x y z w", "q"]), min_size=1, max_size=8))
def test_diversity_is_permutation_equivariant(texts: list[str]) -> None:
    rewards = [float(i + 1) for i in range(len(texts))]
    result = diversity_scale(rewards, texts, threshold=0.5)
    order = list(range(len(texts)))
    random.Random(1).shuffle(order)
    permuted = diversity_scale([rewards[i] for i in order], [texts[i] for i in order], threshold=0.5)
    assert permuted.rewards == [result.rewards[i] for i in order]


def test_completion_text() -> None:
    messages = [
        Message(role="user", content="q"),
        Message(role="assistant", content="first"),
        Message(role="tool", content="5"),
        Message(role="assistant", content=""),
        Message(role="assistant", content="second"),
    ]
    assert completion_text(messages) == "first\nsecond"
