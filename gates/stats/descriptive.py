"""Descriptive statistics shared by summaries, gates and reports. Pure functions.

Quantiles use the "linear" definition (numpy's default, Hyndman & Fan type 7), so a
P99 over few samples interpolates between the two largest values rather than jumping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import beta as beta_dist
from scipy.stats import binom as binom_dist
from scipy.stats import t as t_dist


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0 ≤ q ≤ 1) of `values`; None for no values."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q={q!r} is outside [0, 1]")
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    return float(np.quantile(np.asarray(finite, dtype=float), q))


def mean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(sum(finite) / len(finite)) if finite else None


def rate(hits: int, total: int) -> float | None:
    return hits / total if total else None


# --- Confidence bounds. Each bound is one-sided at `confidence`; a pair of them is a
# two-sided interval at 2·confidence − 1. A decision only ever rests on one of them.


def clopper_pearson(hits: int, total: int, confidence: float) -> tuple[float, float]:
    """Exact (Clopper–Pearson) one-sided lower and upper bounds on a binomial rate."""
    if total <= 0 or not 0 <= hits <= total:
        raise ValueError(f"need 0 ≤ hits ≤ total and total > 0, got {hits!r}/{total!r}")
    alpha = 1.0 - confidence
    lower = 0.0 if hits == 0 else float(beta_dist.ppf(alpha, hits, total - hits + 1))
    upper = 1.0 if hits == total else float(beta_dist.ppf(confidence, hits + 1, total - hits))
    return lower, upper


def mean_t_bounds(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """The mean and its one-sided Student-t lower and upper bounds; a single value has no
    bound (−inf, +inf). Needs at least one value."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("a mean needs at least 1 value")
    if data.size == 1:
        return float(data[0]), float("-inf"), float("inf")
    centre = float(data.mean())
    half = float(t_dist.ppf(confidence, data.size - 1) * data.std(ddof=1) / math.sqrt(data.size))
    return centre, centre - half, centre + half


def order_statistic_bounds(
    values: Sequence[float], q: float, confidence: float
) -> tuple[float | None, float | None]:
    """Distribution-free one-sided bounds on the q-quantile from order statistics.

    The lower bound is x(l) for the largest l with P(Bin(n, q) ≥ l) ≥ confidence, the
    upper x(u) for the smallest u with P(Bin(n, q) ≤ u − 1) ≥ confidence; None where no
    such order statistic exists (too few values for that confidence).
    """
    data = np.sort(np.asarray(values, dtype=float))
    n = data.size
    if n == 0:
        return None, None
    cdf = binom_dist.cdf(np.arange(n + 1), n, q)
    # lower: largest j = l - 1 with cdf(j) ≤ 1 - confidence
    low_js = np.nonzero(cdf <= 1.0 - confidence)[0]
    lower = float(data[low_js[-1]]) if low_js.size else None  # x(l) = data[l - 1] = data[j]
    # upper: smallest j = u - 1 with cdf(j) ≥ confidence, and u ≤ n
    up_js = np.nonzero(cdf >= confidence)[0]
    upper = float(data[up_js[0]]) if up_js.size and up_js[0] < n else None
    return lower, upper


def bootstrap_quantiles(values: np.ndarray, index: np.ndarray, q: float) -> np.ndarray:
    """The type-7 q-quantile of each bootstrap resample `values[index[b]]`, exactly.

    Equal to ``np.quantile(values[index], q, axis=1)`` but several times faster for the
    high quantiles latency gates use: a resample's q-quantile only depends on how often
    each of the top few values was drawn, so only those are counted. Rows that drew too
    few top values (vanishingly rare) fall back to the full computation.
    """
    if q < 0.5:  # type 7 is symmetric: Q_q(x) = -Q_{1-q}(-x)
        return -bootstrap_quantiles(-values, index, 1.0 - q)
    n = values.size
    position = (n - 1) * q
    low = math.floor(position)
    high = min(low + 1, n - 1)
    fraction = position - low
    order = np.argsort(-values, kind="stable")  # descending
    descending = values[order]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    # The ascending j-th order statistic of a resample is the first value, counting draws
    # from the top, at which n - j draws have been seen.
    need_low, need_high = n - low, n - high
    top = min(n, int(need_low + 8 * math.sqrt(need_low) + 20))
    rows = index.shape[0]
    ranks = rank[index]
    keys = np.where(ranks < top, ranks + top * np.arange(rows)[:, None], rows * top)
    counts = np.bincount(keys.ravel(), minlength=rows * top + 1)[:-1].reshape(rows, top)
    seen = counts.cumsum(axis=1)
    at_low = descending[(seen >= need_low).argmax(axis=1)]
    at_high = descending[(seen >= need_high).argmax(axis=1)]
    result: np.ndarray = at_low + fraction * (at_high - at_low)
    short = seen[:, -1] < need_low
    if short.any():
        result[short] = np.quantile(values[index[short]], q, axis=1)
    return result


def paired_bootstrap_quantile_ratio(
    baseline: Sequence[float],
    speculative: Sequence[float],
    q: float,
    *,
    confidence: float,
    resamples: int,
    seed: int,
) -> tuple[float, float, float]:
    """quantile(speculative) / quantile(baseline) and its percentile-bootstrap bounds.

    Pairs are resampled together, so the correlation between the arms of one pair (same
    prompt, same length) narrows the interval as it should. Seeded: the same input gives
    the same bounds.
    """
    base = np.asarray(baseline, dtype=float)
    spec = np.asarray(speculative, dtype=float)
    if base.size != spec.size or base.size < 2:
        raise ValueError("need two equally long samples of at least 2 paired values")
    estimate = float(np.quantile(spec, q) / np.quantile(base, q))
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    chunk = max(1, 2_000_000 // base.size)  # bound memory for long windows
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        index = rng.integers(0, base.size, size=(stop - start, base.size))
        ratios[start:stop] = bootstrap_quantiles(spec, index, q) / bootstrap_quantiles(
            base, index, q
        )
    lower = float(np.quantile(ratios, 1.0 - confidence))
    upper = float(np.quantile(ratios, confidence))
    return estimate, lower, upper
