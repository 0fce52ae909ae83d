"""Evaluation statistics: bootstrap CIs, IQM, pass@k / pass^k, per-task and paired comparisons.

Pure numpy/scipy, no I/O, no temporalio. Design (Agarwal et al. 2021, "Deep RL at the Edge of the
Statistical Precipice", whose rliable library the tests check these numbers against):

* A batch's scores are a (tasks x runs) matrix, `scores[t, r]` = run r of task t (rliable's is
  runs x tasks). A ragged matrix is an error unless `ragged=True` says `scores` is a sequence of
  per-task 1-D arrays (infra-failed rollouts make batches ragged); estimators then pool or
  resample per task at each task's own size.
* Aggregate CIs are rliable's stratified bootstrap: a replicate redraws every task's runs with
  replacement from that task's runs, the set of tasks fixed. They say how much a number would
  move if the batch were re-run on the same tasks, not what other tasks would give.
* All randomness comes from `numpy.random.default_rng(seed)`: same input and seed, same numbers.
* Invalid input (empty, NaN/inf, ragged, k > n, c > n) raises `StatsError`, never a silent NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import scipy.stats
from numpy.typing import ArrayLike, NDArray

from gymflow.envs.errors import StatsError

Array = NDArray[np.float64]
Groups = list[Array]
"""Per-task 1-D arrays of run scores (a matrix's rows, or ragged)."""
Scores = ArrayLike | Sequence[ArrayLike]
"""A (tasks x runs) matrix, or with `ragged=True` a sequence of per-task 1-D arrays."""
Aggregate = Literal["iqm", "mean"]

_CHUNK_ELEMENTS = 1 << 22  # resampled values held at once (~32 MB of float64)


@dataclass(frozen=True)
class Bootstrap:
    """How an interval is computed: replicates, nominal two-sided coverage, generator seed."""

    reps: int = 2000
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0:
            raise StatsError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.reps < 1:
            raise StatsError(f"reps must be >= 1, got {self.reps}")

    @property
    def alpha(self) -> float:
        """Each tail's share, (1 - confidence) / 2."""
        return (1.0 - self.confidence) / 2.0

    def describe(self, kind: str) -> str:
        return f"{kind} bootstrap ({self.reps} reps, seed {self.seed})"


DEFAULT_BOOTSTRAP = Bootstrap()


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a two-sided confidence interval [low, high]."""

    value: float
    low: float
    high: float
    confidence: float
    """Nominal coverage, e.g. 0.95."""
    method: str
    """How the interval was computed: "percentile bootstrap (2000 reps, seed 0)"."""


@dataclass(frozen=True)
class TaskStats:
    """One task's mean score; the CI is None below two runs (one value shows no spread)."""

    task_id: str
    n: int
    mean: float
    low: float | None
    high: float | None


@dataclass(frozen=True)
class PassK:
    """pass@k and pass^k at one k, averaged over tasks."""

    k: int
    pass_at_k: float
    pass_hat_k: float
    n_tasks: int


@dataclass(frozen=True)
class Comparison:
    """Policy X against policy Y on the same tasks."""

    difference: Estimate
    """Mean of per-task mean differences, mean_t(mean(x_t) - mean(y_t))."""
    probability_of_improvement: Estimate
    """P(X > Y): the chance a run of X beats a run of Y on the same task, ties counted half."""
    n_tasks: int


# -- validation -------------------------------------------------------------------------------
def _array(values: Any, what: str, ndim: int) -> Array:
    shape = "1-D" if ndim == 1 else "2-D (tasks x runs)"
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise StatsError(f"{what} must be a {shape} array of numbers: {e}") from e
    if x.ndim != ndim:
        raise StatsError(f"{what} must be {shape}, got shape {x.shape}")
    if x.size == 0:
        raise StatsError(f"{what} is empty (shape {x.shape})")
    if not np.all(np.isfinite(x)):
        raise StatsError(f"{what} has {int(np.sum(~np.isfinite(x)))} non-finite value(s) (NaN/inf)")
    return x


def _groups(scores: Scores, *, ragged: bool, what: str = "scores") -> Groups:
    """Validate a (tasks x runs) matrix, or per-task arrays when `ragged`, into per-task rows."""
    if not ragged:
        if isinstance(scores, Sequence) and len({len(r) for r in scores if isinstance(r, Sized)}) > 1:
            runs = sorted({len(r) for r in scores if isinstance(r, Sized)})
            raise StatsError(f"{what} is ragged (runs per task: {runs}); pass per-task arrays with ragged=True")
        return list(_array(scores, what, 2))
    if not isinstance(scores, Sequence | np.ndarray) or len(scores) == 0 or np.ndim(scores[0]) != 1:
        raise StatsError(f"{what} with ragged=True must be a non-empty sequence of per-task 1-D arrays")
    return [_array(row, f"{what}[{i}]", 1) for i, row in enumerate(scores)]


def _interval(replicates: Array, alpha: float) -> tuple[float, float]:
    low, high = np.quantile(replicates, [alpha, 1.0 - alpha])  # linear, as arch (rliable) does
    return float(low), float(high)


# -- the 1-D mean ----------------------------------------------------------------------------
def mean_ci(
    values: ArrayLike, *, boot: Bootstrap = DEFAULT_BOOTSTRAP, method: Literal["percentile", "bca"] = "percentile"
) -> Estimate:
    """Mean of i.i.d. values with a bootstrap confidence interval.

    A replicate is the mean of n values drawn with replacement. Percentile: the [alpha, 1 - alpha]
    quantiles of the replicates, alpha = (1 - confidence) / 2. BCa (Efron 1987): the quantiles at
    Phi(z0 + (z0 + z_q) / (1 - a (z0 + z_q))), z_q = Phi^-1(q), with bias
    z0 = Phi^-1(#{theta* < theta} / B, ties half) and acceleration
    a = sum(d_i^3) / (6 (sum d_i^2)^(3/2)), d_i = mean(theta_(.)) - theta_(i) (jackknife means).

    Args:
        values: 1-D finite scores.
        boot: Replicates, confidence and seed.
        method: "percentile" or "bca".

    Returns:
        The sample mean and its interval.
    """
    return _mean_ci(_array(values, "values", 1), boot, np.random.default_rng(boot.seed), method)


def _mean_ci(x: Array, boot: Bootstrap, rng: np.random.Generator, method: str) -> Estimate:
    if method not in ("percentile", "bca"):
        raise StatsError(f"method must be 'percentile' or 'bca', got {method!r}")
    theta = float(np.mean(x))
    reps = _replicates([[x]], lambda s: np.mean(s[0][0], axis=1), boot.reps, rng)
    qs = np.array([boot.alpha, 1.0 - boot.alpha])
    if method == "bca" and x.size > 1 and np.ptp(reps) > 0:
        below = (np.sum(reps < theta) + 0.5 * np.sum(reps == theta)) / reps.size
        z0 = scipy.stats.norm.ppf(np.clip(below, 0.5 / reps.size, 1.0 - 0.5 / reps.size))
        jack = (np.sum(x) - x) / (x.size - 1)
        d = jack.mean() - jack
        denom = 6.0 * np.sum(d**2) ** 1.5
        a = float(np.sum(d**3) / denom) if denom > 0 else 0.0
        z = scipy.stats.norm.ppf(qs)
        qs = scipy.stats.norm.cdf(z0 + (z0 + z) / (1.0 - a * (z0 + z)))
    low, high = np.quantile(reps, qs)
    return Estimate(theta, float(low), float(high), boot.confidence, boot.describe(method.replace("bca", "BCa")))


# -- stratified bootstrap over (tasks x runs) ------------------------------------------------
def _replicates(
    samples: Sequence[Groups], statistic: Callable[[list[list[Array]]], Array], reps: int, rng: np.random.Generator
) -> Array:
    """`reps` values of `statistic` on stratified resamples of every sample (independently).

    `statistic` gets, per sample, per task, a (b x n_t) array of b resampled rows, and returns b
    values (or b rows of values). A row redraws n_t runs with replacement from the task's own runs.
    """
    cost = sum(g.size for groups in samples for g in groups)
    if len(samples) == 2:  # pairwise comparisons hold (b x n_x x n_y) booleans per task
        cost += sum(gx.size * gy.size for gx, gy in zip(samples[0], samples[1], strict=True))
    chunk = max(1, _CHUNK_ELEMENTS // cost)
    out = []
    for start in range(0, reps, chunk):
        b = min(chunk, reps - start)
        drawn = [[g[rng.integers(0, g.size, size=(b, g.size))] for g in groups] for groups in samples]
        out.append(statistic(drawn))
    return np.concatenate(out)


def aggregate_mean(scores: Scores, *, ragged: bool = False) -> float:
    """Mean of per-task means, (1/T) sum_t mean(scores[t]); every task weighs the same."""
    return float(np.mean([g.mean() for g in _groups(scores, ragged=ragged)]))


def iqm(scores: Scores, *, ragged: bool = False) -> float:
    """Interquartile mean of all runs of all tasks (rliable's `aggregate_iqm`).

    IQM = mean of the pooled scores after dropping the lowest and highest 25%
    (`scipy.stats.trim_mean(x, 0.25)`, which cuts floor(0.25 N) values each side). A matrix is
    flattened in rliable's (runs x tasks) order, so the value equals rliable's bit for bit.
    """
    groups = _groups(scores, ragged=ragged)
    pooled = np.stack(groups).T if not ragged else np.concatenate(groups)
    return float(scipy.stats.trim_mean(pooled, 0.25, axis=None))


def aggregate_ci(
    scores: Scores, *, statistic: Aggregate = "iqm", ragged: bool = False, boot: Bootstrap = DEFAULT_BOOTSTRAP
) -> Estimate:
    """`iqm` or `aggregate_mean` with rliable's stratified percentile bootstrap CI.

    A replicate keeps every task and redraws its runs with replacement from that task's runs
    (rliable's `StratifiedBootstrap`, `task_bootstrap=False`), then recomputes the statistic on
    it; the interval is the [alpha, 1 - alpha] quantiles, alpha = (1 - confidence) / 2.

    Args:
        scores: (tasks x runs) matrix, or per-task arrays with `ragged=True`.
        statistic: "iqm" (pooled interquartile mean) or "mean" (mean of per-task means).
        ragged: Accept tasks with different numbers of runs.
        boot: Replicates, confidence and seed.
    """
    groups = _groups(scores, ragged=ragged)
    if statistic not in ("iqm", "mean"):
        raise StatsError(f"statistic must be 'iqm' or 'mean', got {statistic!r}")
    value = iqm(scores, ragged=ragged) if statistic == "iqm" else aggregate_mean(groups, ragged=True)

    def replicate(drawn: list[list[Array]]) -> Array:
        if statistic == "mean":
            return np.mean([r.mean(axis=1) for r in drawn[0]], axis=0)
        return np.asarray(scipy.stats.trim_mean(np.concatenate(drawn[0], axis=1), 0.25, axis=1))

    kind = "stratified percentile"
    if _one_run_each(groups):
        # Nothing to redraw within a task: the stratified interval would be [value, value]. The
        # tasks are then the sample, resampled as one stratum (for both statistics the value is
        # unchanged: one run per task makes the mean of task means the pooled mean).
        groups, kind = [np.concatenate(groups)], "task-resampling percentile"
    reps = _replicates([groups], replicate, boot.reps, np.random.default_rng(boot.seed))
    return Estimate(value, *_interval(reps, boot.alpha), boot.confidence, boot.describe(kind))


def _one_run_each(groups: Groups) -> bool:
    """Every task has a single run and there are at least two tasks to resample."""
    return len(groups) > 1 and all(g.size == 1 for g in groups)


# -- pass@k and pass^k -----------------------------------------------------------------------
def _counts(n: ArrayLike, c: ArrayLike, k: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    na, ca = _array(np.atleast_1d(n), "n", 1), _array(np.atleast_1d(c), "c", 1)
    if na.shape != ca.shape or na.ndim != 1 or np.any(na % 1) or np.any(ca % 1):
        raise StatsError(f"n and c must be whole numbers of one 1-D shape, got n={na.tolist()} c={ca.tolist()}")
    ni, ci = na.astype(np.int64), ca.astype(np.int64)
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise StatsError(f"k must be an integer >= 1, got {k!r}")
    if np.any(ci < 0) or np.any(ci > ni):
        raise StatsError(f"need 0 <= c <= n per task, got n={ni.tolist()} c={ci.tolist()}")
    if np.any(ni < k):
        raise StatsError(f"k={k} > n for task(s) {np.flatnonzero(ni < k).tolist()} (n={ni.tolist()})")
    return ni, ci


def pass_at_k(n: ArrayLike, c: ArrayLike, k: int) -> Array:
    """Unbiased pass@k per task (Chen et al. 2021): P(at least one of k samples is correct).

    pass@k = 1 - C(n - c, k) / C(n, k), computed stably as 1 - prod_{i=n-c+1}^{n} (1 - k / i)
    (1 when n - c < k), for n samples of which c are correct.

    Args:
        n: Samples per task.
        c: Correct samples per task.
        k: Budget, 1 <= k <= n for every task.

    Returns:
        One value per task; their mean is the benchmark's pass@k.
    """
    ni, ci = _counts(n, c, k)
    out = np.ones(ni.size)
    for t, (nt, ct) in enumerate(zip(ni.tolist(), ci.tolist(), strict=True)):
        if nt - ct >= k:
            out[t] = 1.0 - float(np.prod(1.0 - k / np.arange(nt - ct + 1, nt + 1)))
    return out


def pass_hat_k(n: ArrayLike, c: ArrayLike, k: int) -> Array:
    """pass^k per task (tau-bench, Yao et al. 2024): P(all of k samples are correct).

    pass^k = C(c, k) / C(n, k) = prod_{i=0}^{k-1} (c - i) / (n - i) (0 when c < k): an unbiased
    estimate of how reliably the policy solves the task k times in a row.

    Args, returns: as `pass_at_k`.
    """
    ni, ci = _counts(n, c, k)
    i = np.arange(k)
    return np.array([float(np.prod((ct - i) / (nt - i))) if ct >= k else 0.0 for nt, ct in zip(ni, ci, strict=True)])


def pass_k_table(n: ArrayLike, c: ArrayLike, ks: Sequence[int] | None = None) -> list[PassK]:
    """pass@k and pass^k averaged over tasks, for each k in `ks` (default 1..min(n))."""
    ni, _ = _counts(n, c, 1)
    ks = list(range(1, int(ni.min()) + 1)) if ks is None else list(ks)
    return [PassK(k, float(np.mean(pass_at_k(n, c, k))), float(np.mean(pass_hat_k(n, c, k))), int(ni.size)) for k in ks]


# -- per task --------------------------------------------------------------------------------
def group_by_task(task_ids: Sequence[str], values: ArrayLike) -> dict[str, Array]:
    """Scores grouped per task id, tasks in order of first appearance."""
    x = _array(values, "values", 1)
    if len(task_ids) != x.size:
        raise StatsError(f"{len(task_ids)} task ids for {x.size} values")
    out: dict[str, list[float]] = {}
    for task_id, v in zip(task_ids, x.tolist(), strict=True):
        out.setdefault(task_id, []).append(v)
    return {t: np.asarray(v) for t, v in out.items()}


def per_task(task_ids: Sequence[str], values: ArrayLike, *, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> list[TaskStats]:
    """Per task: runs, mean and a percentile bootstrap CI of the mean (as `mean_ci`).

    One generator seeded with `boot.seed` serves the tasks in order of first appearance.
    """
    rng = np.random.default_rng(boot.seed)
    rows = []
    for task_id, x in group_by_task(task_ids, values).items():
        est = _mean_ci(x, boot, rng, "percentile")
        ci = (est.low, est.high) if x.size > 1 else (None, None)
        rows.append(TaskStats(task_id, int(x.size), est.value, *ci))
    return rows


# -- paired comparison -----------------------------------------------------------------------
def _poi(xs: Sequence[Array], ys: Sequence[Array]) -> Array:
    """P(X > Y) + P(X = Y)/2 per replicate, averaged over tasks; rows are (b x n) replicates."""
    per_task = []
    for x, y in zip(xs, ys, strict=True):
        gt = np.sum(x[:, :, None] > y[:, None, :], axis=(1, 2))
        eq = np.sum(x[:, :, None] == y[:, None, :], axis=(1, 2))
        per_task.append((gt + 0.5 * eq) / (x.shape[1] * y.shape[1]))
    return np.mean(per_task, axis=0)


def probability_of_improvement(x: Scores, y: Scores, *, ragged: bool = False) -> float:
    """P(X > Y) as in rliable: the Mann-Whitney U statistic per task, averaged over tasks.

    P(X > Y) = (1/T) sum_t (1 / (n_x n_y)) sum_{i,j} [x_ti > y_tj] + 0.5 [x_ti = y_tj].

    Args:
        x: Policy X, (tasks x runs) or per-task arrays with `ragged=True`.
        y: Policy Y on the same tasks in the same order; run counts may differ from X's.
        ragged: Accept tasks with different numbers of runs.
    """
    gx, gy = _pair(x, y, ragged)
    return float(_poi([g[None, :] for g in gx], [g[None, :] for g in gy])[0])


def _pair(x: Scores, y: Scores, ragged: bool) -> tuple[Groups, Groups]:
    gx, gy = _groups(x, ragged=ragged, what="x"), _groups(y, ragged=ragged, what="y")
    if len(gx) != len(gy):
        raise StatsError(f"x and y must cover the same tasks: {len(gx)} vs {len(gy)} tasks")
    return gx, gy


def compare(x: Scores, y: Scores, *, ragged: bool = False, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> Comparison:
    """Policy X against Y on the same tasks: mean difference and P(X > Y), each with a CI.

    The difference is mean_t(mean(x_t) - mean(y_t)), paired by task. Both intervals come from the
    same replicates of a stratified paired bootstrap: each replicate keeps every task and redraws
    X's runs and Y's runs of that task, independently, with replacement (rliable's
    `StratifiedIndependentBootstrap`, which it uses for P(X > Y)); intervals are percentile.

    Args:
        x: Policy X, (tasks x runs) or per-task arrays with `ragged=True`.
        y: Policy Y on the same tasks in the same order.
        ragged: Accept tasks with different numbers of runs.
        boot: Replicates, confidence and seed.
    """
    gx, gy = _pair(x, y, ragged)
    diff = float(np.mean([a.mean() - b.mean() for a, b in zip(gx, gy, strict=True)]))
    poi = probability_of_improvement(gx, gy, ragged=True)

    def statistic(drawn: list[list[Array]]) -> Array:
        xs, ys = drawn
        d = np.mean([a.mean(axis=1) - b.mean(axis=1) for a, b in zip(xs, ys, strict=True)], axis=0)
        return np.stack([d, _poi(xs, ys)], axis=1)

    if _one_run_each(gx) and _one_run_each(gy):
        # One run per task on each side: redraw tasks (pairs kept together), not runs.
        return _compare_over_tasks(gx, gy, diff, poi, boot)
    pair = _replicates([gx, gy], statistic, boot.reps, np.random.default_rng(boot.seed))
    method = boot.describe("stratified paired percentile")
    return Comparison(
        Estimate(diff, *_interval(pair[:, 0], boot.alpha), boot.confidence, method),
        Estimate(poi, *_interval(pair[:, 1], boot.alpha), boot.confidence, method),
        len(gx),
    )


def _compare_over_tasks(gx: Groups, gy: Groups, diff: float, poi: float, boot: Bootstrap) -> Comparison:
    """`compare` when every task has one run per side: a paired percentile bootstrap over tasks."""
    x = np.concatenate(gx)
    y = np.concatenate(gy)
    rng = np.random.default_rng(boot.seed)
    idx = rng.integers(0, x.size, size=(boot.reps, x.size))
    xs, ys = x[idx], y[idx]
    d = (xs - ys).mean(axis=1)
    p = ((xs > ys) + 0.5 * (xs == ys)).mean(axis=1)
    method = boot.describe("paired task-resampling percentile")
    return Comparison(
        Estimate(diff, *_interval(d, boot.alpha), boot.confidence, method),
        Estimate(poi, *_interval(p, boot.alpha), boot.confidence, method),
        len(gx),
    )
