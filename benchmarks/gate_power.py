"""How often the production gates roll back healthy traffic, and how fast they catch faults.

Everything is driven through the production code: pairs come from the real `PairRunner`
over seeded, noisy `FakeEngine` arms on the shipped prompt suites (`StratifiedSampler`),
time is simulated (one pair every 10 s, the false-alarm budget's design rate, unless
stated otherwise), and decisions come from `gates.evaluate_all`, `gates.pin_reference`
and `gates.step` with `GatesConfig()` defaults, with the daemon's window (`window_bounds`)
and its evidence restart (`since` = the switch's last transition).

Noise models (both arms draw independently):
- `realistic`: per-request log-normal duration sd 0.5, 2 % stalls ×5 and 1 % errors on
  each arm; speculative `acceptance_sd` 0.15, which gives a per-category acceptance-length
  coefficient of variation of 0.30 (the run reports the CV it measured); no corruption.
- `embedded_fit`: the embedded SmolLM2-135M-Instruct measured on 2 CPU cores with
  transformers prompt lookup, k = 8, 96 new tokens, greedy: autoregressive 26.6 tok/s
  (`tpot_s` = 1/26.6), and median speedup per category translation 1.70×, rag 1.78×,
  summarisation 1.09×, math 0.97×, qa 0.88×, open writing 0.81× (used for multi_turn),
  extraction 1.00× (docs/engines.md); code and structured were not measured and get the
  median of the others, 1.00×. Per category, the fake's acceptance rate is fitted by
  bisection so that the fake's median speedup matches (`--refit` redoes it and prints
  the fit). The fake's verify-step cost, tpot × (1 + 0.1 k), is kept: at k = 8 it puts
  the 5.0 tokens per verify step measured on one summarisation prompt at a median
  2.5-2.7× where 2.9× was measured, close enough for gate statistics. Not recorded, so
  assumed: TTFT 0.08 s, per-request duration sd 0.2, 1 % stalls ×3, no errors (none
  were seen), `acceptance_sd` 0.15. The fake charges a full verify step even when a
  real prompt lookup would find nothing to draft, which makes its low-acceptance
  requests slower than the real engine's: its TPOT and e2e tails are pessimistic.

- `deployment_bf16`: the realistic arms on a bf16 GPU deployment (`DeploymentNoise`):
  a diurnal load and a queueing delay shared by both arms of a pair (within-pair
  correlated TTFT and e2e), error bursts (1 in 5,000 pairs, ~30 pairs long, each arm
  failing alone 30 % of the time inside) and 0.2 % timeouts per arm, and numeric-tie
  divergence on 3 % of greedy pairs (margin under half `tie_margin_nats`). Healthy runs
  only, at the production budget; the `greedy_verify_bf16` fault (30 % real divergences)
  is injected into it. 30 % of its pairs are sampled (temperature 0.7) with a seed per
  arm (`prompts.seed_per_arm`): the fake samples by seed, so a lossless pair's two
  outputs are independent draws and the sampled-pair detectors (likelihood, argmax
  sign-flip, implausible tokens) see exactly exchangeable noise, scored by the fake
  teacher.

Reported (JSON with `--out`, a table on stdout):
- healthy: per model, trips of the switch over many healthy pairs. A full evaluation of
  the 5,000-pair window is costly, so all gates are evaluated every half of the shortest
  statistical window (drift's 2,000 pairs) and a trip is also counted when any enforce
  detector's CUSUM peak inside its window reached its threshold (read from the
  decision's detail), i.e. an alarm that the 60 s cadence could have seen; the liveness
  rule is evaluated at the 60 s cadence. After a trip the switch is restored and the
  evidence restarts, as after a human restore. Rates are scaled to 30 days at the design
  rate; the upper bound is the 95 % Poisson bound (3.0 for no trip).
- budget_stress: per model, the calibration where it can be measured. The healthy
  section's pairs (the first `stress_pairs` of them) are judged again, by the same code
  and trip rules, under `GatesConfig` with only the budget inflated (default 10^5, 10^4,
  1,000, 100 and 10 false rollbacks per 30 days, so h drops by log(10^6) … log(10^2)):
  trips, trips per 30 days with the 95 % Poisson bound, observed / budget and whether
  observed ≤ budget. A trip whose only checks are latency tails past the tolerance in
  the model (speculative values above `max_ratio` × the baseline quantile on more than
  1 − q of the healthy pairs) is a detection, not a false alarm, and is counted apart
  (`trips_beyond_tolerance`); the rest are `false_trips`. One evaluation counts one
  trip at most, so a budget with trips on more than a quarter of its evaluations is
  marked saturated. The extrapolation (labelled so, not a measurement) is the
  production budget's rate if observed / budget at the smallest unsaturated budget
  with a trip held there (the detectors' false-alarm rate scales like e^-h, i.e. in
  proportion to the budget); with no trip, its 95 % bound from the tightest budget.
- faults: after a 1,500-pair healthy prefix (drift references pinned from it), the
  speculative arm is switched to the fault; every enforce gate is evaluated every 6 pairs
  (60 s) and the switch policy stepped, until it trips or the cap. To save time the
  evaluations are first screened every `screen` pairs and the 6-pair cadence is replayed
  over a screened interval whenever its last evaluation shows a FAIL or a CUSUM peak of
  at least 0.9 h (while the window still starts at the prefix, a detector with fixed
  parameters that alarmed at any 60 s evaluation in the interval shows that peak; on
  seeds 0-2 the drift, error, corruption and mismatch faults trip at exactly the same
  pair with and without the screen); the liveness rule is checked at every 60 s
  evaluation. A run that has not tripped by the cap counts as longer than any in the
  medians (null when it is the median). The faults run on the realistic model: the
  `code` category's acceptance rate lowered (by bisection) until its mean acceptance
  length falls 30 % (the drop measured on a separate sample is reported), speculative
  `latency_factor` 1.5, `error_rate` 0.05, `corrupt_rate` 0.03 and 0.8.
  Against canaryd, on the same simulated pairs from the onset:
  - a Kayenta-style judge: a two-sided Mann–Whitney U test over fixed, non-overlapping
    windows of W pairs on the judge's own clock (the onset falls at a seeded random point
    of a window, whose healthy pairs it holds), alpha = W / ARL0 so that its
    false-alarm rate is one detector's share of the budget; the best W is reported. It
    compares the category's acceptance lengths, and the speculative e2e, with the
    speculative arm's healthy prefix (against the baseline arm e2e would fail on healthy
    traffic: speculation is faster by design), the error indicator with the baseline
    arm's in the same window, and the greedy mismatch indicator with zero.
  - an oracle at the tolerance (`optimal_within_tolerance_pairs`): the same CUSUM with
    the edge of the tolerance as the pre-change state (errors at `max_error_rate`,
    mismatches at `max_mismatch_rate`, a typical ratio of `max_ratio` on the latency
    metric the fault takes furthest past it): the best any gate that respects its
    tolerance can do; none for drift, a change from the arm's own reference.
  - an oracle CUSUM with the same h = log(ARL0) on the per-pair log-likelihood ratio of
    the known post- against the known pre-change distribution: Bernoulli errors
    0.01 → 0.05; for mismatches the exact ratio (a mismatch is impossible before the
    change, so the first one alarms); for latency the density of log(speculative e2e /
    baseline e2e) from the healthy run (Gaussian KDE) against the same shifted by
    log 1.5, which is exactly what `latency_factor` does; for drift Gaussians with the
    means and sds of large healthy and faulty samples of the category.
- per fault, besides the above: `canaryd_pairs_ci95` (a distribution-free interval for
  the median over seeds, with its coverage: 95 % needs 6 seeds), `oracle_at_tolerance_pairs`
  (= `optimal_within_tolerance_pairs`), `kayenta_tolerant_pairs_median` (a Kayenta-style
  judge given canaryd's tolerance and calibrated where canaryd's detectors are, at the
  edge of the tolerance: one-sided tests whose null hypothesis is the edge, at alpha =
  W / ARL0 — Mann–Whitney on acceptance scaled by 1 / (1 − `max_relative_drop`) and on
  e2e scaled by 1 / (1 + `max_regression`), the Farrington–Manning score test of the
  error rate against the baseline's plus `max_excess_rate`, an exact binomial test of
  real divergences against `max_mismatch_rate`; best W; `kayenta_edge_test`),
  `kayenta_tolerant_healthy_alpha_pairs_median` (Kayenta's own rule: the two-sided test
  at a healthy arm's alpha and the effect past the same tolerance, as allowedIncrease /
  allowedDecrease; an arm at the edge passes both in about half the windows long
  enough to be significant, so its false-alarm rate there is far above the budget: not
  a fair comparison), and `canaryd_minutes_default_schedule`
  (the median over seeds of the wall-clock minutes on the shipped schedule: 30 s a pair
  until the first screened evaluation at which an undecided enforce detector is past
  `speed_up_at`, then `max_pairs_per_minute` — the adaptive pace).
- drift_pins: the false drift FAILs the pins themselves cause (`drift_pins`): per
  category 600 (`--quick`) or 5,000 pins of healthy acceptance lengths, each grown from 30
  to 200 pairs and followed for the category's 30 days of pairs; the rate per category
  and its 95 % bound against the category's budget share, and the same draws judged the
  old way (a 30-pair pin taken as exact).
- default_schedule: per model, a healthy daemon at the default pair interval (30 s) with
  gates every 60 s from an empty store, references pinned as the daemon pins them: hours
  until the first evaluation at which every enforce gate PASSes (`hours_to_all_pass` at
  the top is the realistic model's), capped at 12 h.

- cadence (per healthy model): the first `--cadence-pairs` pairs judged exactly as the
  daemon judges them — every gate every 6 pairs (60 s), the switch policy stepped, a
  trip only when the switch rolls back or the liveness rule fails. A full evaluation of
  a window of thousands of pairs costs up to a second on 2 cores, which is why the long
  healthy runs use the conservative rule above; the cadence run checks it.

`--quick`: 20,004 healthy pairs per model, all of them also under the stress budgets,
the first 1,200 also at the 60 s cadence, 3 fault seeds, fault cap 2,400 pairs (about
5 minutes on 2 cores with `--jobs 2`, the default where there are 2 cores: the faults,
drift pins and schedule run in a second process; 8 minutes in one). The full run:
healthy pairs for `--healthy-minutes` per model (default 6; 4 minutes gave 153,000 to
216,000 pairs, not counting the stress and the cadence run), the first 100,002 of them
under the stress budgets (`--stress-pairs`; 50,004 took 153-159 s per model), the first
6,000 at the 60 s cadence (3,000 took 108-118 s per model), 30 fault seeds
(`--fault-seeds`), cap 6,000 pairs. Measured with `--healthy-minutes 4 --stress-pairs
50004 --cadence-pairs 3000`: 2,085 s on 2 cores; the defaults take longer.

Usage: .venv/bin/python benchmarks/gate_power.py [--quick] [--out FILE] [--seed N]
       [--healthy-minutes M] [--fault-seeds N] [--cadence-pairs N] [--stress-pairs N]
       [--jobs N] [--refit]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from scipy.optimize import minimize_scalar
from scipy.special import ndtr, xlogy
from scipy.stats import binomtest, chi2, gaussian_kde, mannwhitneyu

from canaryd.config import ScheduleConfig
from canaryd.judging.gatejob import suspicion, window_bounds
from canaryd.pairs.runner import OwnSampling, PairParams, PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from engine.types import ErrorKind, GenerationRequest, GenerationResult, SamplingParams
from gates import (
    DetectorReading,
    Evaluation,
    GateDecision,
    GatesConfig,
    GateState,
    ReferenceStats,
    SwitchMode,
    SwitchState,
    evaluate_all,
    grow_references,
    liveness_gate,
    pin_reference,
    step,
)
from gates.budget import SECONDS_PER_30_DAYS, detector_arl0, detector_count
from gates.core import checks
from gates.records import PairRecord, Prompt
from gates.sequential import bernoulli_llr, llr_cusum, lorden_threshold
from gates.switch import all_enforced_pass

T0 = datetime(2025, 1, 1, tzinfo=UTC)
DESIGN_SPACING_S = 10.0
GATE_INTERVAL_S = 60.0
PREFIX_PAIRS = 1_500
KAYENTA_WINDOWS = (50, 100, 200, 500, 1000)
SCREEN_MARGIN = 0.9  # replay the 60 s cadence once a CUSUM peak reaches this share of h
DRIFT_CATEGORY = "code"
DRIFT_DROP = 0.30
SELF_REFERENCED = ("acceptance", "e2e")
# The daemon's own cadence (every gate every 60 s) over the first pairs of each healthy
# run: a full evaluation of a 5,000-pair window costs about 0.5 s on 2 cores.
QUICK_CADENCE_PAIRS = 1_200
FULL_FAULT_SEEDS = 30  # issue #23: at least 30, a 95 % interval on each median
# The cadence costs most where the windows are full (5,000 pairs, up to 0.5 s an
# evaluation): 3,000 pairs took 108-118 s per model on 2 cores; a full run at 20,004
# was stopped after 21 minutes, still on its first model.
FULL_CADENCE_PAIRS = 6_000
FULL_HEALTHY_MINUTES = 6.0  # per model (4 minutes gave 153,000-216,000 pairs)
STRESS_BUDGETS = (100_000.0, 10_000.0, 1_000.0, 100.0, 10.0)  # false rollbacks per 30 days
# Above this share of evaluations with a trip, two alarms between evaluations are likely
# and the count undercounts (by about 13 % at a quarter): the rate is not measured.
SATURATION = 0.25
FULL_STRESS_PAIRS = 100_002  # per model; 0 trips then bound the rate at 7.8 per 30 days

# --- noise models -----------------------------------------------------------------------

EMBEDDED_SPEEDUP = {
    "translation": 1.70,
    "rag": 1.78,
    "summarisation": 1.09,
    "math": 0.97,
    "qa": 0.88,
    "multi_turn": 0.81,
    "extraction": 1.00,
    "code": 1.00,
    "structured": 1.00,
}
# Fitted by `fit_embedded` (seed 0, 720 requests per category and bisection step).
EMBEDDED_ACCEPTANCE_RATE = {
    "code": 0.4368,
    "extraction": 0.4424,
    "math": 0.4191,
    "multi_turn": 0.3022,
    "qa": 0.3624,
    "rag": 0.7151,
    "structured": 0.4428,
    "summarisation": 0.4917,
    "translation": 0.6876,
}


@dataclass(frozen=True)
class DeploymentNoise:
    """What a real GPU deployment adds to every pair, applied to the runner's records:
    a diurnal load (1 + `diurnal` × sin over 24 h of simulated time) and a queueing delay
    shared by both arms of a pair (exponential, mean `queue_s` × load, added to TTFT and
    e2e: within-pair correlated); error bursts (entered with probability `burst_rate` per
    pair, `burst_pairs` long on average, each arm failing alone with probability
    `burst_failure` inside); timeouts on `timeout_rate` of each arm's requests; and on
    `tie_rate` of the greedy pairs whose outputs agreed, a numeric-tie divergence (bf16
    kernels picking the other of two nearly tied tokens: margin below half of
    `quality.tie_margin_nats`). Sampled pairs come from the noise model
    (`NoiseModel.sampled_share`), each arm with its own seed."""

    diurnal: float = 0.4
    queue_s: float = 0.05
    burst_rate: float = 1.0 / 5_000
    burst_pairs: float = 30.0
    burst_failure: float = 0.3
    timeout_rate: float = 0.002
    tie_rate: float = 0.03
    tie_margin_nats: float = 0.1


class _Deployed:
    """A `DeploymentNoise` applied pair by pair with its own seeded generator."""

    def __init__(self, noise: DeploymentNoise, seed: int) -> None:
        self.noise = noise
        self.rng = random.Random(seed * 104_729 + 17)
        self.burst_left = 0

    def _fail(self, result: GenerationResult, kind: ErrorKind, e2e: float) -> GenerationResult:
        return GenerationResult.failed(kind, "deployment noise", e2e, result.prompt_tokens)

    def _delay(self, result: GenerationResult, delay: float) -> GenerationResult:
        if not result.ok:
            return result
        ttft = None if result.ttft_s is None else result.ttft_s + delay
        return replace(result, ttft_s=ttft, e2e_s=result.e2e_s + delay)

    def apply(self, record: PairRecord) -> PairRecord:
        noise, rng = self.noise, self.rng
        seconds = (record.started_at - T0).total_seconds()
        load = 1.0 + noise.diurnal * math.sin(2.0 * math.pi * seconds / 86_400.0)
        delay = rng.expovariate(1.0 / (noise.queue_s * load))
        arms = [self._delay(record.baseline, delay), self._delay(record.speculative, delay)]
        if self.burst_left == 0 and rng.random() < noise.burst_rate:
            self.burst_left = max(1, round(rng.expovariate(1.0 / noise.burst_pairs)))
        in_burst = self.burst_left > 0
        self.burst_left = max(0, self.burst_left - 1)
        for i, arm in enumerate(arms):
            if not arm.ok:
                continue
            if in_burst and rng.random() < noise.burst_failure:
                arms[i] = self._fail(arm, ErrorKind.HTTP, arm.e2e_s)
            elif rng.random() < noise.timeout_rate:
                arms[i] = self._fail(arm, ErrorKind.TIMEOUT, 60.0)
        scores = record.scores if all(a.ok for a in arms) else None
        if (
            scores is not None
            and scores.exact_match
            and record.temperature <= 0.0
            and rng.random() < noise.tie_rate
        ):
            tokens = max(1, record.speculative.output_tokens)
            scores = replace(
                scores,
                exact_match=False,
                first_divergence=rng.randrange(tokens),
                divergence_margin=rng.uniform(0.0, noise.tie_margin_nats / 2.0),
            )
        return replace(record, baseline=arms[0], speculative=arms[1], scores=scores)


@dataclass(frozen=True)
class NoiseModel:
    name: str
    baseline: FakeEngineConfig
    speculative: FakeEngineConfig
    params: PairParams = field(default_factory=PairParams)
    deployment: DeploymentNoise | None = None
    # The share of pairs sampled at `sampled_temperature` (the rest greedy), as mirrored
    # live traffic brings them; their seeds follow `params.seed_per_arm`.
    sampled_share: float = 0.0
    sampled_temperature: float = 0.7

    def with_speculative(self, **update: Any) -> NoiseModel:
        return replace(self, speculative=self.speculative.model_copy(update=update))


def realistic() -> NoiseModel:
    arm = FakeEngineConfig(latency_sigma=0.5, tail_rate=0.02, tail_factor=5.0, error_rate=0.01)
    return NoiseModel(
        "realistic", arm, arm.model_copy(update={"speculative": True, "acceptance_sd": 0.15})
    )


def deployment_bf16() -> NoiseModel:
    """The realistic arms on a bf16 GPU deployment (`DeploymentNoise`): correlated
    queueing, diurnal load, error bursts and timeouts, numeric-tie divergence on 3 % of
    greedy pairs; 30 % of the pairs sampled at temperature 0.7 with a seed per arm (two
    independent draws of a lossless sampler: the quality gate's sampled-pair detectors
    see exactly exchangeable noise)."""
    model = realistic()
    return replace(
        model,
        name="deployment_bf16",
        deployment=DeploymentNoise(tie_margin_nats=GatesConfig().quality.tie_margin_nats),
        params=replace(model.params, seed_per_arm=True),
        sampled_share=0.3,
    )


def embedded_fit(rates: dict[str, float] | None = None) -> NoiseModel:
    arm = FakeEngineConfig(
        ttft_s=0.08, tpot_s=1 / 26.6, latency_sigma=0.2, tail_rate=0.01, tail_factor=3.0
    )
    speculative = arm.model_copy(
        update={
            "speculative": True,
            "num_draft_tokens": 8,
            "acceptance_sd": 0.15,
            "acceptance_rate_by_category": dict(rates or EMBEDDED_ACCEPTANCE_RATE),
        }
    )
    return NoiseModel("embedded_fit", arm, speculative, PairParams(max_tokens=96))


_PROMPTS: list[Prompt] = []


def default_prompts() -> list[Prompt]:
    if not _PROMPTS:
        _PROMPTS.extend(p for suite in load_default_suites() for p in suite.prompts)
    return _PROMPTS


class PairStream:
    """The daemon's pair loop in simulated time: seeded engines and sampler, pair i
    starting `first + i` spacings after T0."""

    def __init__(
        self,
        model: NoiseModel,
        seed: int,
        *,
        spacing_s: float = DESIGN_SPACING_S,
        first: int = 0,
        weights: dict[str, float] | None = None,
    ) -> None:
        self.runner = PairRunner(
            FakeEngine(model.baseline.model_copy(update={"seed": seed})),
            FakeEngine(model.speculative.model_copy(update={"seed": seed})),
            run_id=f"{model.name}-{seed}",
            params=model.params,
            seed=seed,
        )
        self.sampler = StratifiedSampler(default_prompts(), weights=weights, seed=seed)
        self.spacing = timedelta(seconds=spacing_s)
        self.index = first
        self.deployed = (
            _Deployed(model.deployment, seed + first) if model.deployment is not None else None
        )
        self.model = model
        self.sampled = random.Random(seed * 15_485_863 + first)

    def _run(self, prompt: Prompt) -> PairRecord:
        model = self.model
        if model.sampled_share and self.sampled.random() < model.sampled_share:
            own = OwnSampling(
                temperature=model.sampled_temperature,
                top_p=1.0,
                max_tokens=model.params.max_tokens or prompt.max_tokens,
            )
            return self.runner.run_group(prompt, sampling=own).records[0]
        return self.runner.run_pair(prompt)

    def take(self, n: int) -> list[PairRecord]:
        out = []
        for _ in range(n):
            record = self._run(self.sampler.next())
            record = replace(record, started_at=T0 + self.index * self.spacing)
            if self.deployed is not None:
                record = self.deployed.apply(record)
            out.append(record)
            self.index += 1
        return out


class FaultStream:
    """The pairs after a fault's onset, generated on demand up to `cap`."""

    def __init__(self, stream: PairStream, cap: int) -> None:
        self.stream = stream
        self.cap = cap
        self.records: list[PairRecord] = []

    def upto(self, n: int) -> list[PairRecord]:
        n = min(n, self.cap)
        if n > len(self.records):
            self.records.extend(self.stream.take(max(n - len(self.records), 200)))
            del self.records[self.cap :]
        return self.records[:n]


# --- reading the decisions --------------------------------------------------------------


def detector_readings(decisions: Sequence[GateDecision]) -> list[tuple[str, DetectorReading]]:
    """Every enforce check's sequential detector, as its decision carries it."""
    return [
        (check.name, check.detector)
        for check in checks(d for d in decisions if d.enforced)
        if check.detector is not None
    ]


def alarms(decisions: Sequence[GateDecision], margin: float = 1.0) -> list[str]:
    """The enforce checks that FAILed or whose CUSUM peak reached `margin` × h."""
    failed = [d.name for d in decisions if d.enforced and d.state is GateState.FAIL]
    peaked = [name for name, r in detector_readings(decisions) if r.peak >= margin * r.threshold]
    return sorted(set(failed) | set(peaked))


def _longest(config: GatesConfig) -> tuple[timedelta | None, int | None]:
    seconds, pairs = window_bounds(config)
    return (timedelta(seconds=seconds) if seconds is not None else None), pairs


def _window(
    records: Sequence[PairRecord], longest: tuple[timedelta | None, int | None]
) -> list[PairRecord]:
    """What the daemon's store query returns: the longest window's pairs up to the last."""
    span, limit = longest
    chosen = list(records[-limit:]) if limit is not None else list(records)
    if span is not None and chosen:
        oldest = chosen[-1].started_at - span
        chosen = [r for r in chosen if r.started_at > oldest]
    return chosen


def _may_pin(state: SwitchState) -> bool:
    """The daemon's rule: pin while speculation is on or after a non-drift rollback."""
    return state.mode is SwitchMode.AUTO or state.actor != "gate:drift"


def pin_missing(
    window: Sequence[PairRecord], references: dict[str, ReferenceStats], config: GatesConfig
) -> None:
    """Pin the categories with pairs but no reference, and grow the pins short of
    `pin_target_samples`, as the daemon's gate job does (`gates.grow_references`)."""
    if window:
        references.update(
            grow_references(window, references, config.drift, now=window[-1].started_at)
        )


def pins_settled(
    references: dict[str, ReferenceStats], categories: int, config: GatesConfig
) -> bool:
    """Every category pinned, every pin at its target: nothing left to pin or grow."""
    target = config.drift.pin_target_samples
    return len(references) >= categories and all(r.n >= target for r in references.values())


# --- healthy traffic --------------------------------------------------------------------


LATENCY_METRICS = ("e2e", "ttft", "tpot")
KEPT_PAIRS = 100_000  # per-pair figures kept from a healthy run (enough for every estimate)


def _latency(record: PairRecord) -> dict[str, tuple[float, float]]:
    """(baseline, speculative) per latency metric, for a pair where both arms succeeded."""
    b, s = record.baseline, record.speculative
    figures = {
        "e2e": (b.e2e_s, s.e2e_s),
        "ttft": (b.ttft_s, s.ttft_s),
        "tpot": (b.tpot_s, s.tpot_s),
    }
    return {
        m: (x, y) for m, (x, y) in figures.items() if x is not None and y is not None and x > 0 < y
    }


def discordant_break_even(alarm_factor: float) -> float:
    """The share of discordant tail pairs on the speculative side above which the latency
    gate's tail detector drifts up: where the Bernoulli(alarm_factor / (1 + alarm_factor))
    against Bernoulli(1/2) log-likelihood ratio has mean zero."""
    p1 = alarm_factor / (1.0 + alarm_factor)
    miss = math.log(0.5 / (1.0 - p1))
    return miss / (math.log(p1 / 0.5) + miss)


@dataclass
class HealthySample:
    """Per-pair figures kept from a healthy run: the oracles' pre-change distributions."""

    log_e2e_ratio: list[float] = field(default_factory=list)
    speedup_by_category: dict[str, list[float]] = field(default_factory=dict)
    acceptance_by_category: dict[str, list[float]] = field(default_factory=dict)
    latency: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    errors: list[int] = field(default_factory=lambda: [0, 0, 0])  # pairs, baseline, spec

    def add(self, record: PairRecord) -> None:
        self.errors[0] += 1
        self.errors[1] += not record.baseline.ok
        self.errors[2] += not record.speculative.ok
        if self.errors[0] > KEPT_PAIRS:
            return
        length = record.speculative.acceptance_length if record.speculative.ok else None
        if length is not None:
            self.acceptance_by_category.setdefault(record.prompt.category, []).append(length)
        speedup = record.speedup
        if speedup is not None:
            self.log_e2e_ratio.append(-math.log(speedup))
            self.speedup_by_category.setdefault(record.prompt.category, []).append(speedup)
            for metric, values in _latency(record).items():
                self.latency.setdefault(metric, []).append(values)

    def latency_tails(self, config: GatesConfig) -> dict[str, Any]:
        """Per metric: the speculative/baseline quantile ratio over the whole run, how
        often the speculative value exceeded max_ratio × the baseline quantile, and the
        speculative side's share of the tail detector's discordant pairs."""
        gate = config.latency
        out: dict[str, Any] = {}
        for q in gate.quantiles:
            for metric, pairs in sorted(self.latency.items()):
                base = np.asarray([b for b, _ in pairs])
                spec = np.asarray([s for _, s in pairs])
                limit = gate.max_ratio * float(np.quantile(base, q))
                scaled = gate.max_ratio * base
                level = float(np.quantile(np.concatenate([scaled, spec]), q))
                spec_side = int(np.sum((spec > level) & (scaled <= level)))
                discordant = spec_side + int(np.sum((scaled > level) & (spec <= level)))
                out[f"{metric}.p{q * 100:g}"] = {
                    "ratio": round(float(np.quantile(spec, q) / np.quantile(base, q)), 4),
                    "exceedance_rate": round(float(np.mean(spec > limit)), 5),
                    "speculative_discordant_share": round(spec_side / discordant, 4)
                    if discordant
                    else None,
                }
        out["break_even_discordant_share"] = round(discordant_break_even(gate.alarm_factor), 5)
        return out

    def summary(self, config: GatesConfig) -> dict[str, Any]:
        cv = {
            c: statistics.stdev(v) / statistics.fmean(v)
            for c, v in sorted(self.acceptance_by_category.items())
            if len(v) > 1
        }
        speedups = [s for v in self.speedup_by_category.values() for s in v]
        pairs, base, spec = self.errors
        return {
            "acceptance_length_mean": {
                c: round(statistics.fmean(v), 3)
                for c, v in sorted(self.acceptance_by_category.items())
            },
            "acceptance_cv_by_category": {c: round(x, 3) for c, x in cv.items()},
            "acceptance_cv_mean": round(statistics.fmean(cv.values()), 3) if cv else None,
            "median_speedup_by_category": {
                c: round(statistics.median(v), 3)
                for c, v in sorted(self.speedup_by_category.items())
            },
            "median_speedup": round(statistics.median(speedups), 3) if speedups else None,
            "slower_share": round(sum(s < 1.0 for s in speedups) / len(speedups), 4)
            if speedups
            else None,
            "error_rate": {"baseline": base / max(pairs, 1), "speculative": spec / max(pairs, 1)},
            "latency_tails": self.latency_tails(config) if self.latency else {},
            "figures_from_first_pairs": min(pairs, KEPT_PAIRS),
        }


def poisson_upper95(count: int) -> float:
    return float(chi2.ppf(0.95, 2 * count + 2) / 2.0)


def with_budget(config: GatesConfig, budget: float) -> GatesConfig:
    """`config` with only its false-alarm budget changed."""
    return config.model_copy(
        update={"budget": config.budget.model_copy(update={"false_rollbacks_per_30_days": budget})}
    )


class TripCounter:
    """The healthy section's trip rules under one configuration, fed the shared pair
    stream one chunk at a time: all gates every `every` pairs, a trip on a FAIL, a
    rollback or an enforce CUSUM peak at h, or on the liveness rule (evaluated by the
    caller: it does not depend on the budget); after a trip a human restores and the
    evidence restarts."""

    def __init__(self, config: GatesConfig, *, every: int, live: int, peaks: bool = True) -> None:
        self.config = config
        self.peaks = peaks  # False: the daemon's own rule, a trip only when the switch moves
        self.longest = _longest(config)
        self.every = every
        self.live = live
        self.references: dict[str, ReferenceStats] = {}
        self.state = SwitchState()
        self.history: list[Evaluation] = []
        self.trips: list[dict[str, Any]] = []
        self.evaluations = 0
        self.failed_evaluations = 0  # evaluations with an enforce gate at FAIL
        self.live_quiet = 0

    def observe(
        self, records: Sequence[PairRecord], done: int, liveness: GateDecision, categories: int
    ) -> None:
        """Judge the stream after its first `done` pairs (`records` ends with them)."""
        now = records[-1].started_at
        if not pins_settled(self.references, categories, self.config) and _may_pin(self.state):
            pin_missing(_window(records, self.longest), self.references, self.config)
        tripped_by: list[str] = []
        if liveness.enforced and liveness.state is GateState.FAIL and done > self.live_quiet:
            tripped_by = [liveness.name]
        if done % self.every == 0:
            decisions = evaluate_all(
                _window(records, self.longest),
                self.config,
                now=now,
                references=self.references,
                since=self.state.since,
            )
            self.evaluations += 1
            self.history.append(Evaluation(now, tuple(decisions)))
            self.state = step(self.state, self.history[-20:], self.config.policy, now=now).state
            if self.peaks:
                tripped_by = sorted({*tripped_by, *alarms(decisions)})
            self.failed_evaluations += any(
                d.enforced and d.state is GateState.FAIL for d in decisions
            )
            if self.state.mode is SwitchMode.ROLLED_BACK:
                tripped_by = sorted({*tripped_by, self.state.actor})
        if tripped_by:
            self.trips.append({"pair": done, "by": tripped_by})
            # A human restores; the evidence restarts at the restore.
            self.state = SwitchState(
                generation=self.state.generation + 1, since=now, reason="restored"
            )
            self.history = []
            self.live_quiet = done + self.live  # the liveness rule has no evidence restart

    def summary(self, done: int) -> dict[str, Any]:
        budget = self.config.budget
        scale = SECONDS_PER_30_DAYS / budget.design_pair_interval_s / max(done, 1)
        return {
            "simulated_pairs": done,
            "evaluations": self.evaluations,
            "evaluations_with_a_fail": self.failed_evaluations,
            "evaluate_every_pairs": self.every,
            "trips": len(self.trips),
            "trips_per_30_days": len(self.trips) * scale,
            "trips_per_30_days_upper95": poisson_upper95(len(self.trips)) * scale,
            "budget_per_30_days": budget.false_rollbacks_per_30_days,
        }


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
    """Healthy pairs through the production gates and policy; trips counted as above.
    The first `stress_pairs` pairs are also judged under each of `stress_budgets` (the
    time spent on them does not count against `budget_s`). The first `cadence_pairs`
    are also judged exactly as the daemon judges them: every gate every 6 pairs (60 s),
    a trip only when the switch rolls back (or the liveness rule fails) — `cadence`."""
    longest = _longest(config)
    sections = (config.error, config.latency, config.quality, config.speedup, config.drift)
    shortest = min(s.window_pairs for s in sections if s.window_pairs is not None)
    every = max(6, (shortest // 2) // 6 * 6)
    categories = len({p.category for p in default_prompts()})
    live = config.liveness.window_pairs or longest[1] or 10_000
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
        if len(records) > 2 * (longest[1] or 10_000):
            del records[: len(records) - (longest[1] or 10_000)]
        liveness = liveness_gate(records[-live:], config.liveness, now=records[-1].started_at)
        liveness_checks += 1
        counter.observe(records, done, liveness, categories)
        if done <= cadence_pairs:
            cadence_started = time.perf_counter()
            cadence.observe(records, done, liveness, categories)
            cadence_s += time.perf_counter() - cadence_started
        if done <= stress_pairs:
            stress_started = time.perf_counter()
            for stressed_counter in stress.values():
                stressed_counter.observe(records, done, liveness, categories)
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


# --- faults ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    name: str
    metric: str  # what the Kayenta judge and the oracle watch
    update: dict[str, Any]
    base: str = "realistic"  # the noise model the fault is injected into


def faults(drift_rate: float) -> list[Fault]:
    return [
        Fault(
            "drift_30pct_one_category",
            "acceptance",
            {"acceptance_rate_by_category": {DRIFT_CATEGORY: drift_rate}},
        ),
        Fault("latency_x1.5", "e2e", {"latency_factor": 1.5}),
        Fault("errors_5pct", "error", {"error_rate": 0.05}),
        Fault("corruption_3pct", "mismatch", {"corrupt_rate": 0.03}),
        Fault("mismatch_80pct", "mismatch", {"corrupt_rate": 0.8}),
        # A real verify bug on a bf16 deployment whose greedy pairs already diverge on
        # numeric ties (3 %): 30 % real divergences on top of them.
        Fault("greedy_verify_bf16", "mismatch", {"corrupt_rate": 0.3}, base="deployment_bf16"),
    ]


def category_acceptance(model: NoiseModel, category: str, n: int, seed: int) -> list[float]:
    """Acceptance lengths of `n` pairs of one category (real pair runner)."""
    only = {c: float(c == category) for c in {p.category for p in default_prompts()}}
    stream = PairStream(model, seed, weights=only)
    return [
        length
        for r in stream.take(n)
        if r.speculative.ok and (length := r.speculative.acceptance_length) is not None
    ]


def drift_rate_for(model: NoiseModel, category: str, drop: float, seed: int) -> float:
    """The category's acceptance rate at which its mean acceptance length falls by
    `drop`, by bisection on the fake (common random numbers keep it monotone)."""

    def mean_length(rate: float) -> float:
        faulty = model.with_speculative(acceptance_rate_by_category={category: rate})
        return statistics.fmean(category_acceptance(faulty, category, 240, seed))

    target = (1.0 - drop) * statistics.fmean(category_acceptance(model, category, 240, seed))
    low, high = 0.0, model.speculative.acceptance_rate
    for _ in range(9):
        middle = (low + high) / 2
        low, high = (middle, high) if mean_length(middle) < target else (low, middle)
    return round((low + high) / 2, 4)


def canaryd_pairs_to_trip(
    prefix: Sequence[PairRecord],
    stream: FaultStream,
    config: GatesConfig,
    references: dict[str, ReferenceStats],
    *,
    screen: int,
    every: int = 6,
) -> tuple[int | None, str | None, int, int | None]:
    """(pairs from the onset to the trip, the tripping gate, evaluations run, the first
    screened evaluation at which an undecided enforce detector was past the schedule's
    `speed_up_at`: where the daemon's adaptive pace would have sped pairs up — a
    screened point, so never earlier than the daemon would)."""
    longest = _longest(config)
    screen = max(every, screen // every * every)
    state = SwitchState()
    history: list[Evaluation] = []
    evaluations = 0

    def evaluate(n: int) -> Evaluation:
        nonlocal evaluations
        window = _window([*prefix[-(longest[1] or len(prefix)) :], *stream.upto(n)], longest)
        now = window[-1].started_at
        evaluations += 1
        decisions = evaluate_all(window, config, now=now, references=references, since=state.since)
        return Evaluation(now, tuple(decisions))

    live = config.liveness.window_pairs or longest[1] or 10_000

    def live_failed(n: int) -> bool:
        window = [*prefix[-live:], *stream.upto(n)[-live:]][-live:]
        decision = liveness_gate(window, config.liveness, now=window[-1].started_at)
        return decision.enforced and decision.state is GateState.FAIL

    speed_up_at = ScheduleConfig().speed_up_at
    faster: int | None = None
    end = screen
    while end <= stream.cap:
        screened = evaluate(end)
        if faster is None and suspicion(screened.decisions) >= speed_up_at:
            faster = end
        points = range(end - screen + every, end + 1, every)
        hot = bool(alarms(screened.decisions, SCREEN_MARGIN)) or any(live_failed(n) for n in points)
        for n in points if hot else [end]:
            evaluation = screened if n == end else evaluate(n)
            history.append(evaluation)
            state = step(state, history[-20:], config.policy, now=evaluation.at).state
            if state.mode is SwitchMode.ROLLED_BACK:
                return n, state.actor.removeprefix("gate:"), evaluations, faster
        end += screen
    return None, None, evaluations, faster


def _metric_values(
    fault: Fault, records: Sequence[PairRecord], *, ties: bool = True
) -> tuple[list[float], list[float]]:
    """(speculative, comparison) values of the fault's metric over `records`; for
    acceptance and e2e the comparison is the speculative arm's healthy reference, filled
    in by the caller (the arms differ by design: speculation is faster). With `ties`
    False a greedy mismatch is a real divergence only (the quality gate's tie rule)."""
    if fault.metric == "acceptance":
        values = [
            length
            for r in records
            if r.prompt.category == DRIFT_CATEGORY
            and r.speculative.ok
            and (length := r.speculative.acceptance_length) is not None
        ]
        return values, []
    if fault.metric == "e2e":
        return [r.speculative.e2e_s for r in records if r.speculative.ok], []
    if fault.metric == "error":
        return (
            [float(not r.speculative.ok) for r in records],
            [float(not r.baseline.ok) for r in records],
        )
    greedy = [r for r in records if r.scores is not None and r.temperature <= 0.0]
    if not ties:
        return [float(_real_divergence(r)) for r in greedy], [0.0] * len(greedy)
    return [float(not r.scores.exact_match) for r in greedy if r.scores], [0.0] * len(greedy)


def _real_divergence(record: PairRecord) -> bool:
    """A greedy divergence that is not a numeric tie (the quality gate's own rule)."""
    scores = record.scores
    margin = GatesConfig().quality.tie_margin_nats
    return scores is not None and not scores.exact_match and not scores.tie(margin)


def kayenta_phase(seed: int, width: int) -> int:
    """Where the fault falls in the judge's first window: the judge runs on its own clock
    and cannot know when a fault will start, so the onset is uniform within a window."""
    return random.Random(seed * 7_919 + width).randrange(width)


def kayenta_pairs(
    fault: Fault,
    prefix: Sequence[PairRecord],
    stream: FaultStream,
    reference: list[float],
    width: int,
    alpha: float,
    phase: int,
    tolerance: Callable[[list[float], list[float]], bool] | None = None,
    edge: Callable[[list[float], list[float]], float] | None = None,
) -> int | None:
    """End of the first fixed window of `width` pairs whose Mann–Whitney U test rejects at
    `alpha`, in pairs from the onset (None: not within the cap). The windows tile the run
    with the onset `phase` pairs into the first one, which holds healthy pairs before it.
    With `tolerance` (Kayenta's allowedIncrease / allowedDecrease on the effect size), a
    window counts only when the effect is also past the tolerance. With `edge` (a
    one-sided p-value against the edge of the tolerance, `kayenta_edge_test`), that test
    replaces both, and greedy mismatches count real divergences only."""
    before = list(prefix[len(prefix) - phase :]) if phase else []
    for end in range(width, stream.cap + phase + 1, width):
        window = [*before, *stream.upto(end - phase)][end - width : end]
        canary, comparison = _metric_values(fault, window, ties=edge is None)
        comparison = comparison or reference
        if not canary or not comparison:
            continue
        if edge is not None:
            if edge(canary, comparison) < alpha:
                return end - phase
            continue
        if len(set(canary) | set(comparison)) == 1:
            continue  # identical samples: nothing to reject
        p = float(mannwhitneyu(canary, comparison, alternative="two-sided").pvalue)
        if p < alpha and (tolerance is None or tolerance(canary, comparison)):
            return end - phase
    return None


def kayenta_tolerance(
    fault: Fault, config: GatesConfig
) -> Callable[[list[float], list[float]], bool]:
    """The effect a tolerant Kayenta-style judge needs besides significance, at canaryd's
    own tolerance (Kayenta's MannWhitneyClassifier: the mean ratio past allowedIncrease
    / allowedDecrease): acceptance below 1 − `max_relative_drop` of its healthy mean; e2e
    above 1 + `max_regression` of it; a speculative error rate above the baseline's plus
    `max_excess_rate`; a mismatch rate above `max_mismatch_rate`."""

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else 0.0

    if fault.metric == "acceptance":
        keep = 1.0 - config.drift.max_relative_drop
        return lambda canary, comparison: mean(canary) < keep * mean(comparison)
    if fault.metric == "e2e":
        allowed = 1.0 + config.latency.max_regression
        return lambda canary, comparison: mean(canary) > allowed * mean(comparison)
    if fault.metric == "error":
        excess = config.error.max_excess_rate
        return lambda canary, comparison: mean(canary) > mean(comparison) + excess
    limit = config.quality.max_mismatch_rate
    return lambda canary, comparison: mean(canary) > limit


def excess_score_pvalue(failed: int, n: int, base_failed: int, base_n: int, excess: float) -> float:
    """One-sided p-value of H0: p − p_base ≤ `excess` for two binomial samples, the
    Farrington–Manning score test: the variance at the rates that maximise the likelihood
    under p = p_base + excess (found numerically), a normal tail."""
    if not n or not base_n:
        return 1.0
    rate, base = failed / n, base_failed / base_n

    def negative_log_likelihood(p_base: float) -> float:
        p = p_base + excess
        return -(
            xlogy(failed, p)
            + xlogy(n - failed, 1.0 - p)
            + xlogy(base_failed, p_base)
            + xlogy(base_n - base_failed, 1.0 - p_base)
        )

    tiny = 1e-12
    restricted = minimize_scalar(
        negative_log_likelihood, bounds=(tiny, 1.0 - excess - tiny), method="bounded"
    ).x
    p = restricted + excess
    variance = p * (1.0 - p) / n + restricted * (1.0 - restricted) / base_n
    if variance <= 0.0:
        return 1.0
    return float(ndtr(-(rate - base - excess) / math.sqrt(variance)))


def kayenta_edge_test(
    fault: Fault, config: GatesConfig
) -> Callable[[list[float], list[float]], float]:
    """A Kayenta-style judge calibrated where canaryd's detectors are: at the edge of the
    tolerance. Kayenta's classifier needs a significant Mann–Whitney test *and* an
    effect past allowedIncrease / allowedDecrease; with alpha set for a healthy arm, an
    arm sitting exactly at the tolerance passes both in about half the windows once they
    are long enough to be significant, far above the false-alarm budget that canaryd keeps
    at the edge. Here the null hypothesis is the edge itself, one-sided, so `alpha` is
    the false-alarm rate of an arm at the tolerance, as canaryd's is:
    - acceptance: the category's lengths scaled up by 1 / (1 − `max_relative_drop`)
      against the healthy reference, Mann–Whitney "less";
    - e2e: the speculative e2e scaled down by 1 + `max_regression` against its healthy
      prefix, Mann–Whitney "greater";
    - errors: the Farrington–Manning score test of the speculative error rate against
      the baseline's plus `max_excess_rate` (`excess_score_pvalue`);
    - mismatches: an exact binomial test of real divergences (ties excluded, the quality
      gate's rule) against `max_mismatch_rate`."""

    def scaled(factor: float, alternative: str) -> Callable[[list[float], list[float]], float]:
        def test(canary: list[float], comparison: list[float]) -> float:
            shifted = [value * factor for value in canary]
            if len(set(shifted) | set(comparison)) == 1:
                return 1.0
            return float(mannwhitneyu(shifted, comparison, alternative=alternative).pvalue)

        return test

    if fault.metric == "acceptance":
        return scaled(1.0 / (1.0 - config.drift.max_relative_drop), "less")
    if fault.metric == "e2e":
        return scaled(1.0 / (1.0 + config.latency.max_regression), "greater")
    if fault.metric == "error":
        excess = config.error.max_excess_rate

        def errors(canary: list[float], comparison: list[float]) -> float:
            return excess_score_pvalue(
                int(sum(canary)), len(canary), int(sum(comparison)), len(comparison), excess
            )

        return errors
    limit = config.quality.max_mismatch_rate

    def mismatches(canary: list[float], comparison: list[float]) -> float:
        del comparison
        return float(binomtest(int(sum(canary)), len(canary), limit, "greater").pvalue)

    return mismatches


@dataclass(frozen=True)
class Oracle:
    """Per-pair log-likelihood ratios of the known post-change against the known
    pre-change distribution of the fault's statistic."""

    increment: Callable[[PairRecord], float]
    description: str


def oracle_for(fault: Fault, healthy: HealthySample, drift_after: list[float]) -> Oracle:
    noise = realistic()
    if fault.metric == "error":
        p0, p1 = noise.speculative.error_rate, float(fault.update["error_rate"])
        hit, miss = bernoulli_llr(p0, p1)
        return Oracle(
            lambda r: hit if not r.speculative.ok else miss,
            f"Bernoulli speculative error {p0:g} -> {p1:g}",
        )
    if fault.metric == "mismatch":
        p1 = float(fault.update["corrupt_rate"])
        miss = math.log(1.0 - p1)
        return Oracle(
            lambda r: 0.0 if r.scores is None else (math.inf if _real_divergence(r) else miss),
            f"greedy mismatch 0 -> {p1:g}: exact likelihood ratio (a mismatch is impossible "
            "before the change, so the first one alarms; each match adds log(1 - p1))",
        )
    if fault.metric == "e2e":
        shift = math.log(float(fault.update["latency_factor"]))
        data = np.asarray(healthy.log_e2e_ratio[:20_000])
        kde = gaussian_kde(data)
        grid = np.linspace(data.min() - 1.0, data.max() + 1.0 + shift, 4096)
        log_density = np.log(np.maximum(kde(grid), 1e-12))

        def log_f0(x: float) -> float:
            return float(np.interp(x, grid, log_density))

        return Oracle(
            lambda r: (
                0.0
                if r.speedup is None
                else log_f0(-math.log(r.speedup) - shift) - log_f0(-math.log(r.speedup))
            ),
            "log(speculative e2e / baseline e2e): healthy density by Gaussian KDE, the fault "
            f"shifts it by log {fault.update['latency_factor']} exactly",
        )
    before = healthy.acceptance_by_category[DRIFT_CATEGORY]
    mu0, sd0 = statistics.fmean(before), statistics.stdev(before)
    mu1, sd1 = statistics.fmean(drift_after), statistics.stdev(drift_after)

    def gaussian(r: PairRecord) -> float:
        length = r.speculative.acceptance_length if r.speculative.ok else None
        if r.prompt.category != DRIFT_CATEGORY or length is None:
            return 0.0
        z0, z1 = (length - mu0) / sd0, (length - mu1) / sd1
        return math.log(sd0 / sd1) + (z0 * z0 - z1 * z1) / 2.0

    return Oracle(
        gaussian,
        f"{DRIFT_CATEGORY} acceptance length N({mu0:.3f}, {sd0:.3f}^2) -> "
        f"N({mu1:.3f}, {sd1:.3f}^2) (moments of large healthy and faulty samples)",
    )


def edge_oracle_for(fault: Fault, healthy: HealthySample, config: GatesConfig) -> Oracle | None:
    """The oracle for a gate with a tolerance: the known fault against the least favourable
    in-control state such a gate must not roll back — the edge of its tolerance (errors at
    `max_error_rate`, mismatches at `max_mismatch_rate`, a typical e2e ratio of exactly
    `max_ratio`). No detector that respects the tolerance can beat it; drift judges a
    change from its own healthy reference, so its oracle is the plain one (None here)."""
    if fault.metric == "error":
        p0, p1 = config.error.max_error_rate, float(fault.update["error_rate"])
        hit, miss = bernoulli_llr(p0, p1)
        return Oracle(
            lambda r: hit if not r.speculative.ok else miss,
            f"Bernoulli speculative error {p0:g} (the ceiling) -> {p1:g}",
        )
    if fault.metric == "mismatch":
        p0, p1 = config.quality.max_mismatch_rate, float(fault.update["corrupt_rate"])
        hit, miss = bernoulli_llr(p0, p1)
        return Oracle(
            lambda r: (
                0.0
                if r.scores is None or r.temperature > 0.0
                else (hit if _real_divergence(r) else miss)
            ),
            f"Bernoulli greedy mismatch {p0:g} (the tolerance) -> {p1:g}",
        )
    if fault.metric == "e2e":
        fault_shift = math.log(float(fault.update["latency_factor"]))
        candidates = []
        for metric, pairs in sorted(healthy.latency.items()):
            data = np.log(np.asarray([s / b for b, s in pairs[:20_000]]))
            edge_shift = math.log(config.latency.max_ratio) - float(np.median(data))
            if edge_shift < fault_shift:  # the fault takes this metric past the tolerance
                candidates.append((metric, data, edge_shift))
        if not candidates:
            return None
        # The metric whose fault lies furthest past its edge, in units of its spread.
        metric, data, edge_shift = max(
            candidates, key=lambda c: (fault_shift - c[2]) / float(np.std(c[1]))
        )
        kde = gaussian_kde(data)
        grid = np.linspace(data.min() - 1.0, data.max() + 1.0 + fault_shift, 4096)
        log_density = np.log(np.maximum(kde(grid), 1e-12))

        def log_f(x: float) -> float:
            return float(np.interp(x, grid, log_density))

        def increment(r: PairRecord) -> float:
            values = _latency(r).get(metric) if r.complete else None
            if values is None:
                return 0.0
            x = math.log(values[1] / values[0])
            return log_f(x - fault_shift) - log_f(x - edge_shift)

        return Oracle(
            increment,
            f"log {metric} ratio (the metric the fault takes furthest past the tolerance): "
            f"the healthy density shifted to a median ratio of {config.latency.max_ratio:g} "
            f"-> shifted by log {fault.update['latency_factor']}",
        )
    return None


def oracle_pairs(oracle: Oracle, stream: FaultStream, h: float) -> int | None:
    increments: list[float] = []
    step_size = 200
    for end in range(step_size, stream.cap + step_size, step_size):
        records = stream.upto(end)
        increments.extend(oracle.increment(r) for r in records[len(increments) :])
        alarm = llr_cusum(increments, h).alarm_index
        if alarm is not None:
            return alarm + 1
        if len(records) >= stream.cap:
            break
    return None


def _median(values: Sequence[int | float | None]) -> float | None:
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
            "evaluations": 0,
        }
        | {f"kayenta_w{w}": [] for w in KAYENTA_WINDOWS}
        | {f"kayenta_tolerant_w{w}": [] for w in KAYENTA_WINDOWS}
        | {f"kayenta_edge_w{w}": [] for w in KAYENTA_WINDOWS}
        for f in chosen
    }
    bases = {"realistic": model, "deployment_bf16": deployment_bf16()}
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
                PairStream(base.with_speculative(**fault.update), seed + 7919, first=prefix_pairs),
                cap,
            )
            started = time.perf_counter()
            pairs, gate, evaluations, faster = canaryd_pairs_to_trip(
                prefix, stream, config, references, screen=screen
            )
            row = results[fault.name]
            row["canaryd"].append(pairs)
            row["minutes"].append(minutes_on_schedule(pairs, faster))
            row["tripped_by"].append(gate)
            row["evaluations"] += evaluations
            # acceptance and e2e are judged against the speculative arm's healthy prefix
            reference = _metric_values(fault, prefix)[0] if fault.metric in SELF_REFERENCED else []
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
                f"  fault {fault.name} seed {seed}: canaryd {pairs} ({gate}), oracle "
                f"{row['oracle'][-1]}, {len(stream.records)} pairs, {evaluations} "
                f"evaluations, {time.perf_counter() - started:.1f}s"
            )
    out: dict[str, Any] = {}
    for fault in chosen:
        row = results[fault.name]
        kayenta = {w: _median(row[f"kayenta_w{w}"]) for w in KAYENTA_WINDOWS}
        finite = {w: m for w, m in kayenta.items() if m is not None}
        best = min(finite, key=lambda w: finite[w]) if finite else None
        gates_tripped = sorted({g for g in row["tripped_by"] if g is not None})
        tolerant, tolerant_best = _best_window(row, "kayenta_tolerant")
        at_edge, edge_best = _best_window(row, "kayenta_edge")
        ci, coverage = median_ci95(row["canaryd"])
        edge = _median(row["edge_oracle"]) if row["edge_oracle"] else None
        entry: dict[str, Any] = {
            "canaryd_pairs_median": _median(row["canaryd"]),
            "canaryd_pairs_ci95": ci,
            "canaryd_pairs_ci_coverage": coverage,
            # The fair comparison (issue #23): the same tolerance, and its false-alarm
            # rate set at the tolerance's edge as canaryd's detectors' are.
            "kayenta_tolerant_pairs_median": at_edge,
            "kayenta_tolerant_best_window": edge_best,
            "kayenta_tolerant_calibration": "at the edge of the tolerance (kayenta_edge_test)",
            "kayenta_tolerant_by_window": {
                str(w): _median(row[f"kayenta_edge_w{w}"]) for w in KAYENTA_WINDOWS
            },
            # Kayenta's own rule (significance at a healthy arm's alpha and the effect past
            # the tolerance): its false-alarm rate at the edge is far above the budget.
            "kayenta_tolerant_healthy_alpha_pairs_median": tolerant,
            "kayenta_tolerant_healthy_alpha_best_window": tolerant_best,
            "oracle_at_tolerance_pairs": edge,
            "canaryd_minutes_default_schedule": _median(row["minutes"]),
            "canaryd_minutes_by_seed": row["minutes"],
            "kayenta_pairs_median": finite.get(best) if best is not None else None,
            "kayenta_best_window": best,
            "kayenta_alpha": best / arl0 if best is not None else None,
            "kayenta_by_window": {str(w): m for w, m in kayenta.items()},
            "optimal_pairs": _median(row["oracle"]),
            "seeds": list(seeds),
            "canaryd_pairs": row["canaryd"],
            "kayenta_pairs": row[f"kayenta_w{best}"] if best is not None else None,
            "optimal_pairs_by_seed": row["oracle"],
            "optimal_within_tolerance_pairs": (
                _median(row["edge_oracle"]) if row["edge_oracle"] else None
            ),
            "optimal_within_tolerance_by_seed": row["edge_oracle"] or None,
            "optimal_within_tolerance_statistic": row.get("edge_oracle_statistic"),
            "tripped_by": gates_tripped[0] if len(gates_tripped) == 1 else gates_tripped or None,
            "tripped_by_seed": row["tripped_by"],
            "censored_at": cap,
            "evaluations": row["evaluations"],
            "oracle_statistic": row["oracle_statistic"],
            "fault": fault.update,
        }
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
    medians = {w: _median(row[f"{judge}_w{w}"]) for w in KAYENTA_WINDOWS}
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


def minutes_on_schedule(pairs: int | None, faster: int | None) -> float | None:
    """Wall-clock minutes for `pairs` on the shipped schedule (`ScheduleConfig()`): one
    pair every `pair_interval_s` until the adaptive pace sped up (pair `faster`), then
    `max_pairs_per_minute`. None when the run did not trip within the cap."""
    if pairs is None:
        return None
    schedule = ScheduleConfig()
    slow = schedule.pair_interval_s
    rate = schedule.max_pairs_per_minute
    fast = min(60.0 / rate, slow) if rate else slow
    before = pairs if faster is None else min(pairs, faster)
    return round((before * slow + (pairs - before) * fast) / 60.0, 1)


# --- the default schedule -------------------------------------------------------------


def default_schedule(
    model: NoiseModel, *, seed: int, config: GatesConfig, cap_hours: float
) -> dict[str, Any]:
    """Hours from an empty store to the first evaluation with every enforce gate PASS."""
    schedule = ScheduleConfig()
    spacing = schedule.pair_interval_s
    per_gate = max(1, round(schedule.gate_interval_s / spacing))
    longest = _longest(config)
    stream = PairStream(model, seed, spacing_s=spacing)
    records: list[PairRecord] = []
    references: dict[str, ReferenceStats] = {}
    state = SwitchState()
    history: list[Evaluation] = []
    trips: list[str] = []
    last: tuple[GateDecision, ...] = ()
    first_pass: dict[str, float] = {}
    passes: dict[str, int] = {}
    since_first: dict[str, int] = {}
    evaluations = 0
    total = int(cap_hours * 3600 / spacing)
    while len(records) < total:
        records.extend(stream.take(per_gate))
        window = _window(records, longest)
        now = window[-1].started_at
        if _may_pin(state):
            pin_missing(window, references, config)
        decisions = evaluate_all(window, config, now=now, references=references, since=state.since)
        evaluations += 1
        history.append(Evaluation(now, tuple(decisions)))
        outcome = step(state, history[-20:], config.policy, now=now)
        if outcome.state.mode is not state.mode:
            trips.append(f"{outcome.state.actor} at {len(records)} pairs")
        state = outcome.state
        last = tuple(decisions)
        hours = round(len(records) * spacing / 3600, 3)
        for decision in decisions:
            if decision.enforced and decision.state is GateState.PASS:
                first_pass.setdefault(decision.name, hours)
                passes[decision.name] = passes.get(decision.name, 0) + 1
            if decision.name in first_pass:
                since_first[decision.name] = since_first.get(decision.name, 0) + 1
        if all_enforced_pass(decisions):
            break
    passed = all_enforced_pass(last)
    return {
        "hours_to_all_pass": round(len(records) * spacing / 3600, 3) if passed else None,
        "pairs": len(records),
        "evaluations": evaluations,
        "pair_interval_s": spacing,
        "cap_hours": cap_hours,
        "model": model.name,
        "first_pass_hours_by_gate": first_pass,
        "pass_share_since_first_pass": {
            name: round(passes[name] / since_first[name], 3) for name in first_pass
        },
        "trips": trips,
        "not_passing_at_end": {
            d.name: d.state.value for d in last if d.enforced and d.state is not GateState.PASS
        },
    }


# --- the embedded fit -------------------------------------------------------------------


def category_speedup(model: NoiseModel, category: str, rate: float, n: int, seed: int) -> float:
    """The fake's median speedup on `n` requests of one category at acceptance `rate`."""
    prompts = [p for p in default_prompts() if p.category == category]
    baseline = FakeEngine(model.baseline.model_copy(update={"seed": seed}))
    speculative = FakeEngine(
        model.speculative.model_copy(
            update={"seed": seed, "acceptance_rate_by_category": {category: rate}}
        )
    )
    speedups = []
    for i in range(n):
        prompt = prompts[i % len(prompts)]
        request = GenerationRequest(
            messages=prompt.messages,
            sampling=SamplingParams(max_tokens=model.params.max_tokens or prompt.max_tokens),
            category=category,
        )
        b, s = baseline.generate(request), speculative.generate(request)
        if b.ok and s.ok:
            speedups.append(b.e2e_s / s.e2e_s)
    return statistics.median(speedups)


def fit_embedded(seed: int = 0, n: int = 720) -> dict[str, float]:
    """Per category, the acceptance rate at which the fake's median speedup is the
    embedded model's (bisection; common random numbers keep it monotone)."""
    model = embedded_fit()
    rates = {}
    for category, target in sorted(EMBEDDED_SPEEDUP.items()):
        low, high = 0.0, 0.99
        for _ in range(14):
            middle = (low + high) / 2
            faster = category_speedup(model, category, middle, n, seed) >= target
            low, high = (low, middle) if faster else (middle, high)
        rates[category] = round((low + high) / 2, 4)
    return rates


# --- the command ------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def stress_table(stress: dict[str, Any]) -> list[str]:
    lines = [
        "budget stress (the same healthy pairs and production gates at inflated budgets; "
        "trips per 30 days, breaches = trips only on checks past the tolerance):"
    ]
    lines.append(
        f"  {'model':<14}{'budget':>8}{'h':>7}{'pairs':>8}{'evals':>7}{'trips':>7}"
        f"{'breach':>8}{'/30d':>8}{'up95':>8}{'obs/B':>9}{'up95/B':>9}{'false/B':>9}"
        f"  obs<=B (all/false)"
    )
    for name, rows in stress.items():
        for key, row in rows.items():
            if not isinstance(row, dict) or "trips" not in row:
                continue
            budget = row["budget_per_30_days"]
            within = "/".join(
                "yes" if rate <= budget else "NO"
                for rate in (row["trips_per_30_days"], row["false_trips_per_30_days"])
            )
            lines.append(
                f"  {name:<14}{key:>8}{row['h']:>7.2f}{row['simulated_pairs']:>8}"
                f"{row['evaluations']:>7}{row['trips']:>7}{row['trips_beyond_tolerance']:>8}"
                f"{_fmt(row['trips_per_30_days']):>8}{_fmt(row['trips_per_30_days_upper95']):>8}"
                f"{row['observed_over_budget']:>9.3g}{row['upper95_over_budget']:>9.3g}"
                f"{row['false_over_budget']:>9.3g}  {within}"
                f"{' (saturated)' if row['saturated'] else ''}"
            )
    for name, rows in stress.items():
        extrapolation = rows.get("extrapolation")
        if not extrapolation:
            continue
        lines.append(f"  EXTRAPOLATION, not a measurement ({name}, rate proportional to budget):")
        for kind, label in (("false_trips", "false trips"), ("all_trips", "all trips")):
            x = extrapolation[kind]
            if x["from_budget"] is None:
                lines.append(f"    {label:<12} every budget saturated: nothing to extrapolate")
                continue
            expected = x["expected_per_30_days"]
            point = (
                f"obs/B {x['observed_over_budget']:.3g} x {x['to_budget']:g} = {expected:.3g}"
                if expected is not None
                else "no trip"
            )
            lines.append(
                f"    {label:<12} from budget {x['from_budget']:g}: {point}; 95 % bound "
                f"{x['expected_per_30_days_upper95']:.3g} per 30 days at budget {x['to_budget']:g}"
            )
        if beyond := extrapolation["beyond_tolerance_checks"]:
            lines.append(f"    past the tolerance in this model: {', '.join(beyond)}")
    return lines


# --- drift pins -------------------------------------------------------------------------


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
) -> tuple[np.ndarray, ...]:
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
    """The two charts' Gaussian log-LR increments (gates.sequential.gaussian_llr), per row."""
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
    """The false drift FAILs that the pins themselves cause (issue #23 part 2).

    Per category, `pins` independent pins of healthy traffic (values drawn with
    replacement from the category's healthy acceptance lengths in `sample`), each
    followed for 30 days of the category's pairs at the design rate (all categories
    equally frequent). A pin is taken after `pin_min_samples` pairs and grows with every
    pair until `pin_target_samples` (the daemon grows it at every 60 s gate run, about
    every 0.7 category pairs: each pair is an evaluation here); while it grows, the check
    is recomputed from the first pair against the current pin, as the gate does; once it
    is frozen, one CUSUM runs over the whole 30 days from the first pair (never fewer
    alarms than the gate's 2,000-pair window: a later start can only lower a CUSUM), and
    restarts after each alarm. The charts are the gate's own (`gates.drift.chart_parameters`:
    the bank's threshold and the pin margin for the category's share of the budget).
    `before` is the same draw judged as before the margin: a pin frozen at
    `pin_min_samples` pairs whose mean is taken as exact."""
    from gates.budget import detector_budget
    from gates.drift import chart_parameters, pin_alpha

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


def table(result: dict[str, Any]) -> str:
    lines = ["healthy traffic (trips of the switch):"]
    lines.append(
        f"  {'model':<14}{'pairs':>10}{'evals':>8}{'trips':>7}{'/30d':>9}{'/30d up95':>11}"
        f"  {'at 60 s: pairs':>14}{'evals':>7}{'trips':>7}"
    )
    for name, row in result["healthy"].items():
        cadence = row.get("cadence") or {}
        lines.append(
            f"  {name:<14}{row['simulated_pairs']:>10}{row['evaluations']:>8}{row['trips']:>7}"
            f"{_fmt(row['trips_per_30_days']):>9}{_fmt(row['trips_per_30_days_upper95']):>11}"
            f"  {_fmt(cadence.get('simulated_pairs')):>14}{_fmt(cadence.get('evaluations')):>7}"
            f"{_fmt(cadence.get('trips')):>7}"
        )
    if result.get("budget_stress"):
        lines.extend(stress_table(result["budget_stress"]))
    lines.append("faults (median pairs from the onset to detection):")
    lines.append(
        f"  {'fault':<26}{'canaryd':>9}{'kayenta':>9}{'(W)':>6}{'at edge':>9}{'(W)':>6}"
        f"{'oracle':>8}{'at tol.':>9}  tripped by"
    )
    for name, row in result["faults"].items():
        lines.append(
            f"  {name:<26}{_fmt(row['canaryd_pairs_median']):>9}"
            f"{_fmt(row['kayenta_pairs_median']):>9}{_fmt(row['kayenta_best_window']):>6}"
            f"{_fmt(row['kayenta_tolerant_pairs_median']):>9}"
            f"{_fmt(row['kayenta_tolerant_best_window']):>6}"
            f"{_fmt(row['optimal_pairs']):>8}{_fmt(row['optimal_within_tolerance_pairs']):>9}"
            f"  {row['tripped_by']}"
        )
    pins = result["drift_pins"]
    lines.append(
        f"drift pins: {pins['pins']} drawn, {pins['pins_with_a_false_fail']} with a false FAIL "
        f"in 30 days; {_fmt(pins['false_fail_per_category_30d'])} per category "
        f"(95 % bound {pins['false_fail_per_category_30d_upper95']:.2g}) vs its budget share "
        f"{pins['budget_share_per_category_30d']:.2g}; before (a 30-pair pin taken as exact): "
        f"{pins['before']['pins_with_a_false_fail']} pins"
    )
    schedule = result["default_schedule"]
    hours = ", ".join(
        f"{name} {_fmt(row['hours_to_all_pass'])}"
        for name, row in schedule.items()
        if isinstance(row, dict)
    )
    lines.append(f"default schedule: hours to every enforce gate PASS: {hours}")
    config = result["config"]
    lines.append(
        f"budget {config['budget']['false_rollbacks_per_30_days']:g}/30 days, "
        f"{config['detectors']} detectors, ARL0 {config['detector_arl0']:.4g} pairs, "
        f"h {config['h']:.3f}; elapsed {result['elapsed_s']:.0f}s"
    )
    return "\n".join(lines)


def _stderr(message: str) -> None:
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
        log: Callable[[str], None] = _stderr,
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
    for model in (realistic(), embedded_fit(), deployment_bf16()):
        # the deployment model is judged at the production budget only: its question is
        # whether ties, bursts and correlated queueing trip anything at all
        stressed = stress_budgets if model.deployment is None else ()
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="20k healthy pairs (also stressed), 3 seeds"
    )
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--healthy-minutes",
        type=float,
        default=None,
        help=f"full run: minutes of healthy simulation per model (default {FULL_HEALTHY_MINUTES})",
    )
    parser.add_argument(
        "--fault-seeds",
        type=int,
        default=None,
        help="seeds per fault (default 3 with --quick, else 30: a 95 %% interval on each "
        "median needs at least 6)",
    )
    parser.add_argument(
        "--cadence-pairs",
        type=int,
        default=None,
        help="healthy pairs per model also judged at the daemon's 60 s cadence "
        f"(default {QUICK_CADENCE_PAIRS} with --quick, else {FULL_CADENCE_PAIRS})",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="2: the fault runs, drift pins and default schedule in a second process beside "
        "the healthy section (the same figures, about half the wall time on 2 cores); 1: one "
        "process",
    )
    parser.add_argument(
        "--stress-pairs",
        type=int,
        default=None,
        help=f"healthy pairs per model also judged under the stress budgets (default all of "
        f"them with --quick, else {FULL_STRESS_PAIRS})",
    )
    parser.add_argument("--refit", action="store_true", help="refit the embedded model, print")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.refit:
        rates = fit_embedded(args.seed)
        print(json.dumps(rates, indent=2))
        return
    result = run(
        quick=args.quick,
        seed=args.seed,
        healthy_budget_s=None if args.healthy_minutes is None else args.healthy_minutes * 60.0,
        fault_seeds=args.fault_seeds,
        cadence_pairs=args.cadence_pairs,
        stress_pairs=args.stress_pairs,
        jobs=args.jobs,
        log=_stderr,
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(result))


if __name__ == "__main__":
    main()
