"""The faults section: `fault_runs` injects every fault after a healthy prefix on each
seed and measures, on the same pairs, canaryd's pairs (and minutes) to the trip (and,
for a fault marked `screen_off`, with the error gate's outage screen off), the
Kayenta-style judges' at each window and the oracles'; it reports medians over seeds with
censored runs counted as longer than any (`censored_median`) and a distribution-free
interval for canaryd's (`median_ci95`)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.gate_power.comparators import (
    KAYENTA_WINDOWS,
    SELF_REFERENCED,
    edge_oracle_for,
    kayenta_edge_test,
    kayenta_pairs,
    kayenta_phase,
    kayenta_tolerance,
    metric_values,
    oracle_for,
    oracle_pairs,
)
from benchmarks.gate_power.faults import (
    DRIFT_CATEGORY,
    DRIFT_DROP,
    PREFIX_PAIRS,
    base_model,
    calibrated_config,
    canaryd_pairs_to_trip,
    category_acceptance,
    drift_rate_for,
    faults,
    minutes_on_schedule,
)
from benchmarks.gate_power.noise import realistic
from benchmarks.gate_power.sample import HealthySample
from benchmarks.gate_power.streams import FaultStream, PairStream
from gates import GatesConfig, ReferenceStats, pin_reference
from gates.records import PairRecord
from gates.stats.budget import detector_arl0
from gates.stats.sequential import lorden_threshold


def censored_median(values: Sequence[int | float | None]) -> float | None:
    """Median with a censored run (None) counted as longer than any detection."""
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    keyed = [math.inf if v is None else float(v) for v in ordered]
    middle = statistics.median(keyed)
    return None if math.isinf(middle) else middle


def fault_runs(
    *,
    seeds: Sequence[int],
    cap: int,
    screen: int,
    config: GatesConfig,
    healthy: HealthySample,
    only: Sequence[str] | None = None,
    prefix_pairs: int = PREFIX_PAIRS,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    model = realistic()
    arl0 = detector_arl0(config)
    h = lorden_threshold(arl0)
    drift_rate = drift_rate_for(model, DRIFT_CATEGORY, DRIFT_DROP, seed=seeds[0] + 101)
    drift_after = category_acceptance(
        model.with_speculative(acceptance_rate_by_category={DRIFT_CATEGORY: drift_rate}),
        DRIFT_CATEGORY,
        max(300, cap // 4),
        seed=seeds[0] + 202,
    )
    before = healthy.acceptance_by_category[DRIFT_CATEGORY]
    chosen = [f for f in faults(drift_rate) if only is None or f.name in only]
    after: dict[str, HealthySample] = {f.name: HealthySample() for f in chosen}
    results: dict[str, dict[str, Any]] = {
        f.name: {
            "canaryd": [],
            "tripped_by": [],
            "oracle": [],
            "edge_oracle": [],
            "minutes": [],
            "screen_off": [],
            "calibration": [],
            "evaluations": 0,
        }
        | {f"kayenta_w{w}": [] for w in KAYENTA_WINDOWS}
        | {f"kayenta_tolerant_w{w}": [] for w in KAYENTA_WINDOWS}
        | {f"kayenta_edge_w{w}": [] for w in KAYENTA_WINDOWS}
        for f in chosen
    }
    bases = {name: base_model(name) for name in {f.base for f in chosen}}
    screen_off = config.model_copy(
        update={"error": config.error.model_copy(update={"outage_spans": ()})}
    )
    for seed in seeds:
        prefixes: dict[str, list[PairRecord]] = {}
        pins: dict[str, dict[str, ReferenceStats]] = {}
        for fault in chosen:
            base = bases[fault.base]
            if fault.base not in prefixes:
                prefixes[fault.base] = PairStream(base, seed).take(prefix_pairs)
                pins[fault.base] = pin_reference(
                    prefixes[fault.base],
                    min_samples=config.drift.pin_min_samples,
                    max_samples=config.drift.pin_target_samples,
                )
            prefix, references = prefixes[fault.base], pins[fault.base]
            stream = FaultStream(
                PairStream(fault.model(base), seed + 7919, first=prefix_pairs),
                cap,
            )
            started = time.perf_counter()
            judged = config
            row = results[fault.name]
            if fault.calibrated:
                judged, calibration = calibrated_config(fault, base, config, seed)
                row["calibration"].append(calibration)
            pairs, gate, evaluations, faster = canaryd_pairs_to_trip(
                prefix, stream, judged, references, screen=screen
            )
            row["canaryd"].append(pairs)
            row["minutes"].append(minutes_on_schedule(pairs, faster))
            row["tripped_by"].append(gate)
            row["evaluations"] += evaluations
            if fault.screen_off:
                unscreened, _, more, _ = canaryd_pairs_to_trip(
                    prefix, stream, screen_off, references, screen=screen
                )
                row["screen_off"].append(unscreened)
                evaluations += more
            # acceptance and e2e are judged against the speculative arm's healthy prefix
            reference = metric_values(fault, prefix)[0] if fault.metric in SELF_REFERENCED else []
            tolerant = kayenta_tolerance(fault, config)
            at_edge = kayenta_edge_test(fault, config)
            for width in KAYENTA_WINDOWS:
                phase = kayenta_phase(seed, width)
                row[f"kayenta_w{width}"].append(
                    kayenta_pairs(fault, prefix, stream, reference, width, width / arl0, phase)
                )
                row[f"kayenta_tolerant_w{width}"].append(
                    kayenta_pairs(
                        fault, prefix, stream, reference, width, width / arl0, phase, tolerant
                    )
                )
                row[f"kayenta_edge_w{width}"].append(
                    kayenta_pairs(
                        fault, prefix, stream, reference, width, width / arl0, phase, edge=at_edge
                    )
                )
            for record in stream.records:
                after[fault.name].add(record)
            oracle = oracle_for(fault, healthy, drift_after)
            row["oracle"].append(oracle_pairs(oracle, stream, h))
            row["oracle_statistic"] = oracle.description
            edge = edge_oracle_for(fault, healthy, config)
            if edge is not None:
                row["edge_oracle"].append(oracle_pairs(edge, stream, h))
                row["edge_oracle_statistic"] = edge.description
            log(
                f"  fault {fault.name} seed {seed}: canaryd {pairs} ({gate})"
                + (f", screen off {row['screen_off'][-1]}" if fault.screen_off else "")
                + f", oracle "
                f"{row['oracle'][-1]}, {len(stream.records)} pairs, {evaluations} "
                f"evaluations, {time.perf_counter() - started:.1f}s"
            )
    out: dict[str, Any] = {}
    for fault in chosen:
        row = results[fault.name]
        kayenta = {w: censored_median(row[f"kayenta_w{w}"]) for w in KAYENTA_WINDOWS}
        finite = {w: m for w, m in kayenta.items() if m is not None}
        best = min(finite, key=lambda w: finite[w]) if finite else None
        gates_tripped = sorted({g for g in row["tripped_by"] if g is not None})
        tolerant_median, tolerant_best = _best_window(row, "kayenta_tolerant")
        edge_median, edge_best = _best_window(row, "kayenta_edge")
        ci, coverage = median_ci95(row["canaryd"])
        edge_oracle = censored_median(row["edge_oracle"]) if row["edge_oracle"] else None
        entry: dict[str, Any] = {
            "canaryd_pairs_median": censored_median(row["canaryd"]),
            "canaryd_pairs_ci95": ci,
            "canaryd_pairs_ci_coverage": coverage,
            # The fair comparison: the same tolerance, and its false-alarm
            # rate set at the tolerance's edge as canaryd's detectors' are.
            "kayenta_tolerant_pairs_median": edge_median,
            "kayenta_tolerant_best_window": edge_best,
            "kayenta_tolerant_calibration": "at the edge of the tolerance (kayenta_edge_test)",
            "kayenta_tolerant_by_window": {
                str(w): censored_median(row[f"kayenta_edge_w{w}"]) for w in KAYENTA_WINDOWS
            },
            # Kayenta's own rule (significance at a healthy arm's alpha and the effect past
            # the tolerance): its false-alarm rate at the edge is far above the budget.
            "kayenta_tolerant_healthy_alpha_pairs_median": tolerant_median,
            "kayenta_tolerant_healthy_alpha_best_window": tolerant_best,
            "oracle_at_tolerance_pairs": edge_oracle,
            "canaryd_minutes_default_schedule": censored_median(row["minutes"]),
            "canaryd_minutes_by_seed": row["minutes"],
            "kayenta_pairs_median": finite.get(best) if best is not None else None,
            "kayenta_best_window": best,
            "kayenta_alpha": best / arl0 if best is not None else None,
            "kayenta_by_window": {str(w): m for w, m in kayenta.items()},
            "optimal_pairs": censored_median(row["oracle"]),
            "seeds": list(seeds),
            "canaryd_pairs": row["canaryd"],
            "kayenta_pairs": row[f"kayenta_w{best}"] if best is not None else None,
            "optimal_pairs_by_seed": row["oracle"],
            "optimal_within_tolerance_pairs": (
                censored_median(row["edge_oracle"]) if row["edge_oracle"] else None
            ),
            "optimal_within_tolerance_by_seed": row["edge_oracle"] or None,
            "optimal_within_tolerance_statistic": row.get("edge_oracle_statistic"),
            "tripped_by": gates_tripped[0] if len(gates_tripped) == 1 else gates_tripped or None,
            "tripped_by_seed": row["tripped_by"],
            "censored_at": cap,
            "evaluations": row["evaluations"],
            "oracle_statistic": row["oracle_statistic"],
            "fault": fault.described(),
        }
        if fault.calibrated:
            # By seed: what `canaryd calibrate` saw before the onset and which margin judged.
            entry["calibration"] = row["calibration"]
        if fault.screen_off:
            entry["screen_off_pairs_median"] = censored_median(row["screen_off"])
            entry["screen_off_pairs"] = row["screen_off"]
            entry["screen_off"] = "the same pairs judged with gates.error.outage_spans = []"
        if fault.metric == "acceptance":
            entry["measured_drop"] = round(
                1.0 - statistics.fmean(drift_after) / statistics.fmean(before), 4
            )
            entry["category"] = DRIFT_CATEGORY
        if fault.metric == "e2e":
            entry["kayenta_comparison"] = "speculative e2e vs its healthy prefix"
            entry["latency_tails_after"] = after[fault.name].latency_tails(config)
        out[fault.name] = entry
    return out


def _best_window(row: dict[str, Any], judge: str) -> tuple[float | None, int | None]:
    """(the smallest median over seeds among the judge's windows, that window)."""
    medians = {w: censored_median(row[f"{judge}_w{w}"]) for w in KAYENTA_WINDOWS}
    finite = {w: m for w, m in medians.items() if m is not None}
    if not finite:
        return None, None
    best = min(finite, key=lambda w: finite[w])
    return finite[best], best


def median_ci95(values: Sequence[int | None]) -> tuple[list[int | None], float]:
    """A distribution-free interval for the median over seeds: [x(k), x(n−k+1)] with the
    largest k whose coverage 1 − 2 P(Bin(n, ½) ≤ k − 1) is at least 95 %, else [min, max]
    and its coverage (below 95 % with fewer than 6 seeds). Censored runs (None) sort
    last and stay None."""
    from scipy.stats import binom

    n = len(values)
    if n == 0:
        return [None, None], 0.0
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    k = 1
    while k + 1 <= n // 2 and 1.0 - 2.0 * float(binom.cdf(k, n, 0.5)) >= 0.95:
        k += 1
    coverage = 1.0 - 2.0 * float(binom.cdf(k - 1, n, 0.5))
    return [ordered[k - 1], ordered[n - k]], round(coverage, 4)
