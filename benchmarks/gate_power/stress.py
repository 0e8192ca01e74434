"""The budget stress: the healthy pairs judged again under `GatesConfig` with only the
false-alarm budget inflated (`with_budget`), where the calibration can be measured. Each
budget's row counts trips against the budget, apart from the trips only on latency tails
past the tolerance in the model (`beyond_tolerance`: detections, not false alarms), marks
saturated budgets, and `extrapolate` carries the observed rate over to the production
budget, labelled as the extrapolation it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.gate_power.sample import HealthySample
from benchmarks.gate_power.trips import TripCounter, poisson_upper95
from gates import GatesConfig
from gates.stats.budget import SECONDS_PER_30_DAYS, detector_arl0
from gates.stats.sequential import lorden_threshold

STRESS_BUDGETS = (100_000.0, 10_000.0, 1_000.0, 100.0, 10.0)  # false rollbacks per 30 days
# Above this share of evaluations with a trip, two alarms between evaluations are likely
# and the count undercounts (by about 13 % at a quarter): the rate is not measured.
SATURATION = 0.25


def with_budget(config: GatesConfig, budget: float) -> GatesConfig:
    """`config` with only its false-alarm budget changed."""
    return config.model_copy(
        update={"budget": config.budget.model_copy(update={"false_rollbacks_per_30_days": budget})}
    )


def beyond_tolerance(sample: HealthySample, config: GatesConfig) -> list[str]:
    """The latency tail checks whose speculative values exceed `max_ratio` × the baseline
    quantile on more than 1 − q of the model's healthy pairs: a tail past the tolerance,
    where the detector's alarms are detections, not false alarms bounded by the budget."""
    tails = sample.latency_tails(config) if sample.latency else {}
    out = []
    for q in config.latency.quantiles:
        for metric in config.latency.metrics:
            tail = tails.get(f"{metric}.p{q * 100:g}")
            if tail is not None and tail["exceedance_rate"] > 1.0 - q:
                out.append(f"latency.{metric}.p{q * 100:g}")
    return out


def stress_row(counter: TripCounter, done: int, beyond: Sequence[str]) -> dict[str, Any]:
    """One budget's line of the stress section: the trips against the budget, all of them
    and the false ones (not solely on checks past the tolerance)."""
    row = counter.summary(done)
    budget = row["budget_per_30_days"]
    scale = SECONDS_PER_30_DAYS / counter.config.budget.design_pair_interval_s / max(done, 1)
    by_gate: dict[str, int] = {}
    for trip in counter.trips:
        for name in trip["by"]:
            by_gate[name] = by_gate.get(name, 0) + 1

    def breach(trip: dict[str, Any]) -> bool:
        checks = set(trip["by"]) - {"latency", "gate:latency"}
        return bool(checks) and checks <= set(beyond)

    false = sum(not breach(trip) for trip in counter.trips)
    arl0 = detector_arl0(counter.config)
    return {
        **row,
        "detector_arl0": arl0,
        "h": lorden_threshold(arl0),
        "observed_over_budget": row["trips_per_30_days"] / budget,
        "upper95_over_budget": row["trips_per_30_days_upper95"] / budget,
        "within_budget": row["trips_per_30_days"] <= budget,
        "upper95_within_budget": row["trips_per_30_days_upper95"] <= budget,
        "false_trips": false,
        "trips_beyond_tolerance": len(counter.trips) - false,
        "false_trips_per_30_days": false * scale,
        "false_trips_per_30_days_upper95": poisson_upper95(false) * scale,
        "false_over_budget": false * scale / budget,
        "false_within_budget": false * scale <= budget,
        "false_upper95_over_budget": poisson_upper95(false) * scale / budget,
        # The evidence restarts at a trip, so one evaluation counts one trip at most.
        "trips_per_evaluation": len(counter.trips) / max(counter.evaluations, 1),
        "saturated": len(counter.trips) > SATURATION * max(counter.evaluations, 1),
        "countable_per_30_days": counter.evaluations * scale,
        "trips_by": dict(sorted(by_gate.items())),
        "trip_log": counter.trips[:20],
    }


def extrapolate(rows: Sequence[dict[str, Any]], target: float, *, false: bool) -> dict[str, Any]:
    """The `target` budget's rate if the observed rate / budget of the false (or all)
    trips at the smallest budget with one held there too. An extrapolation, not a
    measurement: it assumes the detectors' false-alarm rate scales like e^-h, in
    proportion to the budget. Saturated budgets are skipped (they undercount); with no
    trip at any other budget only the bound is extrapolated, from the budget that
    bounds the ratio most tightly."""
    count, ratio, upper = (
        ("false_trips", "false_over_budget", "false_upper95_over_budget")
        if false
        else ("trips", "observed_over_budget", "upper95_over_budget")
    )
    usable = [r for r in rows if not r["saturated"]]
    measured = sorted((r for r in usable if r[count] > 0), key=lambda r: r["budget_per_30_days"])
    if not usable:
        return {"from_budget": None, "to_budget": target, "observed_over_budget": None}
    row = measured[0] if measured else min(usable, key=lambda r: r[upper])
    return {
        "from_budget": row["budget_per_30_days"],
        "to_budget": target,
        "observed_over_budget": row[ratio],
        "expected_per_30_days": row[ratio] * target if measured else None,
        "expected_per_30_days_upper95": row[upper] * target,
    }


def stress_result(
    counters: dict[float, TripCounter],
    done: int,
    sample: HealthySample,
    config: GatesConfig,
    wall_s: float,
) -> dict[str, Any]:
    beyond = beyond_tolerance(sample, config)
    rows = {f"{b:g}": stress_row(c, done, beyond) for b, c in counters.items()}
    target = config.budget.false_rollbacks_per_30_days
    return {
        **rows,
        "extrapolation": {
            "note": (
                "an extrapolation, not a measurement: the rate at the production budget "
                "if the observed trips per budget held there (false-alarm rates of these "
                "detectors scale like e^-h, in proportion to the budget)"
            ),
            "false_trips": extrapolate(list(rows.values()), target, false=True),
            "all_trips": extrapolate(list(rows.values()), target, false=False),
            "beyond_tolerance_checks": beyond,
        },
        "wall_s": round(wall_s, 1),
    }
