"""The false drift FAILs that the pins themselves cause: `drift_pins` draws many pins of
healthy acceptance lengths per category, grows each from `pin_min_samples` to
`pin_target_samples` pairs and follows it for the category's 30 days of pairs with the
drift gate's own charts (`gates.pairs.drift.chart_parameters`), vectorised over pins (closed-form
CUSUMs, `_lindley`), against the category's share of the budget; and the same draws judged
the old way, a pin of `pin_min_samples` pairs taken as exact."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from benchmarks.gate_power.sample import HealthySample
from benchmarks.gate_power.trips import poisson_upper95
from gates import GatesConfig
from gates.pairs.drift import chart_parameters, pin_alpha
from gates.stats.budget import SECONDS_PER_30_DAYS, detector_arl0, detector_budget
from gates.stats.sequential import lorden_threshold


def _lindley(increments: np.ndarray) -> np.ndarray:
    """CUSUM statistics S_t = max(0, S_t-1 + x_t) along axis 1, from S_0 = 0, in closed
    form: the cumulative sum less its running minimum (never above 0)."""
    total = np.cumsum(increments, axis=1)
    return total - np.minimum(np.minimum.accumulate(total, axis=1), 0.0)


def _first_alarm(increments: np.ndarray, h: float) -> np.ndarray:
    """Per row, the index of the first S_t ≥ h, or -1."""
    hits = _lindley(increments) >= h
    return np.where(hits.any(axis=1), hits.argmax(axis=1), -1)


def _pin_stats(values: np.ndarray, logs: np.ndarray) -> tuple[np.ndarray, ...]:
    return (
        values.mean(axis=1),
        values.std(axis=1, ddof=1),
        logs.mean(axis=1),
        logs.std(axis=1, ddof=1),
    )


def _growing_stats(
    values: np.ndarray, logs: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pin statistics of `_pin_stats` over the first t values for every t in
    `sizes`, per row: (mean, sd, n, log mean, log sd), each of shape (rows, sizes)."""

    def running(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        total = np.cumsum(data, axis=1)[:, sizes - 1]
        squares = np.cumsum(data * data, axis=1)[:, sizes - 1]
        mean = total / sizes
        variance = np.maximum(squares - sizes * mean * mean, 0.0) / (sizes - 1)
        return mean, np.sqrt(variance)

    mean, sd = running(values)
    log_mean, log_sd = running(logs)
    n = np.broadcast_to(sizes.astype(float), mean.shape)
    return mean, sd, n, log_mean, log_sd


def _bank_increments(
    values: np.ndarray, logs: np.ndarray, params: tuple[tuple[np.ndarray, ...], ...]
) -> tuple[np.ndarray, np.ndarray]:
    """The two charts' Gaussian log-LR increments (gates.stats.sequential.gaussian_llr), per row."""
    out = []
    for data, (m0, m1, sigma) in zip((values, logs), params, strict=True):
        m0, m1, sigma = (np.asarray(x)[:, None] for x in (m0, m1, sigma))
        out.append((m1 - m0) / sigma**2 * (data - (m0 + m1) / 2.0))
    return out[0], out[1]


def drift_pins(
    sample: HealthySample,
    config: GatesConfig,
    *,
    pins: int,
    seed: int,
    chunk: int = 500,
) -> dict[str, Any]:
    """The false drift FAILs that the pins themselves cause.

    Per category, `pins` independent pins of healthy traffic (values drawn with
    replacement from the category's healthy acceptance lengths in `sample`), each
    followed for 30 days of the category's pairs at the design rate (all categories
    equally frequent). A pin is taken after `pin_min_samples` pairs and grows with every
    pair until `pin_target_samples` (the daemon grows it at every 60 s gate run, about
    every 0.7 category pairs: each pair is an evaluation here); while it grows, the check
    is recomputed from the first pair against the current pin, as the gate does; once it
    is frozen, one CUSUM runs over the whole 30 days from the first pair (never fewer
    alarms than the gate's 2,000-pair window: a later start can only lower a CUSUM), and
    restarts after each alarm. The charts are the gate's own (`gates.pairs.drift.chart_parameters`:
    the bank's threshold and the pin margin for the category's share of the budget).
    `before` is the same draw judged as before the margin: a pin frozen at
    `pin_min_samples` pairs whose mean is taken as exact."""
    started = time.perf_counter()
    drift = config.drift
    categories = sorted(sample.acceptance_by_category)
    budget = detector_budget(config)
    pairs_30d = SECONDS_PER_30_DAYS / config.budget.design_pair_interval_s
    horizon = int(pairs_30d / len(categories))
    h = lorden_threshold(detector_arl0(config)) + math.log(2.0)  # equal shares; a bank of 2
    alpha = pin_alpha(budget, len(categories))
    design = {"alpha": alpha, "h": h, "horizon": float(horizon)}
    first, target = drift.pin_min_samples, drift.pin_target_samples
    rng = np.random.default_rng(seed)
    by_category: dict[str, Any] = {}
    totals = {"now": [0, 0], "before": [0, 0]}  # [alarms, pins with one]
    for category in categories:
        healthy = np.asarray(sample.acceptance_by_category[category], dtype=float)
        row = {"now": [0, 0], "before": [0, 0]}
        for offset in range(0, pins, chunk):
            size = min(chunk, pins - offset)
            values = rng.choice(healthy, size=(size, horizon))
            logs = np.log(np.maximum(values, 1e-9))
            # growing: an alarm at any pair between the first pin and the target
            grew = np.zeros(size, dtype=bool)
            sizes = np.arange(first, target + 1)
            growing = chart_parameters(  # every pin size at once: shape (pins, sizes)
                *_growing_stats(values[:, :target], logs[:, :target], sizes),
                drift,
                **design,
            )
            for column, t in enumerate(sizes):
                params = tuple(tuple(x[:, column] for x in chart) for chart in growing)
                linear, log = _bank_increments(values[:, :t], logs[:, :t], params)
                grew |= (_lindley(linear)[:, -1] >= h) | (_lindley(log)[:, -1] >= h)
            stats = _pin_stats(values[:, :target], logs[:, :target])
            params = chart_parameters(
                stats[0], stats[1], target, stats[2], stats[3], drift, **design
            )
            linear, log = _bank_increments(values, logs, params)
            alarms = _bank_alarms(linear, log, h)
            alarms = np.where(grew & (alarms == 0), 1, alarms)  # an alarm while growing
            row["now"][0] += int(alarms.sum())
            row["now"][1] += int((alarms > 0).sum())
            # before: pinned once from the first pairs, its mean exact (no margin)
            stats = _pin_stats(values[:, :first], logs[:, :first])
            (m0, m1, sigma), (l0, l1, lsigma) = chart_parameters(
                stats[0], stats[1], first, stats[2], stats[3], drift, **design
            )
            shift, log_shift = stats[0] - m0, stats[2] - l0
            exact = ((m0 + shift, m1 + shift, sigma), (l0 + log_shift, l1 + log_shift, lsigma))
            linear, log = _bank_increments(values, logs, exact)
            alarms = _bank_alarms(linear, log, h)
            row["before"][0] += int(alarms.sum())
            row["before"][1] += int((alarms > 0).sum())
        by_category[category] = {
            "pins": pins,
            "false_fails": row["now"][0],
            "pins_with_a_false_fail": row["now"][1],
            "before_false_fails": row["before"][0],
        }
        for key in totals:
            totals[key][0] += row[key][0]
            totals[key][1] += row[key][1]
    drawn = pins * len(categories)
    share = budget / len(categories)
    return {
        "pins": drawn,
        "false_fail_per_category_30d": totals["now"][0] / drawn,
        "false_fail_per_category_30d_upper95": poisson_upper95(totals["now"][0]) / drawn,
        "budget_share_per_category_30d": share,
        "within_budget_share": poisson_upper95(totals["now"][0]) / drawn <= share,
        "pins_with_a_false_fail": totals["now"][1],
        "before": {
            "false_fail_per_category_30d": totals["before"][0] / drawn,
            "pins_with_a_false_fail": totals["before"][1],
            "rule": f"pinned once from {first} pairs, the mean taken as exact",
        },
        "pin_min_samples": first,
        "pin_target_samples": target,
        "category_pairs_per_30_days": horizon,
        "pin_alpha": alpha,
        "h": h,
        "by_category": by_category,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _bank_alarms(linear: np.ndarray, log: np.ndarray, h: float) -> np.ndarray:
    """Alarms of a two-chart bank, restarting both charts after each: a row alarms at
    the first pair where either chart reaches h."""
    counts = np.zeros(linear.shape[0], dtype=int)
    first = np.minimum(_masked(_first_alarm(linear, h)), _masked(_first_alarm(log, h)))
    for row in np.flatnonzero(first < linear.shape[1]):
        start = 0
        while start < linear.shape[1]:
            hits = [
                int(_first_alarm(chart[row : row + 1, start:], h)[0]) for chart in (linear, log)
            ]
            live = [hit for hit in hits if hit >= 0]
            if not live:
                break
            counts[row] += 1
            start += min(live) + 1
    return counts


def _masked(index: np.ndarray) -> np.ndarray:
    return np.where(index < 0, np.iinfo(np.int64).max, index)
