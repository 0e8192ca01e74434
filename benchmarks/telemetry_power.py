"""How fast a rollout's verdict decides when the gates read production telemetry as well as
pairs, and how often it rolls back a healthy revision.

Production traffic is simulated per deployment (one baseline and one speculative arm) at
1, 5 and 50 requests per second, scraped every 15 s: each scrape interval comes from
`gates.telemetry.testing` (Poisson arrivals; log-normal TTFT and inter-token latencies,
the speculative arm's one per verify step of `verify_step_cost` decode steps; the three
latency histograms binned at vLLM's bucket bounds; requests running and waiting by
Little's law; drafts, draft tokens and accepted tokens with k = 3 draft tokens and a
per-request acceptance probability giving an acceptance length of about 2.5), with
request errors drawn per request (0.5 % on both arms). Beside it the rollout burst runs
pairs at `--pairs-per-minute` (default `rollout.max_pairs_per_minute`, 30), built
with `gates.pairs.testing`'s record builders: greedy pairs that match exactly (a lossless
speculative decoder; identical outputs score alike, so task-score deltas are 0; no
numeric ties, for those see gate_power's `deployment_bf16`), 0.5 % failures per arm,
the speculative arm about 1.8× faster (pairs run at the burst's low concurrency).

Every 15 s the revision is judged the one way the product judges it: `gates.cycle.judge`
over the pairs and both arms' telemetry since the revision started, with
`GatesConfig()` defaults, the scrape interval as the telemetry detectors' unit and the
acceptance reference pinned (`pin_acceptance_reference`) from the stable revision's
healthy telemetry before the rollout. A PASS needs the quality checks on pairs and the
three telemetry gates (`combine`); any enforce FAIL is a FAIL. To save time the verdict
is first screened every `screen` intervals (1 minute); a screened interval whose last
judgement decided, or shows an enforce detector at 0.9 of its threshold, is replayed
interval by interval, so each time is exact to the 15 s scrape.

Faults, present from the revision's first request (pairs and telemetry alike):
- `errors_5pct`: the speculative arm fails 5 % of its requests.
- `latency_x1.5_under_load`: at production load the speculative arm's TTFT and its
  inter-token latency per token are 1.5× the baseline's (speculation losing at high
  batch sizes); its pairs, at the burst's concurrency, stay as fast as when healthy.
- `acceptance_drop_30pct`: the speculative arm's acceptance length falls 30 % (the
  per-request acceptance probability lowered by bisection until it does; the measured
  lengths are reported).
Blind spots, at 5 requests per second only (`BLIND_SPOTS`):
- `correlated_outage_fault`: shared outages in 5 % of intervals, where the baseline fails
  20 % of its requests and the speculative arm 80–100 % (drawn per interval); calm
  intervals at 0.5 % on both. The pairs see none of it (the burst reaches the engines
  directly, not through what fails). `correlated_outage_fault_screen_off` judges the same
  streams with the outage screen off (`outage_alpha` 1e-300: no interval is an outage),
  the figure the screened one must stay within 1.5× of.
- `errors_4xx_30pct`: both arms' sources count 4xx (a gateway): the baseline answers 2 %
  of requests 4xx, the speculative arm 30 %.
- `canary_goes_dark`: a healthy revision judged until its verdict PASSes; then the
  speculative arm goes dark, its intervals holding no request (even seeds: traffic routed
  away) or none arriving (odd seeds: its scrapes fail). Minutes from the dark's start to
  the first judgement at which every telemetry gate is NODATA (`evidence stopped`), and
  the verdict then.

Reported (JSON with `--out`): per rate (`rates` keyed "1", "5", "50"), `healthy.trips`
(FAIL verdicts of healthy revisions, in the rollout runs and in the soak),
`healthy.minutes_to_pass` and each fault's `minutes_to_fail` (medians over seeds; a run
undecided by the cap counts as longer than any, and a median that falls on one is
null), with the runs behind them. Which figures are measured and which are a floor of
arithmetic is said (`figures`): the healthy PASS is the verdict's, and it waits on the
pairs (`pair_floor`: the exact pairs the greedy mismatch bound needs at the burst's
rate, computed, not measured); `healthy.telemetry_minutes_to_pass` is the telemetry's own
(the first judgement at which all three telemetry gates PASS), measured.
`healthy_false_trips_per_30d`: the healthy trips per 30 days of simulated healthy
traffic (the rollout runs and a soak of `--soak-hours` per rate, judged on telemetry
alone at each hour, a trip counted where an enforce telemetry detector's CUSUM peak in
its window reached its threshold) with the 95 % Poisson upper bound; `budget`: the
detectors sharing the one false-alarm budget and each one's ARL0 (pairs for pair
detectors, scrape intervals for telemetry detectors); `budget_stress`: the soak judged
again under a budget of 1,000 false rollbacks per 30 days, where alarms are frequent
enough to count: the telemetry detectors' alarms per 30 days against their share of
that budget (`within_share`), which is how the production budget, far too rare to
observe, is shown to hold.

`--quick`: 3 seeds, a 40-minute cap, a 2-hour soak per rate, two processes (about 2-3
minutes on 2 cores). The full run: 10 seeds, a 90-minute cap, 24 hours of soak per rate.

Usage: .venv/bin/python benchmarks/telemetry_power.py [--quick] [--out FILE] [--seeds N]
       [--cap-minutes M] [--soak-hours H] [--pairs-per-minute R] [--screen N] [--jobs N]
       [--rates RPS ...] [--faults FAULT ...] [--blind-spots [SCENARIO ...]]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    # Run as a file: the repository root, not this folder, holds the packages.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The imports below need the path above.
import argparse
import functools
import json
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from canaryd.config.sections import RolloutConfig
from gates.config import GatesConfig
from gates.core import GateState, checks
from gates.cycle import TELEMETRY_GATES, Judgement, judge
from gates.evidence import Evidence
from gates.pairs.testing import T0, record, result, scores
from gates.records import PairRecord
from gates.stats.budget import (
    budget_shares,
    detector_arl0,
    detector_count,
    telemetry_arl0,
    telemetry_detector_count,
)
from gates.stats.descriptive import clopper_pearson
from gates.telemetry.acceptance import AcceptanceReference, pin_acceptance_reference
from gates.telemetry.intervals import ArmTelemetry, TelemetryEvidence, TelemetryInterval
from gates.telemetry.silence import silent
from gates.telemetry.testing import ArmTraffic, simulate_interval

RATES = (1, 5, 50)
FAULTS = ("errors_5pct", "latency_x1.5_under_load", "acceptance_drop_30pct")
BLIND_SPOTS = (
    "correlated_outage_fault",
    "correlated_outage_fault_screen_off",
    "errors_4xx_30pct",
    "canary_goes_dark",
)
BLIND_SPOT_RATE = 5
# Soaks at BLIND_SPOT_RATE beside the healthy one: a traffic mix that moves acceptance (no
# stable: a soak; with one: during a rollout) and a canary declining slowly beside its
# stable.
SOAK_SCENARIOS = ("mix_shift", "rollout_mix_shift", "slow_decline_4pct_per_hour")
MIX_HOURS = 3.0
MIX_CODE_SHARES = (0.6, 0.1)  # code's share of the traffic, from and to
MIX_ACCEPTANCE = (0.85, 0.45)  # per-draft-token acceptance: code (n-gram copies), chat
DECLINE_PER_HOUR = 0.04
DECLINE_CAP_HOURS = 8.0
OUTAGE_SHARE = 0.05
OUTAGE_BASELINE_RATE = 0.2
OUTAGE_SPECULATIVE_RATES = (0.8, 1.0)
SCREEN_OFF_ALPHA = 1e-300  # no binomial tail of a scrape interval is this improbable
DARK_MINUTES = 30.0  # how long a dark arm is judged before the run is called undecided
CLIENT_ERROR_RATES = (0.02, 0.30)  # 4xx: baseline, speculative
SCRAPE_S = 15.0
STABLE_SEED = 7919  # the concurrent stable's random stream: seed + this
PAIRS_PER_MINUTE = RolloutConfig().max_pairs_per_minute  # the burst's default rate
BASELINE_ERROR_RATE = 0.005
FAULT_ERROR_RATE = 0.05
DRAFT_TOKENS = 3
TARGET_ACCEPTANCE_LENGTH = 2.5
LATENCY_FAULT = 1.5
ACCEPTANCE_DROP = 0.30
SCREEN_INTERVALS = 4
NEAR_THRESHOLD = 0.9
HOURS_PER_30_DAYS = 720.0
# The soak's calibration check: the same healthy telemetry judged under a budget this
# large (false rollbacks per 30 days), where the detectors' false alarms are frequent
# enough to count; observed alarms must stay within the telemetry detectors' share.
STRESS_BUDGET = 1000.0
# Pairs: the baseline's end-to-end time and the speculative arm's speed-up at the
# burst's concurrency; verify steps for 40 output tokens at the healthy length.
PAIR_E2E_S = 2.0
PAIR_SPEEDUP = 1.8
PAIR_OUTPUT_TOKENS = 40


@dataclass(frozen=True, slots=True)
class Arms:
    """Both arms' production traffic, and what the speculative arm's pairs look like."""

    baseline: ArmTraffic
    speculative: ArmTraffic
    speculative_error_rate: float
    pair_error_rate: float
    pair_acceptance_length: float
    outage_share: float = 0.0
    client_error_rates: tuple[float, float] | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """The traffic of every scenario at one rate, fitted once."""

    healthy: Arms
    faults: dict[str, Arms]
    acceptance_lengths: dict[str, float]


def acceptance_length(traffic: ArmTraffic, seed: int = 12345, intervals: int = 10) -> float:
    """The simulator's acceptance length (1 + accepted ÷ drafts) for `traffic`, measured
    on a large fixed-seed sample at 50 requests per second."""
    rng = np.random.default_rng(seed)
    busy = replace(traffic, rps=50.0)
    drafts = accepted = 0
    for index in range(intervals):
        interval = simulate_interval(rng, busy, T0 + timedelta(seconds=index * SCRAPE_S), SCRAPE_S)
        drafts += interval.drafts or 0
        accepted += interval.accepted_tokens or 0
    return 1.0 + accepted / drafts


def acceptance_for(target: float, traffic: ArmTraffic) -> float:
    """The mean per-request acceptance probability whose acceptance length is `target`
    (bisection on the measured length, which rises with it)."""
    low, high = 0.02, 0.98
    for _ in range(12):
        middle = (low + high) / 2
        if acceptance_length(replace(traffic, acceptance=middle)) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@functools.cache
def fitted_acceptance() -> tuple[float, float, float, float]:
    """The per-request acceptance probabilities of the healthy arm (length 2.5) and of
    the 30 % drop, and the lengths measured with them (the same at every rate)."""
    template = ArmTraffic(draft_tokens=DRAFT_TOKENS)
    healthy = acceptance_for(TARGET_ACCEPTANCE_LENGTH, template)
    length = acceptance_length(replace(template, acceptance=healthy))
    dropped = acceptance_for((1.0 - ACCEPTANCE_DROP) * length, template)
    return healthy, length, dropped, acceptance_length(replace(template, acceptance=dropped))


def plan_for(rate: int) -> Plan:
    """The healthy arms at `rate` requests per second, and each fault's."""
    alpha, length, dropped_alpha, dropped_length = fitted_acceptance()
    baseline = ArmTraffic(rps=float(rate))
    speculative = ArmTraffic(rps=float(rate), draft_tokens=DRAFT_TOKENS, acceptance=alpha)
    healthy = Arms(baseline, speculative, BASELINE_ERROR_RATE, BASELINE_ERROR_RATE, length)
    # Per token, a verify step of `verify_step_cost` decode steps yields `length` tokens:
    # slowed so that TTFT and the per-token latency are 1.5x the baseline's.
    per_token = speculative.verify_step_cost / length
    slow = replace(
        speculative,
        ttft_s=LATENCY_FAULT * baseline.ttft_s,
        itl_s=speculative.itl_s * LATENCY_FAULT / per_token,
    )
    dropped = replace(speculative, acceptance=dropped_alpha)
    faults = {
        "errors_5pct": replace(
            healthy, speculative_error_rate=FAULT_ERROR_RATE, pair_error_rate=FAULT_ERROR_RATE
        ),
        "latency_x1.5_under_load": replace(healthy, speculative=slow),
        "acceptance_drop_30pct": replace(
            healthy, speculative=dropped, pair_acceptance_length=dropped_length
        ),
    }
    outage = replace(healthy, outage_share=OUTAGE_SHARE)
    faults.update(
        {
            "correlated_outage_fault": outage,
            "correlated_outage_fault_screen_off": outage,
            "errors_4xx_30pct": replace(healthy, client_error_rates=CLIENT_ERROR_RATES),
            "canary_goes_dark": healthy,
        }
    )
    return Plan(healthy, faults, {"healthy": length, "acceptance_drop_30pct": dropped_length})


def config_for(scenario: str) -> GatesConfig:
    """`GatesConfig()` defaults, the outage screen off for the screen-off reference."""
    config = GatesConfig()
    if scenario != "correlated_outage_fault_screen_off":
        return config
    errors = config.telemetry.errors.model_copy(update={"outage_alpha": SCREEN_OFF_ALPHA})
    telemetry = config.telemetry.model_copy(update={"errors": errors})
    return config.model_copy(update={"telemetry": telemetry})


def pair_floor(config: GatesConfig, pairs_per_minute: float) -> tuple[int, float, float]:
    """Arithmetic, not a measurement: the exact pairs the greedy mismatch bound needs
    before quality can PASS (the smallest n whose Clopper–Pearson upper bound on 0
    mismatches is within `max_mismatch_rate` at the gate's confidence), the minutes they
    take at `pairs_per_minute`, and the first scrape judgement at or after that."""
    quality = config.quality
    n = 1
    while clopper_pearson(0, n, quality.confidence)[1] > quality.max_mismatch_rate:
        n += 1
    minutes = n / pairs_per_minute
    judged = math.ceil(minutes * 60 / SCRAPE_S - 1e-9) * SCRAPE_S / 60
    return n, minutes, judged


# --- the simulated rollout -------------------------------------------------------------


def with_errors(
    interval: TelemetryInterval,
    rate: float,
    rng: np.random.Generator,
    client_rate: float | None = None,
) -> TelemetryInterval:
    """`interval` with each of its requests failing independently at `rate`, and, with
    `client_rate`, each of the others answered 4xx at that rate."""
    requests = interval.requests or 0
    errors = int(rng.binomial(requests, rate))
    client = None if client_rate is None else int(rng.binomial(requests - errors, client_rate))
    return replace(interval, errors=errors, client_errors=client)


def scrape_interval(
    arms: Arms, rng: np.random.Generator, start: datetime
) -> tuple[TelemetryInterval, TelemetryInterval]:
    """Both arms' next interval: traffic, errors (in a shared outage, with probability
    `outage_share`, at the outage's rates), 4xx where the arms count them."""
    base = simulate_interval(rng, arms.baseline, start, SCRAPE_S)
    spec = simulate_interval(rng, arms.speculative, start, SCRAPE_S)
    base_rate, spec_rate = BASELINE_ERROR_RATE, arms.speculative_error_rate
    if arms.outage_share and rng.random() < arms.outage_share:
        base_rate = OUTAGE_BASELINE_RATE
        spec_rate = float(rng.uniform(*OUTAGE_SPECULATIVE_RATES))
    base_4xx, spec_4xx = arms.client_error_rates or (None, None)
    return (
        with_errors(base, base_rate, rng, base_4xx),
        with_errors(spec, spec_rate, rng, spec_4xx),
    )


def pairs_for(
    arms: Arms, rng: np.random.Generator, count: int, spacing_s: float
) -> list[PairRecord]:
    """`count` burst pairs, one every `spacing_s` seconds from T0."""
    base_e2e = PAIR_E2E_S * np.exp(rng.normal(0.0, 0.3, count))
    spec_e2e = base_e2e / PAIR_SPEEDUP * np.exp(rng.normal(0.0, 0.15, count))
    base_ok = rng.random(count) >= BASELINE_ERROR_RATE
    spec_ok = rng.random(count) >= arms.pair_error_rate
    steps = max(1, round(PAIR_OUTPUT_TOKENS / arms.pair_acceptance_length))
    records = []
    for index in range(count):
        records.append(
            record(
                index,
                baseline=result(float(base_e2e[index]), ok=bool(base_ok[index])),
                speculative=result(
                    float(spec_e2e[index]),
                    ok=bool(spec_ok[index]),
                    output_tokens=PAIR_OUTPUT_TOKENS,
                    verify_steps=steps,
                ),
                pair_scores=scores(delta=0.0),
                started_at=T0 + timedelta(seconds=(index + 1) * spacing_s),
                run_id="telemetry_power",
            )
        )
    return records


def stable_reference(
    arms: Arms, rng: np.random.Generator, config: GatesConfig, before: datetime
) -> AcceptanceReference:
    """The acceptance reference pinned from the stable revision's healthy telemetry in the
    intervals just before `before` (the rollout's start)."""
    needed = config.telemetry.acceptance
    intervals: list[TelemetryInterval] = []
    for count in range(1, 2000):
        start = before - timedelta(seconds=count * SCRAPE_S)
        intervals.insert(0, simulate_interval(rng, arms.speculative, start, SCRAPE_S))
        drafts = sum(i.drafts or 0 for i in intervals)
        if count >= needed.pin_min_intervals and drafts >= needed.pin_min_drafts:
            pinned = pin_acceptance_reference(ArmTelemetry.of(intervals), needed, now=before)
            if pinned is not None:
                return pinned
    raise RuntimeError("no acceptance reference after 2000 intervals")


def decided(judged: Judgement) -> bool:
    return judged.verdict in ("PASS", "FAIL")


def near_alarm(judged: Judgement) -> bool:
    """An enforce detector whose CUSUM peak in its window reached 0.9 of its threshold:
    an alarm may have come and gone between two screened judgements."""
    return any(
        check.detector.peak >= NEAR_THRESHOLD * check.detector.threshold
        for decision in judged.decisions
        if decision.enforced
        for check in checks([decision])
        if check.detector is not None and check.detector.threshold > 0
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """One rollout: the verdict it ended with (None: undecided at the cap), when, which
    gates FAILed, and the judgements it took."""

    verdict: str | None
    minutes: float | None
    failed_by: tuple[str, ...]
    judgements: int
    telemetry_pass_minutes: float | None = None
    verdict_after: str | None = None
    dark_mode: str | None = None


def telemetry_passed(judged: Judgement) -> bool:
    """Every telemetry gate PASSed (the telemetry's own PASS, whatever the pairs say)."""
    states = {d.name: d.state for d in judged.decisions}
    return all(states.get(name) is GateState.PASS for name in TELEMETRY_GATES)


def telemetry_silent(judged: Judgement) -> bool:
    """Every telemetry gate NODATA because its evidence stopped."""
    telemetry = [d for d in judged.decisions if d.name in TELEMETRY_GATES]
    return bool(telemetry) and all(
        d.state is GateState.NODATA and silent(d.detail) for d in telemetry
    )


def rollout(
    arms: Arms,
    stable: Arms,
    seed: int,
    *,
    cap_minutes: float,
    pairs_per_minute: float,
    config: GatesConfig,
    screen: int = SCREEN_INTERVALS,
    dark: str | None = None,
) -> Outcome:
    """A revision (`arms`) judged from its first request until its verdict decides or
    the cap, beside the `stable` revision still serving (its concurrent stable, which
    `telemetry.acceptance` judges it against); an acceptance reference is pinned from the
    stable before the rollout too, for a judgement without the stable. With
    `dark` ("no_requests" or "scrapes_fail"), a verdict that PASSes is not the end: the
    speculative arm then goes dark, and the outcome is the minutes from then until every
    telemetry gate reads NODATA for it (`DARK_MINUTES` at most) and the verdict then."""
    rng = np.random.default_rng(seed)
    reference = stable_reference(stable, rng, config, T0)
    intervals = int(cap_minutes * 60 / SCRAPE_S)
    spacing = 60.0 / pairs_per_minute
    # A dark run judges up to DARK_MINUTES longer; the others draw exactly the pairs
    # (and so the random stream) they always did.
    longest = cap_minutes + (DARK_MINUTES if dark is not None else 0.0)
    pairs = pairs_for(arms, rng, int(longest * pairs_per_minute) + 1, spacing)
    baseline: list[TelemetryInterval] = []
    speculative: list[TelemetryInterval] = []
    # The stable revision still serving beside the canary, from a stream of its own (the
    # other draws are those the runs always made).
    stable_rng = np.random.default_rng(seed + STABLE_SEED)
    stables: list[TelemetryInterval] = []
    calls = 0
    telemetry_pass: float | None = None

    def judged_at(count: int) -> Judgement:
        nonlocal calls
        calls += 1
        now = T0 + timedelta(seconds=count * SCRAPE_S)
        evidence = Evidence(
            pairs[: int(count * SCRAPE_S / spacing)],
            since=T0,
            subject="the revision",
            telemetry=TelemetryEvidence(
                ArmTelemetry(tuple(baseline[:count])),
                ArmTelemetry(tuple(i for i in speculative if i.end <= now)),
                ArmTelemetry(tuple(stables[:count])),
            ),
            scrape_interval_s=SCRAPE_S,
            acceptance_reference=reference,
        )
        return judge(evidence, config, now)

    def advance(count: int, dark_now: bool) -> None:
        start = T0 + timedelta(seconds=(count - 1) * SCRAPE_S)
        base, spec = scrape_interval(arms, rng, start)
        baseline.append(base)
        stables.append(simulate_interval(stable_rng, stable.speculative, start, SCRAPE_S))
        if not dark_now:
            speculative.append(spec)
        elif dark == "no_requests":
            idle = simulate_interval(rng, replace(arms.speculative, rps=0.0), start, SCRAPE_S)
            speculative.append(with_errors(idle, 0.0, rng))

    def went_dark(passed_at: int, minutes: float, telemetry_minutes: float | None) -> Outcome:
        """Judged at every interval after the PASS at `passed_at`, the arm dark."""
        del baseline[passed_at:], speculative[passed_at:], stables[passed_at:]
        for count in range(passed_at + 1, passed_at + int(DARK_MINUTES * 60 / SCRAPE_S) + 1):
            advance(count, True)
            judged = judged_at(count)
            if telemetry_silent(judged):
                dark_minutes = (count - passed_at) * SCRAPE_S / 60
                return Outcome(
                    "NODATA", dark_minutes, (), calls, telemetry_minutes, judged.verdict, dark
                )
        return Outcome(None, None, (), calls, telemetry_minutes, None, dark)

    screened = 0
    for count in range(1, intervals + 1):
        advance(count, False)
        if count % screen and count != intervals:
            continue
        judged = judged_at(count)
        first_pass = telemetry_pass is None and telemetry_passed(judged)
        if decided(judged) or near_alarm(judged) or first_pass:
            for replay in range(screened + 1, count + 1):
                exact = judged if replay == count else judged_at(replay)
                if telemetry_pass is None and telemetry_passed(exact):
                    telemetry_pass = replay * SCRAPE_S / 60
                if decided(exact):
                    failed = tuple(
                        d.name for d in exact.decisions if d.enforced and d.state is GateState.FAIL
                    )
                    minutes = replay * SCRAPE_S / 60
                    if dark is not None and exact.verdict == "PASS":
                        return went_dark(replay, minutes, telemetry_pass)
                    return Outcome(exact.verdict, minutes, failed, calls, telemetry_pass)
        screened = count
    return Outcome(None, None, (), calls, telemetry_pass)


def telemetry_alarms(judged: Judgement) -> list[str]:
    """The enforce telemetry checks that FAILed or whose CUSUM peak in its window reached
    its threshold (an alarm any judgement in the window could have raised)."""
    return [
        check.name
        for decision in judged.decisions
        if decision.enforced and decision.name in TELEMETRY_GATES
        for check in checks([decision])
        if check.state is GateState.FAIL
        or (check.detector is not None and check.detector.peak >= check.detector.threshold)
    ]


def mixed(traffic: ArmTraffic, hours: float) -> ArmTraffic:
    """`traffic` `hours` into the mix shift: the code share falling linearly from
    `MIX_CODE_SHARES[0]` to `[1]` over `MIX_HOURS`, then staying; each class's per-token
    acceptance (`MIX_ACCEPTANCE`) weighted by its share."""
    start, end = MIX_CODE_SHARES
    share = start + (end - start) * min(hours / MIX_HOURS, 1.0)
    code, chat = MIX_ACCEPTANCE
    return replace(traffic, acceptance=share * code + (1.0 - share) * chat)


@functools.cache
def declined_acceptance(quarter: int) -> float:
    """The per-request acceptance probability `quarter` quarter-hours into the slow
    decline: the healthy length less `DECLINE_PER_HOUR` of it per hour."""
    _, length, _, _ = fitted_acceptance()
    target = length * (1.0 - DECLINE_PER_HOUR * quarter / 4.0)
    return acceptance_for(target, ArmTraffic(draft_tokens=DRAFT_TOKENS))


def soak_traffic(arms: Arms, scenario: str, hours: float) -> tuple[ArmTraffic, ArmTraffic]:
    """The canary's and its concurrent stable's traffic `hours` into a soak `scenario`."""
    speculative = arms.speculative
    if scenario in ("mix_shift", "rollout_mix_shift"):
        return mixed(speculative, hours), mixed(speculative, hours)
    if scenario == "slow_decline_4pct_per_hour":
        declined = replace(speculative, acceptance=declined_acceptance(int(hours * 4)))
        return declined, speculative
    return speculative, speculative


def soak(
    rate: int, seed: int, *, hours: float, config: GatesConfig, scenario: str = "healthy"
) -> dict[str, Any]:
    """Telemetry of `scenario` for `hours` (`soak_hours` says how long each scenario's
    is), judged on telemetry alone at every hour, under `config` and, healthy, again
    under the stress budget (`STRESS_BUDGET`), each restarting its evidence after an
    alarm as a rollback does. Every scenario but `mix_shift` has the canary's
    concurrent stable beside it. Trips: hours with an alarm of an enforce telemetry check
    under `config`; stress alarms: every alarmed check under the stress budget;
    `acceptance_as_read`: hours where `telemetry.acceptance`'s own detector alarmed,
    set aside or not (`gates.telemetry.mix`); a slow decline stops at its first
    `telemetry.acceptance` trip."""
    arms = plan_for(rate).healthy
    rng = np.random.default_rng(seed)
    start_traffic, _ = soak_traffic(arms, scenario, 0.0)
    reference = stable_reference(replace(arms, speculative=start_traffic), rng, config, T0)
    stable_rng = np.random.default_rng(seed + STABLE_SEED)
    with_stable = scenario != "mix_shift"
    stables: list[TelemetryInterval] = []
    as_read: list[int] = []
    stressed = config.model_copy(
        update={
            "budget": config.budget.model_copy(
                update={"false_rollbacks_per_30_days": STRESS_BUDGET}
            )
        }
    )
    per_hour = int(3600 / SCRAPE_S)
    baseline: list[TelemetryInterval] = []
    speculative: list[TelemetryInterval] = []
    trips: list[dict[str, Any]] = []
    stress_alarms: list[dict[str, Any]] = []
    since: dict[str, datetime] = {"budget": T0, "stress": T0}
    tracks = (("budget", config), ("stress", stressed))
    for hour in range(1, math.ceil(hours) + 1):
        for index in range((hour - 1) * per_hour, hour * per_hour):
            start = T0 + timedelta(seconds=index * SCRAPE_S)
            canary, beside = soak_traffic(arms, scenario, index * SCRAPE_S / 3600.0)
            base = simulate_interval(rng, arms.baseline, start, SCRAPE_S)
            spec = simulate_interval(rng, canary, start, SCRAPE_S)
            baseline.append(with_errors(base, BASELINE_ERROR_RATE, rng))
            speculative.append(with_errors(spec, BASELINE_ERROR_RATE, rng))
            if with_stable:
                stables.append(simulate_interval(stable_rng, beside, start, SCRAPE_S))
        now = T0 + timedelta(seconds=hour * per_hour * SCRAPE_S)
        evidence = TelemetryEvidence(
            ArmTelemetry(tuple(baseline)),
            ArmTelemetry(tuple(speculative)),
            ArmTelemetry(tuple(stables)),
        )
        for track, judged_config in tracks if scenario == "healthy" else tracks[:1]:
            telemetry_only = Evidence(
                since=since[track],
                telemetry=evidence,
                scrape_interval_s=SCRAPE_S,
                acceptance_reference=reference,
            )
            judged = judge(telemetry_only, judged_config, now)
            alarms = telemetry_alarms(judged)
            if track == "budget" and acceptance_alarmed(judged):
                as_read.append(hour)
            if alarms:
                (trips if track == "budget" else stress_alarms).append(
                    {"hour": hour, "checks": alarms}
                )
                since[track] = now  # a rollback restarts the evidence
        if scenario == "slow_decline_4pct_per_hour" and any(
            "telemetry.acceptance" in trip["checks"] for trip in trips
        ):
            break
    return {
        "rate": rate,
        "scenario": scenario,
        "concurrent_stable": with_stable,
        "hours": float(hour),
        "trips": trips,
        "stress_alarms": stress_alarms,
        "acceptance_as_read": as_read,
    }


def acceptance_alarmed(judged: Judgement) -> bool:
    """`telemetry.acceptance`'s detector reached its threshold in its window, whether the
    decision stood or was set aside (the reading before `gates.telemetry.mix`)."""
    return any(
        check.state is GateState.FAIL
        or "set aside (FAIL" in check.detail
        or (check.detector is not None and check.detector.peak >= check.detector.threshold)
        for decision in judged.decisions
        if decision.name == "telemetry.acceptance"
        for check in checks([decision])
    )


# --- the benchmark ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Task:
    """One unit of work for the pool: a rollout run or a soak."""

    kind: str  # "rollout" or "soak"
    rate: int
    scenario: str  # "healthy" or a fault
    seed: int


def run_task(
    task: Task, cap_minutes: float, pairs_per_minute: float, soak_hours: float, screen: int
) -> Any:
    config = config_for(task.scenario)
    if task.kind == "soak":
        hours = {"mix_shift": MIX_HOURS, "rollout_mix_shift": MIX_HOURS}.get(
            task.scenario,
            DECLINE_CAP_HOURS if task.scenario == "slow_decline_4pct_per_hour" else soak_hours,
        )
        return soak(task.rate, task.seed, hours=hours, config=config, scenario=task.scenario)
    plan = plan_for(task.rate)
    arms = plan.healthy if task.scenario == "healthy" else plan.faults[task.scenario]
    dark = None
    if task.scenario == "canary_goes_dark":
        dark = ("no_requests", "scrapes_fail")[(task.seed // 1000) % 2]
    return rollout(
        arms,
        plan.healthy,
        task.seed,
        cap_minutes=cap_minutes,
        pairs_per_minute=pairs_per_minute,
        config=config,
        screen=screen,
        dark=dark,
    )


def censored_median(values: Sequence[float | None]) -> float | None:
    """The median with undecided runs (None) longer than any; None when it is one."""
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    if not ordered:
        return None
    middle = ordered[(len(ordered) - 1) // 2]
    if len(ordered) % 2 == 0:
        upper = ordered[len(ordered) // 2]
        if middle is None or upper is None:
            return None
        return (middle + upper) / 2
    return middle


def poisson_upper95(count: int) -> float:
    """The one-sided 95 % upper bound on a Poisson mean from `count` events."""
    from scipy.stats import chi2

    return float(chi2.ppf(0.95, 2 * (count + 1)) / 2)


def run(
    *,
    seeds: int,
    cap_minutes: float,
    soak_hours: float,
    pairs_per_minute: float = PAIRS_PER_MINUTE,
    screen: int = SCREEN_INTERVALS,
    jobs: int = 1,
    rates: Sequence[int] = RATES,
    faults: Sequence[str] = FAULTS,
    blind_spots: Sequence[str] = BLIND_SPOTS,
    soak_scenarios: Sequence[str] = SOAK_SCENARIOS,
) -> dict[str, Any]:
    """Every rate's healthy and faulty rollouts over `seeds` seeds and its soak, and the
    blind spots and soak scenarios at `BLIND_SPOT_RATE`; the JSON."""
    began = time.perf_counter()
    tasks = [Task("soak", rate, "healthy", 1000 + rate) for rate in rates if soak_hours > 0]
    tasks += [
        Task("rollout", rate, scenario, seed * 1000 + rate)
        for rate in rates
        for scenario in ("healthy", *faults)
        for seed in range(seeds)
    ]
    if BLIND_SPOT_RATE in rates:
        tasks += [
            Task("rollout", BLIND_SPOT_RATE, scenario, seed * 1000 + BLIND_SPOT_RATE)
            for scenario in blind_spots
            for seed in range(seeds)
        ]
    if BLIND_SPOT_RATE in rates:
        tasks += [
            Task("soak", BLIND_SPOT_RATE, scenario, seed * 1000 + BLIND_SPOT_RATE)
            for scenario in soak_scenarios
            for seed in range(seeds)
        ]
    arguments = (cap_minutes, pairs_per_minute, soak_hours, screen)
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_task, task, *arguments) for task in tasks]
            results = [future.result() for future in futures]
    else:
        results = [run_task(task, *arguments) for task in tasks]
    done = dict(zip(tasks, results, strict=True))
    config = GatesConfig()
    report: dict[str, Any] = {"rates": {}}
    healthy_hours = 0.0
    healthy_trips = 0
    for rate in rates:
        runs: dict[str, list[Outcome]] = {
            scenario: [] for scenario in ("healthy", *faults, *blind_spots)
        }
        for task in tasks:
            if task.kind == "rollout" and task.rate == rate:
                runs[task.scenario].append(done[task])
        soaked = next(
            (
                done[t]
                for t in tasks
                if t.kind == "soak" and t.rate == rate and t.scenario == "healthy"
            ),
            None,
        )
        healthy = runs["healthy"]
        rollout_trips = sum(1 for o in healthy if o.verdict == "FAIL")
        soak_trips = len(soaked["trips"]) if soaked else 0
        healthy_trips += rollout_trips + soak_trips
        healthy_hours += sum((o.minutes or cap_minutes) / 60 for o in healthy)
        healthy_hours += soaked["hours"] if soaked else 0.0
        passed = [o.minutes if o.verdict == "PASS" else None for o in healthy]
        telemetry_passed_at = [o.telemetry_pass_minutes for o in healthy]
        report["rates"][str(rate)] = {
            "healthy": {
                "trips": rollout_trips + soak_trips,
                "minutes_to_pass": censored_median(passed),
                "runs_minutes_to_pass": passed,
                "telemetry_minutes_to_pass": censored_median(telemetry_passed_at),
                "runs_telemetry_minutes_to_pass": telemetry_passed_at,
                "rollout_trips": rollout_trips,
                "soak_hours": soaked["hours"] if soaked else 0.0,
                "soak_trips": soaked["trips"] if soaked else [],
            },
            "faults": {
                fault: {
                    "minutes_to_fail": censored_median(
                        [o.minutes if o.verdict == "FAIL" else None for o in runs[fault]]
                    ),
                    "runs_minutes_to_fail": [
                        o.minutes if o.verdict == "FAIL" else None for o in runs[fault]
                    ],
                    "failed_by": sorted({name for o in runs[fault] for name in o.failed_by}),
                    "passed_runs": sum(1 for o in runs[fault] if o.verdict == "PASS"),
                }
                for fault in faults
            },
        }
        if rate == BLIND_SPOT_RATE and blind_spots:
            report["rates"][str(rate)]["blind_spots"] = {
                scenario: blind_spot_figures(scenario, runs[scenario]) for scenario in blind_spots
            }
    per_30d = healthy_trips / healthy_hours * HOURS_PER_30_DAYS if healthy_hours else None
    soaks = [done[t] for t in tasks if t.kind == "soak" and t.scenario == "healthy"]
    report["soak_scenarios"] = {
        scenario: soak_figures(
            [done[t] for t in tasks if t.kind == "soak" and t.scenario == scenario]
        )
        for scenario in soak_scenarios
    }
    soak_hours_total = sum(soaked["hours"] for soaked in soaks)
    stress_count = sum(len(a["checks"]) for soaked in soaks for a in soaked["stress_alarms"])
    stressed = config.model_copy(
        update={
            "budget": config.budget.model_copy(
                update={"false_rollbacks_per_30_days": STRESS_BUDGET}
            )
        }
    )
    share = (
        STRESS_BUDGET * telemetry_detector_count(config) / budget_shares(stressed, telemetry=True)
    )
    upper = poisson_upper95(healthy_trips) / healthy_hours * HOURS_PER_30_DAYS
    lengths = plan_for(rates[0]).acceptance_lengths
    floor_pairs, floor_minutes, floor_judged = pair_floor(config, pairs_per_minute)
    report.update(
        {
            "pair_floor": {
                "exact_pairs": floor_pairs,
                "pairs_per_minute": pairs_per_minute,
                "minutes": floor_minutes,
                "judged_minutes": floor_judged,
            },
            "figures": {
                "healthy.minutes_to_pass": (
                    "measured (the verdict), but a floor of arithmetic bounds it: PASS waits "
                    f"on the pairs' greedy mismatch bound, {floor_pairs} exact pairs, "
                    f"{floor_minutes:.2f} min at {pairs_per_minute:g} a minute, judged at "
                    f"{floor_judged:.2f} (pair_floor); a verdict at that figure says nothing "
                    "of the telemetry"
                ),
                "healthy.telemetry_minutes_to_pass": (
                    "measured: the first judgement at which all three telemetry gates PASS"
                ),
                "faults.*.minutes_to_fail": "measured",
                "blind_spots.*": "measured",
                "healthy_false_trips_per_30d_upper95": "arithmetic (a Poisson bound on 0 trips)",
            },
            "healthy_false_trips_per_30d": per_30d,
            "healthy_false_trips_per_30d_upper95": upper,
            "healthy_hours": healthy_hours,
            "budget_stress": {
                "false_rollbacks_per_30_days": STRESS_BUDGET,
                "telemetry_share_per_30d": share,
                "soak_hours": soak_hours_total,
                "alarms": stress_count,
                "alarms_per_30d": (
                    stress_count / soak_hours_total * HOURS_PER_30_DAYS
                    if soak_hours_total
                    else None
                ),
                "within_share": (
                    stress_count / soak_hours_total * HOURS_PER_30_DAYS <= share
                    if soak_hours_total
                    else None
                ),
            },
            "budget": {
                "false_rollbacks_per_30_days": config.budget.false_rollbacks_per_30_days,
                "detectors": detector_count(config, telemetry=True),
                "telemetry_detectors": telemetry_detector_count(config),
                "pair_detector_arl0_pairs": detector_arl0(config, telemetry=True),
                "telemetry_detector_arl0_intervals": telemetry_arl0(config, SCRAPE_S),
            },
            "setup": {
                "seeds": seeds,
                "cap_minutes": cap_minutes,
                "scrape_interval_s": SCRAPE_S,
                "pairs_per_minute": pairs_per_minute,
                "screen_intervals": screen,
                "baseline_error_rate": BASELINE_ERROR_RATE,
                "draft_tokens": DRAFT_TOKENS,
                "acceptance_length_healthy": lengths["healthy"],
                "acceptance_length_acceptance_drop_30pct": lengths["acceptance_drop_30pct"],
            },
            "elapsed_s": round(time.perf_counter() - began, 1),
        }
    )
    return report


def soak_figures(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A soak scenario's figures over its seeds: trips (enforce alarms) and, for the slow
    decline, the hour of the first `telemetry.acceptance` trip (None: none within the
    cap), with the hours `telemetry.acceptance`'s own detector alarmed, set aside or not."""
    fail_hours = [
        next(
            (trip["hour"] for trip in run["trips"] if "telemetry.acceptance" in trip["checks"]),
            None,
        )
        for run in runs
    ]
    return {
        "concurrent_stable": all(run["concurrent_stable"] for run in runs),
        "hours": [run["hours"] for run in runs],
        "trips": sum(len(run["trips"]) for run in runs),
        "runs_trips": [run["trips"] for run in runs],
        "runs_acceptance_fail_hour": fail_hours,
        "runs_acceptance_as_read": [run["acceptance_as_read"] for run in runs],
    }


def blind_spot_figures(scenario: str, runs: Sequence[Outcome]) -> dict[str, Any]:
    """One blind spot's figures: minutes to FAIL, or for `canary_goes_dark` the minutes
    from the dark's start to NODATA of every telemetry gate and the verdict then."""
    if scenario == "canary_goes_dark":
        stopped = [o.minutes if o.verdict == "NODATA" else None for o in runs]
        return {
            "minutes_to_nodata": censored_median(stopped),
            "runs_minutes_to_nodata": stopped,
            "runs_dark_mode": [o.dark_mode for o in runs],
            "runs_verdict_then": [o.verdict_after for o in runs],
            "passed_runs_after_dark": sum(1 for o in runs if o.verdict_after == "PASS"),
        }
    failed = [o.minutes if o.verdict == "FAIL" else None for o in runs]
    return {
        "minutes_to_fail": censored_median(failed),
        "runs_minutes_to_fail": failed,
        "failed_by": sorted({name for o in runs for name in o.failed_by}),
        "passed_runs": sum(1 for o in runs if o.verdict == "PASS"),
    }


def table(report: dict[str, Any]) -> str:
    """The figures as text: per rate, minutes to PASS and to FAIL per fault, and trips."""

    def minutes(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    floor = report["pair_floor"]
    lines = [
        "minutes, medians over seeds; 'pass min' is measured but bounded below by the pairs' "
        f"floor ({floor['exact_pairs']} exact pairs at {floor['pairs_per_minute']:g} a minute: "
        f"{floor['judged_minutes']:.2f} min, arithmetic); 'telemetry pass' is the telemetry "
        "gates' own PASS (measured); every FAIL figure is measured",
        f"{'rps':>4} {'trips':>5} {'pass min':>8} {'telemetry pass':>14} "
        + " ".join(f"{f:>24}" for f in FAULTS),
    ]
    for rate, figures in report["rates"].items():
        healthy = figures["healthy"]
        fails = [
            minutes(figures["faults"][f]["minutes_to_fail"]) if f in figures["faults"] else "-"
            for f in FAULTS
        ]
        lines.append(
            f"{rate:>4} {healthy['trips']:>5} {minutes(healthy['minutes_to_pass']):>8} "
            f"{minutes(healthy.get('telemetry_minutes_to_pass')):>14} "
            + " ".join(f"{value:>24}" for value in fails)
        )
    for rate, figures in report["rates"].items():
        for scenario, found in figures.get("blind_spots", {}).items():
            if "minutes_to_nodata" in found:
                lines.append(
                    f"{rate:>4} rps {scenario}: NODATA {minutes(found['minutes_to_nodata'])} "
                    f"min after going dark (measured; runs {found['runs_minutes_to_nodata']}, "
                    f"{found['runs_dark_mode']}, verdict then {found['runs_verdict_then']})"
                )
            else:
                lines.append(
                    f"{rate:>4} rps {scenario}: FAIL {minutes(found['minutes_to_fail'])} min "
                    f"(measured; runs {found['runs_minutes_to_fail']}, by "
                    f"{', '.join(found['failed_by']) or '-'}, {found['passed_runs']} PASSed)"
                )
    for scenario, found in report.get("soak_scenarios", {}).items():
        stable = "beside its concurrent stable" if found["concurrent_stable"] else "no stable"
        lines.append(
            f"{BLIND_SPOT_RATE:>4} rps {scenario} ({stable}, hours {found['hours']}): "
            f"{found['trips']} trips (measured; acceptance FAIL at hour "
            f"{found['runs_acceptance_fail_hour']}; acceptance's own detector alarmed, "
            f"set aside or not, at hours {found['runs_acceptance_as_read']})"
        )
    lines.append(
        f"healthy false trips per 30 days: {report['healthy_false_trips_per_30d']:.3g} "
        f"(95 % bound {report['healthy_false_trips_per_30d_upper95']:.3g}, "
        f"{report['healthy_hours']:.1f} h of healthy traffic); {report['elapsed_s']} s"
    )
    stress = report["budget_stress"]
    if stress["soak_hours"]:
        lines.append(
            f"budget stress ({stress['false_rollbacks_per_30_days']:g} per 30 days): "
            f"{stress['alarms']} telemetry alarms in {stress['soak_hours']:g} h, "
            f"{stress['alarms_per_30d']:.3g} per 30 days vs a share of "
            f"{stress['telemetry_share_per_30d']:.3g}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds, 30 min cap, 2 h soak")
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per scenario")
    parser.add_argument("--cap-minutes", type=float, default=None)
    parser.add_argument("--soak-hours", type=float, default=None, help="per rate")
    parser.add_argument("--pairs-per-minute", type=float, default=PAIRS_PER_MINUTE)
    parser.add_argument(
        "--rates", type=int, nargs="+", default=list(RATES), help="requests per second"
    )
    parser.add_argument("--faults", nargs="+", default=list(FAULTS), choices=FAULTS)
    parser.add_argument(
        "--blind-spots",
        nargs="*",
        default=list(BLIND_SPOTS),
        choices=BLIND_SPOTS,
        help=f"scenarios at {BLIND_SPOT_RATE} requests per second (none: leave them out)",
    )
    parser.add_argument(
        "--soak-scenarios",
        nargs="*",
        default=list(SOAK_SCENARIOS),
        choices=SOAK_SCENARIOS,
        help=f"soaks at {BLIND_SPOT_RATE} requests per second (none: leave them out)",
    )
    parser.add_argument(
        "--screen", type=int, default=None, help="intervals between screened judgements"
    )
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    report = run(
        seeds=args.seeds or (3 if args.quick else 10),
        cap_minutes=args.cap_minutes or (30.0 if args.quick else 90.0),
        soak_hours=args.soak_hours
        if args.soak_hours is not None
        else (2.0 if args.quick else 24.0),
        pairs_per_minute=args.pairs_per_minute,
        screen=args.screen or (8 if args.quick else SCREEN_INTERVALS),
        jobs=args.jobs,
        rates=args.rates,
        faults=args.faults,
        blind_spots=args.blind_spots,
        soak_scenarios=args.soak_scenarios,
    )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(table(report))


if __name__ == "__main__":
    main()
