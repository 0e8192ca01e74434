"""The healthy section: `healthy_run` draws one noise model's healthy pairs and judges
them with `trips.TripCounter` at the production budget (all gates every half of the
shortest statistical window, CUSUM peaks counted), at the daemon's own 60 s cadence over
the first pairs, and under the stress budgets (`stress`), the liveness rule at every
chunk (at each budget's share: it is one of the budgeted detectors); it returns the
trips, the model's `HealthySample` and the stress rows."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from benchmarks.gate_power.noise import NoiseModel
from benchmarks.gate_power.sample import HealthySample
from benchmarks.gate_power.streams import PairStream, default_prompts
from benchmarks.gate_power.stress import stress_result, with_budget
from benchmarks.gate_power.trips import TripCounter
from gates import GateDecision, GatesConfig, liveness_gate
from gates.cycle import window_bounds
from gates.records import PairRecord
from gates.stats.budget import detector_arl0


def alive(records: Sequence[PairRecord], config: GatesConfig) -> GateDecision:
    """The liveness gate on `records` at its share of `config`'s budget."""
    return liveness_gate(
        records, config.liveness, now=records[-1].started_at, arl0=detector_arl0(config)
    )


def healthy_run(
    model: NoiseModel,
    *,
    seed: int,
    pairs: int,
    config: GatesConfig,
    budget_s: float | None = None,
    chunk: int = 6,
    stress_budgets: Sequence[float] = (),
    stress_pairs: int = 0,
    cadence_pairs: int = 0,
) -> tuple[dict[str, Any], HealthySample, dict[str, Any]]:
    """Healthy pairs through the production gates and policy; trips as `TripCounter` counts.
    The first `stress_pairs` pairs are also judged under each of `stress_budgets` (the
    time spent on them does not count against `budget_s`). The first `cadence_pairs`
    are also judged exactly as the daemon judges them: every gate every 6 pairs (60 s),
    a trip only when the switch rolls back (or the liveness rule fails) — `cadence`."""
    _, longest_pairs = window_bounds(config)
    sections = (config.error, config.latency, config.quality, config.speedup, config.drift)
    shortest = min(s.window_pairs for s in sections if s.window_pairs is not None)
    every = max(6, (shortest // 2) // 6 * 6)
    categories = len({p.category for p in default_prompts()})
    live = config.liveness.window_pairs or longest_pairs or 10_000
    stream = PairStream(model, seed)
    sample = HealthySample()
    records: list[PairRecord] = []
    counter = TripCounter(config, every=every, live=live)
    stress = {
        b: TripCounter(with_budget(config, b), every=every, live=live) for b in stress_budgets
    }
    cadence = TripCounter(config, every=6, live=live, peaks=False)
    liveness_checks = 0
    started = time.perf_counter()
    stress_s = 0.0
    cadence_s = 0.0
    done = 0
    while done < pairs:
        if budget_s is not None and time.perf_counter() - started - stress_s - cadence_s > budget_s:
            break
        for record in stream.take(chunk):
            records.append(record)
            sample.add(record)
        done += chunk
        if len(records) > 2 * (longest_pairs or 10_000):
            del records[: len(records) - (longest_pairs or 10_000)]
        liveness = alive(records[-live:], config)
        liveness_checks += 1
        counter.observe(records, done, liveness, categories)
        if done <= cadence_pairs:
            cadence_started = time.perf_counter()
            cadence.observe(records, done, liveness, categories)
            cadence_s += time.perf_counter() - cadence_started
        if done <= stress_pairs:
            stress_started = time.perf_counter()
            for stressed_counter in stress.values():
                stressed = alive(records[-live:], stressed_counter.config)
                stressed_counter.observe(records, done, stressed, categories)
            stress_s += time.perf_counter() - stress_started
    result = {
        **counter.summary(done),
        "liveness_checks": liveness_checks,
        "trip_log": counter.trips[:20],
        "reference_pin_min_samples": config.drift.pin_min_samples,
        "wall_s": round(time.perf_counter() - started - stress_s - cadence_s, 1),
        "cadence": (
            {
                **cadence.summary(min(done, cadence_pairs)),
                "trip_log": cadence.trips[:20],
                "wall_s": round(cadence_s, 1),
                "rule": "every gate every 6 pairs (60 s), a trip only when the switch rolls "
                "back or the liveness rule fails: the daemon's own",
            }
            if cadence_pairs
            else None
        ),
        **sample.summary(config),
    }
    stressed_pairs = min(done, stress_pairs)
    summary = stress_result(stress, stressed_pairs, sample, config, stress_s) if stress else {}
    return result, sample, summary
