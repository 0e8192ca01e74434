"""How often the production gates roll back healthy traffic, and how fast they catch faults.

Everything is driven through the production code: pairs come from the real `PairRunner`
over seeded, noisy `FakeEngine` arms on the shipped prompt suites (`StratifiedSampler`),
time is simulated (one pair every 10 s, the false-alarm budget's design rate, unless
stated otherwise), and decisions come from the product's one judging path, `gates.cycle`
(`latest_window`: the daemon's window; `pins`: its pinning rule; `evaluate_all`: every
pair gate), and the switch policy `gates.step`, with `GatesConfig()` defaults and the
daemon's evidence restart (`since` = the switch's last transition). The benchmark
simulates the inputs; it judges nothing its own way.

The package: `noise` (the noise models), `streams` (the pair loop in simulated time),
`trips` (trip counting through the judging path), `sample` (per-pair figures of a
healthy run), `healthy`, `stress`, `faults` (the faults and canaryd's time to trip),
`comparators` (the Kayenta-style judges and the oracles), `detection` (the faults
section), `pins` (drift pins), `schedule` (the default schedule), `fit` (the embedded
fit), `tables`, `benchmark` (`run`) and `__main__` (the command).

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
- `flaky_infra_10pct`: the realistic arms on flaky infrastructure, each arm failing 10 %
  of its requests on its own, independently of the other: equal, healthy arms that the
  error gate's ceiling (relative to the baseline's own rate) must never roll back.
- `duplicated_pairs`: the realistic arms measured by two daemons replaying the same
  (prompt, seed) sequence into one store: every pair appears twice, from two runs, 5 s
  apart (the judging path's de-duplication is what keeps it from doubling every
  detector's statistic).
- `healthy_stalls`: the embedded_fit arms run as a rollout burst runs them, cycles of 4
  concurrent pairs (each cycle once the one before has ended, about one pair every 10 s
  on average), and host stalls (`BurstStalls`): 2 % of the cycles have one arm slowed
  3–20× (e2e, TTFT, TPOT, inter-token gaps), the same arm in all 4 pairs of the cycle —
  one hiccup moving four ratios the same way, the pessimistic case. Nothing to roll
  back: the latency gate counts a cycle's concurrent pairs as one piece of evidence.
  These three, like `deployment_bf16`, are judged at the production budget only.

Every model's pairs start as the daemon starts them: one every 10 s, or once the pair
before has ended (its arms run one after the other) when that is later.

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
  `latency_factor` 1.5, `error_rate` 0.05, `corrupt_rate` 0.03 and 0.8;
  `correlated_fault` (speculative `error_rate` 0.10, each failure also failing the
  baseline on each of the next 3 pairs with probability 0.5: `Collateral`, a shared node
  the speculative arm takes down), judged again on the same pairs with the error gate's
  outage screen off (`gates.error.outage_spans = []`: `screen_off_pairs_median`);
  `dead_arm_flaky_baseline` (speculative `error_rate` 1.0 beside a baseline failing 70 %);
  and on `deployment_bf16`, `runner_up_bug` (a verify kernel that takes the runner-up
  wherever the top-2 gap is under 0.5 nats) and `calibrated_runner_up_bug` (the same
  kernel on `deployment_deterministic`, whose baseline reproduces its own greedy output,
  with `canaryd calibrate` run first on every shipped prompt: the product's
  `Calibration` decides what is stored from the simulated A/A and A/B pairs, and the
  faults are judged with the config the daemon would then read; `calibration` reports,
  per seed, what it saw, what the A/B pairs alone would have bounded and which margin
  judged).
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

Usage: .venv/bin/python benchmarks/gate_power [--quick] [--out FILE] [--seed N]
       [--healthy-minutes M] [--fault-seeds N] [--cadence-pairs N] [--stress-pairs N]
       [--jobs N] [--refit]
   or: .venv/bin/python -m benchmarks.gate_power [the same options]
"""

from __future__ import annotations

from benchmarks.gate_power.benchmark import SecondHalf, run
from benchmarks.gate_power.comparators import (
    Oracle,
    edge_oracle_for,
    excess_score_pvalue,
    kayenta_edge_test,
    kayenta_pairs,
    kayenta_phase,
    kayenta_tolerance,
    oracle_for,
    oracle_pairs,
)
from benchmarks.gate_power.detection import censored_median, fault_runs, median_ci95
from benchmarks.gate_power.faults import (
    Fault,
    canaryd_pairs_to_trip,
    drift_rate_for,
    minutes_on_schedule,
)
from benchmarks.gate_power.fit import fit_embedded
from benchmarks.gate_power.healthy import healthy_run
from benchmarks.gate_power.noise import (
    BurstStalls,
    Collateral,
    DeploymentNoise,
    NoiseModel,
    deployment_bf16,
    deployment_deterministic,
    duplicated_pairs,
    embedded_fit,
    flaky_infra,
    healthy_stalls,
    realistic,
)
from benchmarks.gate_power.pins import drift_pins
from benchmarks.gate_power.sample import HealthySample
from benchmarks.gate_power.schedule import default_schedule
from benchmarks.gate_power.streams import FaultStream, PairStream, default_prompts
from benchmarks.gate_power.stress import stress_result, with_budget
from benchmarks.gate_power.tables import table
from benchmarks.gate_power.trips import TripCounter, alarms, poisson_upper95

__all__ = [
    "BurstStalls",
    "Collateral",
    "DeploymentNoise",
    "Fault",
    "FaultStream",
    "HealthySample",
    "NoiseModel",
    "Oracle",
    "PairStream",
    "SecondHalf",
    "TripCounter",
    "alarms",
    "canaryd_pairs_to_trip",
    "censored_median",
    "default_prompts",
    "default_schedule",
    "deployment_bf16",
    "deployment_deterministic",
    "drift_pins",
    "drift_rate_for",
    "duplicated_pairs",
    "edge_oracle_for",
    "embedded_fit",
    "excess_score_pvalue",
    "fault_runs",
    "fit_embedded",
    "flaky_infra",
    "healthy_run",
    "healthy_stalls",
    "kayenta_edge_test",
    "kayenta_pairs",
    "kayenta_phase",
    "kayenta_tolerance",
    "median_ci95",
    "minutes_on_schedule",
    "oracle_for",
    "oracle_pairs",
    "poisson_upper95",
    "realistic",
    "run",
    "stress_result",
    "table",
    "with_budget",
]
