"""gymflow.envs.eval.stats against hand-checked cases, brute-force definitions, scipy and rliable.

rliable (Agarwal et al. 2021) is the reference for IQM, its stratified bootstrap CIs and the
probability of improvement. It is a dev dependency; if it cannot be imported the module warns
loudly and checks against `_Reference`, an independent re-implementation of the same three
definitions written here (loops, legacy RNG, scipy's Mann-Whitney U), so the checks still run.

Bootstrap intervals from two generators can only agree within Monte Carlo noise. The alpha
quantile of B replicates has standard error ~ sigma sqrt(alpha (1 - alpha) / B) / phi(z_alpha)
(normal approximation of the bootstrap distribution, sigma its spread); the tests allow 4 standard
errors of the difference of two such estimates. Everything is seeded, so the outcome is fixed.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from gymflow.envs.errors import StatsError
from gymflow.envs.eval import stats
from gymflow.envs.eval.stats import Bootstrap


class _Reference:
    """rliable's definitions, re-implemented independently (used only if rliable is missing)."""

    @staticmethod
    def aggregate_iqm(scores: np.ndarray) -> float:
        flat = np.sort(scores, axis=None)
        cut = int(0.25 * flat.size)
        return float(np.mean(flat[cut : flat.size - cut]))

    @staticmethod
    def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
        probs = []
        for t in range(x.shape[1]):
            u = scipy.stats.mannwhitneyu(x[:, t], y[:, t], alternative="greater").statistic
            probs.append(u / (x.shape[0] * y.shape[0]))
        return float(np.mean(probs))

    @staticmethod
    def get_interval_estimates(
        score_dict: dict[str, Any], func: Callable[..., np.ndarray], reps: int, confidence_interval_size: float = 0.95
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        ((key, scores),) = score_dict.items()
        arrays = scores if isinstance(scores, list) else [scores]
        values = []
        for _ in range(reps):  # runs x tasks: redraw the runs of each task (column) independently
            values.append(func(*[a[np.random.randint(0, a.shape[0], a.shape), np.arange(a.shape[1])] for a in arrays]))
        alpha = 100 * (1 - confidence_interval_size) / 2
        return {key: func(*arrays)}, {key: np.percentile(np.array(values), [alpha, 100 - alpha], axis=0)}


try:
    from rliable import library as rly_library
    from rliable import metrics as rly_metrics

    RLIABLE = True
except ImportError as e:  # pragma: no cover - the dev extra installs rliable
    warnings.warn(f"!!! rliable NOT importable ({e}): checking against test-local reference code !!!", stacklevel=1)
    rly_library = rly_metrics = _Reference
    RLIABLE = False


def _tolerance(width: float, reps_a: int, reps_b: int, confidence: float = 0.95) -> float:
    """4 Monte Carlo standard errors of the difference of two bootstrap quantile estimates."""
    alpha = (1 - confidence) / 2
    z = scipy.stats.norm.ppf(1 - alpha)
    sigma = width / (2 * z)
    se = sigma * math.sqrt(alpha * (1 - alpha)) / scipy.stats.norm.pdf(z)
    return 4 * se * math.sqrt(1 / reps_a + 1 / reps_b)


@pytest.fixture(scope="module")
def scores() -> tuple[np.ndarray, np.ndarray]:
    """Two policies, (tasks x runs), continuous scores with per-task difficulty."""
    rng = np.random.default_rng(7)
    difficulty = rng.uniform(0.5, 3.0, size=(5, 1))
    return rng.beta(2.0, difficulty, size=(5, 8)), rng.beta(1.6, difficulty, size=(5, 8))


def test_rliable_is_the_reference() -> None:
    if not RLIABLE:
        pytest.skip("rliable is NOT installed: IQM / CI / P(X>Y) were checked against test-local reference code")


# -- pass@k / pass^k ---------------------------------------------------------------------------
def _brute(n: int, c: int, k: int) -> tuple[Fraction, Fraction]:
    """Fraction of k-subsets of n samples (c correct) with any correct / with all correct."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    return Fraction(sum(any(s) for s in subsets), len(subsets)), Fraction(sum(all(s) for s in subsets), len(subsets))


def test_pass_at_k_hand_checked() -> None:
    # n=5, c=2: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10; pass@4 = 1 (only 3 wrong).
    assert stats.pass_at_k(5, 2, 1)[0] == pytest.approx(0.4)
    assert stats.pass_at_k(5, 2, 2)[0] == pytest.approx(0.7)
    assert stats.pass_at_k(5, 2, 4)[0] == 1.0
    assert stats.pass_at_k([4, 4], [0, 4], 2).tolist() == [0.0, 1.0]
    # pass^2 = C(2,2)/C(5,2) = 1/10; pass^3 with c=2 is 0; pass^k of a solved task is 1.
    assert stats.pass_hat_k(5, 2, 2)[0] == pytest.approx(0.1)
    assert stats.pass_hat_k(5, 2, 3)[0] == 0.0
    assert stats.pass_hat_k([3], [3], 3)[0] == pytest.approx(1.0)
    table = stats.pass_k_table([3, 4], [1, 4])
    assert [row.k for row in table] == [1, 2, 3]
    assert table[0].pass_at_k == pytest.approx((1 / 3 + 1) / 2)
    assert table[1].pass_hat_k == pytest.approx((0 + 1) / 2)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_k_equals_brute_force(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    at, hat = _brute(n, c, k)
    assert stats.pass_at_k(n, c, k)[0] == pytest.approx(float(at), abs=1e-12)
    assert stats.pass_hat_k(n, c, k)[0] == pytest.approx(float(hat), abs=1e-12)
    assert float(at) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
    assert float(hat) == pytest.approx(math.comb(c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n() -> None:
    exact = 1 - Fraction(math.comb(900, 100), math.comb(1000, 100))  # C(1000, 100) overflows float
    assert stats.pass_at_k(1000, 100, 100)[0] == pytest.approx(float(exact), rel=1e-12)
    assert stats.pass_hat_k(1000, 990, 100)[0] == pytest.approx(math.comb(990, 100) / math.comb(1000, 100), rel=1e-9)


# -- IQM and the stratified bootstrap, against rliable -------------------------------------------
def test_iqm_equals_rliable_exactly(scores: tuple[np.ndarray, np.ndarray]) -> None:
    x, _ = scores
    assert stats.iqm(x) == rly_metrics.aggregate_iqm(x.T)
    assert stats.iqm(np.arange(12.0).reshape(3, 4)) == pytest.approx(5.5)  # mean of 3..8
    assert stats.aggregate_mean(x) == pytest.approx(float(x.mean()), abs=1e-15)


@pytest.mark.parametrize("statistic", ["iqm", "mean"])
def test_stratified_ci_agrees_with_rliable(scores: tuple[np.ndarray, np.ndarray], statistic: str) -> None:
    x, _ = scores
    ours_reps, theirs_reps = 20_000, 10_000
    func = rly_metrics.aggregate_iqm if statistic == "iqm" else lambda s: np.mean(np.mean(s, axis=0))
    np.random.seed(0)  # rliable draws from numpy's global generator
    point, interval = rly_library.get_interval_estimates({"x": x.T}, lambda s: np.array([func(s)]), reps=theirs_reps)
    ours = stats.aggregate_ci(x, statistic=statistic, boot=Bootstrap(reps=ours_reps))  # type: ignore[arg-type]
    assert ours.value == pytest.approx(float(point["x"][0]), abs=1e-15)
    tol = _tolerance(ours.high - ours.low, ours_reps, theirs_reps)
    low, high = interval["x"].ravel()
    print(f"{statistic}: ours [{ours.low:.5f}, {ours.high:.5f}] rliable [{low:.5f}, {high:.5f}] tol {tol:.5f}")
    assert abs(ours.low - low) < tol
    assert abs(ours.high - high) < tol
    assert ours.low < ours.value < ours.high


def test_probability_of_improvement_equals_rliable(scores: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = scores
    assert stats.probability_of_improvement(x, y) == rly_metrics.probability_of_improvement(x.T, y.T)
    assert stats.probability_of_improvement(x, x) == 0.5
    assert stats.probability_of_improvement([[1.0, 1.0]], [[0.0, 1.0]]) == 0.75  # (1 + 0.5 + 1 + 0.5) / 4
    ragged = [x[0], x[1, :3]]
    expected = np.mean(
        [np.mean([(a > b) + 0.5 * (a == b) for a in xs for b in ys]) for xs, ys in zip(ragged, y[:2], strict=True)]
    )
    assert stats.probability_of_improvement(ragged, list(y[:2]), ragged=True) == pytest.approx(expected)


@pytest.mark.heavy
def test_comparison_ci_agrees_with_rliable(scores: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = scores
    x, y = x[:4], y[:4]  # rliable's P(X > Y) bootstrap runs Mann-Whitney per task per replicate: slow
    ours_reps, theirs_reps = 20_000, 2_000
    np.random.seed(0)
    point, interval = rly_library.get_interval_estimates(
        {"xy": [x.T, y.T]}, lambda a, b: np.array([rly_metrics.probability_of_improvement(a, b)]), reps=theirs_reps
    )
    ours = stats.compare(x, y, boot=Bootstrap(reps=ours_reps))
    poi = ours.probability_of_improvement
    assert poi.value == pytest.approx(float(point["xy"][0]), abs=1e-15)
    tol = _tolerance(poi.high - poi.low, ours_reps, theirs_reps)
    low, high = interval["xy"].ravel()
    print(f"P(X>Y): ours [{poi.low:.5f}, {poi.high:.5f}] rliable [{low:.5f}, {high:.5f}] tol {tol:.5f}")
    assert abs(poi.low - low) < tol
    assert abs(poi.high - high) < tol
    diff = ours.difference
    assert diff.value == pytest.approx(float(x.mean() - y.mean()), abs=1e-12)
    # The difference's replicates are independent stratified resamples of X and Y, so its CI width
    # matches the normal one from per-task variances: var = sum_t (var_x/n + var_y/n) / T^2.
    se = math.sqrt(np.sum(x.var(axis=1) / x.shape[1] + y.var(axis=1) / y.shape[1])) / x.shape[0]
    assert diff.high - diff.low == pytest.approx(2 * 1.96 * se, rel=0.05)


# -- the 1-D mean ------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["percentile", "bca"])
def test_mean_ci_agrees_with_scipy(method: str) -> None:
    x = np.random.default_rng(3).exponential(size=40)  # skewed, so BCa and percentile differ
    ours = stats.mean_ci(x, boot=Bootstrap(reps=20_000, seed=1), method=method)  # type: ignore[arg-type]
    ref = scipy.stats.bootstrap(
        (x,), np.mean, n_resamples=20_000, method="BCa" if method == "bca" else "percentile", rng=2
    ).confidence_interval
    tol = _tolerance(ours.high - ours.low, 20_000, 20_000)
    assert ours.value == pytest.approx(x.mean())
    assert abs(ours.low - ref.low) < tol
    assert abs(ours.high - ref.high) < tol
    assert ours.method == f"{'BCa' if method == 'bca' else 'percentile'} bootstrap (20000 reps, seed 1)"


def test_seeded_and_degenerate() -> None:
    x = [0.0, 1.0, 1.0, 0.0, 1.0]
    assert stats.mean_ci(x) == stats.mean_ci(x)
    assert stats.mean_ci(x, boot=Bootstrap(seed=1)) != stats.mean_ci(x, boot=Bootstrap(seed=2))
    assert stats.aggregate_ci([x, x]) == stats.aggregate_ci([x, x])
    const = stats.mean_ci([0.5, 0.5, 0.5], method="bca")
    assert (const.value, const.low, const.high) == (0.5, 0.5, 0.5)


def test_one_run_per_task_resamples_the_tasks() -> None:
    """With one run per task a stratified interval is [value, value]; the tasks are resampled instead."""
    x = np.random.default_rng(5).beta(3, 2, size=60)  # continuous: binary scores put quantiles on a 1/n grid
    y = np.random.default_rng(6).beta(2, 3, size=60)
    gx, gy = [np.array([v]) for v in x], [np.array([v]) for v in y]
    boot = Bootstrap(reps=20_000, seed=1)
    ours = stats.aggregate_ci(gx, statistic="mean", ragged=True, boot=boot)
    ref = scipy.stats.bootstrap((x,), np.mean, n_resamples=20_000, method="percentile", rng=2).confidence_interval
    tol = _tolerance(ours.high - ours.low, 20_000, 20_000)
    assert ours.value == pytest.approx(x.mean())
    assert ours.high - ours.low > 0.05  # not a zero-width interval
    assert abs(ours.low - ref.low) < tol and abs(ours.high - ref.high) < tol
    assert ours.method == "task-resampling percentile bootstrap (20000 reps, seed 1)"
    iqm = stats.aggregate_ci(gx, statistic="iqm", ragged=True, boot=boot)
    assert iqm.low < iqm.value <= iqm.high or iqm.low <= iqm.value < iqm.high
    # paired over tasks: the difference's interval is the bootstrap of the per-task differences
    cmp = stats.compare(gx, gy, ragged=True, boot=boot)
    ref_d = scipy.stats.bootstrap((x - y,), np.mean, n_resamples=20_000, method="percentile", rng=3)
    assert cmp.difference.value == pytest.approx((x - y).mean())
    assert abs(cmp.difference.low - ref_d.confidence_interval.low) < tol
    assert abs(cmp.difference.high - ref_d.confidence_interval.high) < tol
    assert cmp.probability_of_improvement.high - cmp.probability_of_improvement.low > 0.05
    # a single task with a single run has nothing to resample at all: a point, as before
    one = stats.aggregate_ci([np.array([1.0])], statistic="mean", ragged=True)
    assert (one.low, one.high) == (1.0, 1.0)


def test_per_task_breakdown() -> None:
    rows = stats.per_task(["b", "a", "b", "b", "a", "c"], [1.0, 0.0, 0.0, 1.0, 1.0, 0.25])
    assert [(r.task_id, r.n, r.mean) for r in rows] == [("b", 3, 2 / 3), ("a", 2, 0.5), ("c", 1, 0.25)]
    assert rows[2].low is None and rows[2].high is None  # one run: no interval
    assert rows[0].low is not None and rows[0].high is not None
    assert 0.0 <= rows[0].low <= rows[0].mean <= rows[0].high <= 1.0


def test_ragged_scores() -> None:
    groups = [np.array([1.0, 0.0, 1.0]), np.array([0.0, 0.5])]
    assert stats.aggregate_mean(groups, ragged=True) == pytest.approx((2 / 3 + 0.25) / 2)
    assert stats.iqm(groups, ragged=True) == pytest.approx(float(scipy.stats.trim_mean([1, 0, 1, 0, 0.5], 0.25)))
    est = stats.aggregate_ci(groups, ragged=True, statistic="mean")
    assert est.low <= est.value <= est.high


# -- validation --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: stats.mean_ci([]), "empty"),
        (lambda: stats.mean_ci([1.0, float("nan")]), "non-finite"),
        (lambda: stats.mean_ci([[1.0]]), "1-D"),
        (lambda: stats.iqm([[1.0, 2.0], [3.0]]), "ragged"),
        (lambda: stats.iqm([1.0, 2.0]), "2-D"),
        (lambda: stats.iqm(np.zeros((0, 3))), "empty"),
        (lambda: stats.iqm([[1.0, float("inf")]]), "non-finite"),
        (lambda: stats.iqm([], ragged=True), "non-empty"),
        (lambda: stats.iqm([[1.0], []], ragged=True), r"scores\[1\] is empty"),
        (lambda: stats.pass_at_k(3, 1, 4), "k=4 > n"),
        (lambda: stats.pass_at_k(3, 4, 1), "0 <= c <= n"),
        (lambda: stats.pass_at_k(3, 1, 0), "k must be"),
        (lambda: stats.pass_hat_k([3, 2], [1], 1), "one 1-D shape"),
        (lambda: stats.pass_at_k(2.5, 1, 1), "whole numbers"),
        (lambda: stats.probability_of_improvement([[1.0]], [[1.0], [2.0]]), "same tasks"),
        (lambda: stats.per_task(["a"], [1.0, 2.0]), "1 task ids for 2 values"),
        (lambda: Bootstrap(confidence=1.0), "confidence"),
        (lambda: Bootstrap(reps=0), "reps"),
        (lambda: stats.mean_ci([1.0], method="bc"), "method"),  # type: ignore[arg-type]
    ],
)
def test_invalid_input_is_loud(call: Callable[[], object], message: str) -> None:
    with pytest.raises(StatsError, match=message):
        call()
