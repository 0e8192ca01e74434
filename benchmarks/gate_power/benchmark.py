"""The whole benchmark: `run` sizes the parts (`--quick` or full), runs the healthy
section for each noise model and `SecondHalf` (the faults, the drift pins and the default
schedule: everything that needs only the realistic model's healthy sample), in a second
spawned process beside the healthy section when `jobs` ≥ 2, and assembles the result
with the configuration it was judged under."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import structlog

from benchmarks.gate_power.detection import fault_runs
from benchmarks.gate_power.faults import PREFIX_PAIRS, SCREEN_MARGIN
from benchmarks.gate_power.healthy import healthy_run
from benchmarks.gate_power.noise import (
    deployment_bf16,
    duplicated_pairs,
    embedded_fit,
    flaky_infra,
    healthy_stalls,
    realistic,
)
from benchmarks.gate_power.pins import drift_pins
from benchmarks.gate_power.sample import KEPT_PAIRS, HealthySample
from benchmarks.gate_power.schedule import default_schedule
from benchmarks.gate_power.streams import PairStream
from benchmarks.gate_power.stress import STRESS_BUDGETS
from gates import GatesConfig
from gates.stats.budget import SECONDS_PER_30_DAYS, budget_shares, detector_arl0, detector_count
from gates.stats.sequential import lorden_threshold

# The daemon's own cadence (every gate every 60 s) over the first pairs of each healthy
# run: a full evaluation of a 5,000-pair window costs about 0.5 s on 2 cores.
QUICK_CADENCE_PAIRS = 1_200
FULL_FAULT_SEEDS = 30  # at least 30: a 95 % interval on each median
# The cadence costs most where the windows are full (5,000 pairs, up to 0.5 s an
# evaluation): 3,000 pairs took 108-118 s per model on 2 cores; a full run at 20,004
# was stopped after 21 minutes, still on its first model.
FULL_CADENCE_PAIRS = 6_000
FULL_HEALTHY_MINUTES = 6.0  # per model (4 minutes gave 153,000-216,000 pairs)


FULL_STRESS_PAIRS = 100_002  # per model; 0 trips then bound the rate at 7.8 per 30 days
STRESSED_MODELS = ("realistic", "embedded_fit")  # the calibration is measured on these


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _quiet_pair_logs() -> None:
    """The second process's start: the pair runner logs every pair at info, which a
    spawned process would print (hundreds of megabytes in a full run)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


@dataclass(frozen=True)
class SecondHalf:
    """The fault runs, the drift pins and the default schedule: everything that needs no
    more than the realistic model's healthy sample, so that a second process can run it
    (`run(jobs=2)`) beside the healthy section — about half of the work each."""

    seed: int
    sample_pairs: int
    seeds: Sequence[int]
    cap: int
    screen: int
    only_faults: Sequence[str] | None
    prefix_pairs: int
    pins: int
    schedule_cap_hours: float

    def run(
        self,
        config: GatesConfig,
        sample: HealthySample | None = None,
        log: Callable[[str], None] = log_to_stderr,
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        if sample is None:
            # The same stream as the healthy section's realistic run: the same sample.
            stream = PairStream(realistic(), self.seed)
            sample = HealthySample()
            for record in stream.take(self.sample_pairs):
                sample.add(record)
        log(f"faults: seeds {list(self.seeds)}, cap {self.cap} pairs")
        fault_result = fault_runs(
            seeds=self.seeds,
            cap=self.cap,
            screen=self.screen,
            config=config,
            healthy=sample,
            only=self.only_faults,
            prefix_pairs=self.prefix_pairs,
            log=log,
        )
        log(f"drift pins: {self.pins} per category")
        pins_result = drift_pins(sample, config, pins=self.pins, seed=self.seed)
        log(f"  {pins_result['pins_with_a_false_fail']} of {pins_result['pins']} with a false FAIL")
        log("default schedule")
        by_model = {
            model.name: default_schedule(
                model, seed=self.seed, config=config, cap_hours=self.schedule_cap_hours
            )
            for model in (realistic(), embedded_fit())
        }
        schedule = {"hours_to_all_pass": by_model["realistic"]["hours_to_all_pass"], **by_model}
        return fault_result, pins_result, schedule


def run(
    *,
    quick: bool,
    seed: int,
    healthy_pairs: int | None = None,
    healthy_budget_s: float | None = None,
    fault_seeds: int | None = None,
    cap: int | None = None,
    screen: int = 60,
    schedule_cap_hours: float = 12.0,
    prefix_pairs: int = PREFIX_PAIRS,
    only_faults: Sequence[str] | None = None,
    stress_budgets: Sequence[float] = STRESS_BUDGETS,
    stress_pairs: int | None = None,
    pins_per_category: int | None = None,
    cadence_pairs: int | None = None,
    jobs: int = 1,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The whole benchmark. With `jobs` ≥ 2 the fault runs, the drift pins and the
    default schedule go to a second process, which draws the realistic model's healthy
    sample again (the same stream: the same figures) while this one runs the healthy
    section. A full run's healthy section is bounded in time, not pairs, so there the
    second process draws `KEPT_PAIRS` pairs: every per-pair figure is kept only that far
    anyway, and only the sample's error tally (the oracles' baseline error rate) counts
    fewer pairs than the one-process run's."""
    started = time.perf_counter()
    config = GatesConfig()
    if healthy_pairs is None:
        healthy_pairs = 20_004 if quick else 10_000_000
    if stress_pairs is None:
        stress_pairs = healthy_pairs if quick else FULL_STRESS_PAIRS
    if cadence_pairs is None:
        cadence_pairs = QUICK_CADENCE_PAIRS if quick else FULL_CADENCE_PAIRS
    if healthy_budget_s is None and not quick:
        healthy_budget_s = FULL_HEALTHY_MINUTES * 60.0
    seeds = list(range(seed, seed + (fault_seeds or (3 if quick else FULL_FAULT_SEEDS))))
    cap = cap or (2_400 if quick else 6_000)
    pins = pins_per_category or (600 if quick else 5_000)
    second = SecondHalf(
        seed=seed,
        sample_pairs=min(healthy_pairs, KEPT_PAIRS),
        seeds=seeds,
        cap=cap,
        screen=screen,
        only_faults=None if only_faults is None else tuple(only_faults),
        prefix_pairs=prefix_pairs,
        pins=pins,
        schedule_cap_hours=schedule_cap_hours,
    )
    pending: Future[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] | None = None
    if jobs >= 2:
        pool = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_quiet_pair_logs)
        pending = pool.submit(second.run, config)
        pool.shutdown(wait=False)  # the one job still runs; the process exits after it
        log(f"faults, drift pins and the default schedule in a second process (jobs {jobs})")
    healthy: dict[str, Any] = {}
    samples: dict[str, HealthySample] = {}
    stress: dict[str, Any] = {}
    for model in (
        realistic(),
        embedded_fit(),
        deployment_bf16(),
        flaky_infra(),
        duplicated_pairs(),
        healthy_stalls(),
    ):
        # the other models are judged at the production budget only: their question is
        # whether ties, bursts, correlated queueing, flaky infrastructure, replayed pairs
        # or stalls shared by a burst cycle's pairs trip anything at all
        stressed = stress_budgets if model.name in STRESSED_MODELS else ()
        log(
            f"healthy {model.name}: {healthy_pairs} pairs at most"
            + (
                f", the first {stress_pairs} also at budgets "
                f"{', '.join(f'{b:g}' for b in stressed)} per 30 days"
                if stressed
                else ""
            )
        )
        healthy[model.name], samples[model.name], model_stress = healthy_run(
            model,
            seed=seed,
            pairs=healthy_pairs,
            config=config,
            budget_s=healthy_budget_s,
            stress_budgets=stressed,
            stress_pairs=stress_pairs if stressed else 0,
            cadence_pairs=cadence_pairs,
        )
        if stressed:
            stress[model.name] = model_stress
        at_cadence = healthy[model.name]["cadence"] or {}
        log(
            f"  {healthy[model.name]['trips']} trips, {healthy[model.name]['wall_s']}s; "
            f"budget stress {stress.get(model.name, {}).get('wall_s', 0.0)}s; at the 60 s "
            f"cadence {at_cadence.get('trips')} trips in {at_cadence.get('simulated_pairs')} "
            f"pairs, {at_cadence.get('wall_s')}s"
        )
    if pending is None:
        fault_result, pins_result, schedule = second.run(config, samples["realistic"], log)
    else:
        log("waiting for the second process")
        fault_result, pins_result, schedule = pending.result()
    arl0 = detector_arl0(config)
    result: dict[str, Any] = {
        "healthy": healthy,
        "budget_stress": stress,
        "faults": fault_result,
        "drift_pins": pins_result,
        "default_schedule": schedule,
        "config": {
            "budget": config.budget.model_dump(),
            "detectors": detector_count(config),
            "budget_shares": budget_shares(config),
            "detector_arl0": arl0,
            "h": lorden_threshold(arl0),
            "pairs_per_30_days": SECONDS_PER_30_DAYS / config.budget.design_pair_interval_s,
            "fault_noise_model": "realistic",
            "prefix_pairs": prefix_pairs,
            "evaluate_every_pairs": 6,
            "screen_every_pairs": screen,
            "screen_margin": SCREEN_MARGIN,
            "mode": "quick" if quick else "full",
            "seed": seed,
            "healthy_budget_s": healthy_budget_s,
            "stress_budgets": list(stress_budgets),
            "stress_pairs": stress_pairs,
            "jobs": 1 if pending is None else 2,
        },
    }
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    return result
