"""The noise models the benchmark simulates: the seeded fake-engine arms of `realistic`
and `embedded_fit` (acceptance rates fitted to the embedded model's measured speedups,
`fit.fit_embedded` redoes the fit) and `deployment_bf16`, the realistic arms on a bf16
GPU deployment (`DeploymentNoise`: diurnal load and shared queueing, error bursts,
timeouts and numeric-tie divergence, applied pair by pair by `Deployed`;
`deployment_deterministic`: the same without numeric ties), `flaky_infra`
(equal arms each failing 10 % on their own) and `duplicated_pairs` (two daemons replaying
the same seeds into one store); and `Collateral`, a speculative arm whose failures take
the baseline's next requests down (`Collateralised`); `healthy_stalls`, the embedded
arms run in rollout-burst cycles with shared one-arm stalls (`BurstStalls`, applied by
`Stalled`). Simulated time starts at `T0`, one
pair every `DESIGN_SPACING_S` seconds unless a caller says otherwise.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from canaryd.pairs.runner import PairParams
from engine.config import FakeEngineConfig
from engine.types import ErrorKind, GenerationResult
from gates import GatesConfig
from gates.records import PairRecord, PairScores

T0 = datetime(2025, 1, 1, tzinfo=UTC)
DESIGN_SPACING_S = 10.0


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
    (`NoiseModel.sampled_share`), each arm with its own seed.

    `runner_up_below` > 0 is a verify bug (scenario `runner_up_bug`): a kernel that takes
    the runner-up token wherever the top-2 gap is under that many nats. On the embedded
    model `close_share` (16.2 %) of greedy positions have a gap under 0.5 nats, taken as
    uniform below it; every greedy output position rolls for it, and a pair that took
    any runner-up diverges with the largest such gap as its margin (every token judged:
    each one within the tie margin)."""

    diurnal: float = 0.4
    queue_s: float = 0.05
    burst_rate: float = 1.0 / 5_000
    burst_pairs: float = 30.0
    burst_failure: float = 0.3
    timeout_rate: float = 0.002
    tie_rate: float = 0.03
    tie_margin_nats: float = 0.1
    runner_up_below: float = 0.0
    close_share: float = 0.162  # greedy positions with a top-2 gap under CLOSE_GAP nats


class Deployed:
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
        if scores is not None and noise.runner_up_below > 0.0 and record.temperature <= 0.0:
            scores = self._runner_up(scores, max(1, record.speculative.output_tokens))
        return replace(record, baseline=arms[0], speculative=arms[1], scores=scores)

    def _runner_up(self, scores: PairScores, tokens: int) -> PairScores:
        noise, rng = self.noise, self.rng
        below = min(noise.runner_up_below, CLOSE_GAP)
        chance = noise.close_share * below / CLOSE_GAP
        taken = [(k, rng.uniform(0.0, below)) for k in range(tokens) if rng.random() < chance]
        if not taken:
            return scores
        return replace(
            scores,
            exact_match=False,
            first_divergence=taken[0][0],
            divergence_margin=max(gap for _, gap in taken),
            divergence_judge="forced",
        )


CLOSE_GAP = 0.5  # nats: the gap `DeploymentNoise.close_share` was measured below


@dataclass(frozen=True)
class Collateral:
    """A speculative arm that takes a shared node or GPU down: each of its failures also
    fails the baseline on each of the next `pairs` pairs with probability `probability`."""

    pairs: int = 3
    probability: float = 0.5


class Collateralised:
    """A `Collateral` applied pair by pair with its own seeded generator."""

    def __init__(self, collateral: Collateral, seed: int) -> None:
        self.collateral = collateral
        self.rng = random.Random(seed * 7_727 + 31)
        self.ahead = [False] * collateral.pairs  # the baseline fails on the next pairs

    def apply(self, record: PairRecord) -> PairRecord:
        doomed = self.ahead.pop(0) if self.ahead else False
        if self.collateral.pairs:
            self.ahead.append(False)
        baseline = record.baseline
        if doomed and baseline.ok:
            failed = GenerationResult.failed(
                ErrorKind.HTTP, "collateral", baseline.e2e_s, baseline.prompt_tokens
            )
            record = replace(record, baseline=failed, scores=None)
        if not record.speculative.ok:
            for k in range(len(self.ahead)):
                self.ahead[k] = self.ahead[k] or self.rng.random() < self.collateral.probability
        return record


@dataclass(frozen=True)
class BurstStalls:
    """Pairs run as a rollout burst runs them, `concurrency` at once per cycle (each cycle
    once the one before has ended), and host stalls (a GC pause, a preemption, a
    neighbour's batch) that hit whatever runs at the time: a share `rate` of the cycles
    is stalled, one arm slowed by a factor uniform in [`low`, `high`] (its e2e, TTFT,
    TPOT and inter-token gaps), the same arm in every pair of the cycle — the pessimistic
    case, in which one stall moves all of a cycle's ratios the same way."""

    concurrency: int = 4
    rate: float = 0.02
    low: float = 3.0
    high: float = 20.0


class Stalled:
    """A `BurstStalls` applied pair by pair with its own seeded generator: the stall, if
    any, is drawn at each cycle's first pair."""

    def __init__(self, stalls: BurstStalls, seed: int) -> None:
        self.stalls = stalls
        self.rng = random.Random(seed * 3_571 + 101)
        self.arm: str | None = None  # the arm stalled in the current cycle
        self.factor = 1.0

    @staticmethod
    def _slowed(result: GenerationResult, factor: float) -> GenerationResult:
        if not result.ok:
            return result
        itl = result.itl
        if itl is not None:
            itl = replace(
                itl,
                p50_s=itl.p50_s * factor,
                p95_s=itl.p95_s * factor,
                p99_s=itl.p99_s * factor,
                max_s=itl.max_s * factor,
                arrivals=(),
            )
        return replace(
            result,
            e2e_s=result.e2e_s * factor,
            ttft_s=None if result.ttft_s is None else result.ttft_s * factor,
            tpot_s=None if result.tpot_s is None else result.tpot_s * factor,
            itl=itl,
        )

    def apply(self, record: PairRecord, slot: int) -> PairRecord:
        stalls, rng = self.stalls, self.rng
        if slot == 0:
            self.arm = None
            if rng.random() < stalls.rate:
                self.arm = "baseline" if rng.random() < 0.5 else "speculative"
                self.factor = rng.uniform(stalls.low, stalls.high)
        if self.arm == "baseline":
            return replace(record, baseline=self._slowed(record.baseline, self.factor))
        if self.arm == "speculative":
            return replace(record, speculative=self._slowed(record.speculative, self.factor))
        return record


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
    collateral: Collateral | None = None
    # How many daemons replay the same (prompt, seed) sequence into one store: each pair
    # appears this many times, from runs of their own, spread over the pair's interval.
    replicas: int = 1
    # Pairs run in rollout-burst cycles with shared host stalls; None: one at a time.
    stalls: BurstStalls | None = None

    def with_speculative(self, **update: Any) -> NoiseModel:
        return replace(self, speculative=self.speculative.model_copy(update=update))

    def with_baseline(self, **update: Any) -> NoiseModel:
        return replace(self, baseline=self.baseline.model_copy(update=update))


def realistic() -> NoiseModel:
    arm = FakeEngineConfig(latency_sigma=0.5, tail_rate=0.02, tail_factor=5.0, error_rate=0.01)
    return NoiseModel(
        "realistic", arm, arm.model_copy(update={"speculative": True, "acceptance_sd": 0.15})
    )


def flaky_infra(rate: float = 0.10) -> NoiseModel:
    """The realistic arms on flaky infrastructure: each arm failing on its own `rate` of
    its requests, independently of the other (equal and healthy: nothing to roll back)."""
    model = realistic()
    return replace(
        model.with_baseline(error_rate=rate).with_speculative(error_rate=rate),
        name=f"flaky_infra_{rate * 100:g}pct",
    )


def duplicated_pairs() -> NoiseModel:
    """The realistic arms measured by two daemons that replay the same (prompt, seed)
    sequence into one store: every pair appears twice, from two runs."""
    return replace(realistic(), name="duplicated_pairs", replicas=2)


def healthy_stalls() -> NoiseModel:
    """The embedded model's arms (the tightest paired ratios of the healthy models) run
    in rollout-burst cycles of 4 concurrent pairs, 2 % of the cycles stalled 3–20× on
    one arm of all 4 pairs (`BurstStalls`): nothing to roll back."""
    return replace(embedded_fit(), name="healthy_stalls", stalls=BurstStalls())


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


def deployment_deterministic() -> NoiseModel:
    """`deployment_bf16` on kernels that reproduce their own greedy output bit for bit
    (no numeric-tie divergence, `tie_rate` 0): the baseline run twice never diverges, so
    an A/A calibration has nothing to bound. The base of `calibrated_runner_up_bug`."""
    model = deployment_bf16()
    assert model.deployment is not None
    return replace(
        model, name="deployment_deterministic", deployment=replace(model.deployment, tie_rate=0.0)
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
