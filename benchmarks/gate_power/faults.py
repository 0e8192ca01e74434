"""The faults injected after a healthy prefix and canaryd's time to catch them: each
`Fault` is an update to a noise model's arms (`faults`: a 30 % acceptance drop in one
category, found by bisection in `drift_rate_for`, slower e2e, errors, corruption, a
verify bug on the bf16 deployment, errors that take the baseline's next requests down, a
dead arm beside a failing baseline, a kernel that takes the runner-up of close calls, and
the same kernel with `canaryd calibrate` run first, `calibrated_config`).
`canaryd_pairs_to_trip` judges the pairs from the onset with the product's judging path
and switch policy at the 60 s cadence (screened, replayed where a detector nears its
threshold) until the switch rolls back;
`minutes_on_schedule` turns its pairs into wall-clock minutes on the shipped schedule."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from benchmarks.gate_power.noise import (
    T0,
    Collateral,
    NoiseModel,
    deployment_bf16,
    deployment_deterministic,
    realistic,
)
from benchmarks.gate_power.streams import FaultStream, PairStream, default_prompts
from benchmarks.gate_power.trips import alarms
from canaryd.config import ScheduleConfig
from canaryd.config.sections import interval_for
from canaryd.judging.calibration import Calibration, RunDivergences
from canaryd.scoring.calibrate import Measured, tail_bound
from gates import (
    Evaluation,
    GatesConfig,
    GateState,
    ReferenceStats,
    SwitchMode,
    SwitchState,
    liveness_gate,
    step,
)
from gates.cycle import evaluate_all, latest_window, suspicion, window_bounds
from gates.evidence import Evidence, MarginSource
from gates.records import BASELINE_ARM, DEFAULT_ARM, PairRecord
from gates.stats.budget import detector_arl0

PREFIX_PAIRS = 1_500


SCREEN_MARGIN = 0.9  # replay the 60 s cadence once a CUSUM peak reaches this share of h
DRIFT_CATEGORY = "code"
DRIFT_DROP = 0.30


@dataclass(frozen=True)
class Fault:
    name: str
    metric: str  # what the Kayenta judge and the oracle watch
    update: dict[str, Any]  # to the speculative arm
    base: str = "realistic"  # the noise model the fault is injected into
    baseline: dict[str, Any] = field(default_factory=dict)  # to the baseline arm
    collateral: Collateral | None = None
    screen_off: bool = False  # also judged with the error gate's outage screen off
    deployment: dict[str, Any] = field(default_factory=dict)  # to the base's DeploymentNoise
    calibrated: bool = False  # `canaryd calibrate` runs on the faulty arms first

    def model(self, base: NoiseModel) -> NoiseModel:
        """`base` with the fault injected."""
        faulty = base.with_speculative(**self.update).with_baseline(**self.baseline)
        if self.deployment and faulty.deployment is not None:
            faulty = replace(faulty, deployment=replace(faulty.deployment, **self.deployment))
        return replace(faulty, collateral=self.collateral) if self.collateral else faulty

    def described(self) -> dict[str, Any]:
        """The fault as the JSON reports it."""
        out = dict(self.update)
        if self.baseline:
            out["baseline"] = dict(self.baseline)
        if self.collateral is not None:
            out["collateral"] = asdict(self.collateral)
        if self.deployment:
            out["deployment"] = dict(self.deployment)
        if self.calibrated:
            out["calibrated"] = True
        return out


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
        # A speculative arm failing 10 % that takes a shared node or GPU down with it: the
        # baseline fails the next 3 pairs with probability 1/2 each. The outage screen must
        # not hide it (judged again with the screen off: `screen_off_pairs_median`).
        Fault(
            "correlated_fault",
            "error",
            {"error_rate": 0.10},
            collateral=Collateral(pairs=3, probability=0.5),
            screen_off=True,
        ),
        # A dead arm beside a baseline failing 70 % of its requests.
        Fault(
            "dead_arm_flaky_baseline", "error", {"error_rate": 1.0}, baseline={"error_rate": 0.7}
        ),
        # A verify kernel that takes the runner-up token wherever the top-2 gap is under
        # 0.5 nats: nearly every greedy output diverges, every divergence within the tie
        # margin (the tie-rate check's fault).
        Fault(
            "runner_up_bug",
            "ties",
            {},
            base="deployment_bf16",
            deployment={"runner_up_below": 0.5},
        ),
        # The same kernel on a deployment that reproduces its own greedy output, with
        # `canaryd calibrate` run on the faulty arms first: the A/A run never diverges,
        # so nothing is stored (the A/B run, the bug's own margins up to 0.5 nats, never
        # sets the margin) and the configured margin judges.
        Fault(
            "calibrated_runner_up_bug",
            "ties",
            {},
            base="deployment_deterministic",
            deployment={"runner_up_below": 0.5},
            calibrated=True,
        ),
    ]


def base_model(name: str) -> NoiseModel:
    """The noise model a fault is injected into, by `Fault.base`."""
    bases = {
        "realistic": realistic,
        "deployment_bf16": deployment_bf16,
        "deployment_deterministic": deployment_deterministic,
    }
    return bases[name]()


def _measured(record: PairRecord) -> Measured | None:
    """A simulated greedy pair as `canaryd calibrate` measures it (None: a request
    failed): agreeing outputs, the pair's margin, or a divergence nothing measured."""
    scores = record.scores
    if scores is None:
        return None
    if scores.exact_match:
        return Measured()
    if scores.divergence_margin is None or scores.divergence_judge == "bound":
        return Measured(unmeasured=1)
    return Measured((abs(scores.divergence_margin),))


def calibrated_config(
    fault: Fault, base: NoiseModel, config: GatesConfig, seed: int
) -> tuple[GatesConfig, dict[str, Any]]:
    """`canaryd calibrate` on the fault's arms before the onset, as the command runs it
    by default (every shipped prompt once, greedy at its full `max_tokens`): the A/A run
    is the healthy base's pair (the baseline against itself under the deployment's own
    numerics), the A/B run the faulty model's; the product's `Calibration` decides what
    is stored, and the config the gates judge with is the one the daemon would read
    (`Evidence.judged_config`). Returns that config and what the calibration saw."""
    prompts = default_prompts()
    healthy = PairStream(base, seed + 6_007).greedy_pairs(prompts)
    faulty = PairStream(fault.model(base), seed + 6_011).greedy_pairs(prompts)
    aa = [m for r in healthy if (m := _measured(r)) is not None]
    ab = [m for r in faulty if (m := _measured(r)) is not None]
    result = Calibration(
        arm=DEFAULT_ARM,
        arms=f"gate_power:{fault.name}",
        engines=f"gate_power:{base.name}",
        aa=RunDivergences.of(BASELINE_ARM, aa),
        ab=RunDivergences.of(DEFAULT_ARM, ab),
        prompts=len(prompts),
        failures=2 * len(prompts) - len(aa) - len(ab),
        at=T0,
    )
    row = result.stored()
    source = (
        MarginSource(config.quality.tie_margin_nats, "configured")
        if row is None
        else MarginSource(row.margin, "calibrated", row.calibrated_at, row.aa_divergent_pairs or 0)
    )
    judged = Evidence(tie_margin=source).judged_config(config)
    return judged, {
        "aa_divergent_pairs": result.aa.divergent_pairs,
        "ab_divergent_pairs": result.ab.divergent_pairs,
        "ab_max_margin": result.ab.max_margin,
        # What the A/B run alone would have bounded, had it set the margin (information).
        "ab_alone_bound": tail_bound(list(result.ab.pair_margins)),
        "stored": row is not None,
        "not_stored": result.why_not_stored(),
        "margin_judged": judged.quality.tie_margin_nats,
        "tie_margin": source.describe(),
    }


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
    _, longest_pairs = window_bounds(config)
    screen = max(every, screen // every * every)
    state = SwitchState()
    history: list[Evaluation] = []
    evaluations = 0

    def evaluate(n: int) -> Evaluation:
        nonlocal evaluations
        window = latest_window(
            [*prefix[-(longest_pairs or len(prefix)) :], *stream.upto(n)], config
        )
        now = window[-1].started_at
        evaluations += 1
        decisions = evaluate_all(window, config, now=now, references=references, since=state.since)
        return Evaluation(now, tuple(decisions))

    live = config.liveness.window_pairs or longest_pairs or 10_000
    arl0 = detector_arl0(config)

    def live_failed(n: int) -> bool:
        window = [*prefix[-live:], *stream.upto(n)[-live:]][-live:]
        decision = liveness_gate(window, config.liveness, now=window[-1].started_at, arl0=arl0)
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


def minutes_on_schedule(pairs: int | None, faster: int | None) -> float | None:
    """Wall-clock minutes for `pairs` on the shipped schedule (`ScheduleConfig()`): one
    pair every `pair_interval_s` until the adaptive pace sped up (pair `faster`), then
    `max_pairs_per_minute`. None when the run did not trip within the cap."""
    if pairs is None:
        return None
    schedule = ScheduleConfig()
    slow = schedule.pair_interval_s
    rate = schedule.max_pairs_per_minute
    fast = min(interval_for(1, rate), slow) if rate else slow
    before = pairs if faster is None else min(pairs, faster)
    return round((before * slow + (pairs - before) * fast) / 60.0, 1)
