"""quality.distribution: the teacher-scored NLL difference of sampled pairs, tested
two-sided (a greedy-leaning arm is more likely than it should be, others less)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from gates import GateState, quality_gate
from gates.config import QualityGateConfig
from gates.core import GateDecision
from gates.pairs.testing import at, record, scores
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0

NAME = "quality.distribution"


def sampled(deltas: Sequence[float | None], temperature: float = 0.8) -> list[PairRecord]:
    return [
        record(i, pair_scores=replace(scores(delta=None), nll_delta=d), temperature=temperature)
        for i, d in enumerate(deltas)
    ]


def component(decision: GateDecision) -> GateDecision | None:
    return next((c for c in decision.components if c.name == NAME), None)


def evaluate(records: list[PairRecord], **config: float) -> GateDecision:
    return quality_gate(
        records, QualityGateConfig(**config), now=at(len(records)), arl0=DEFAULT_ARL0
    )


def noise(n: int, mean: float, sd: float, seed: int = 0) -> list[float | None]:
    rng = random.Random(seed)
    return [rng.gauss(mean, sd) for _ in range(n)]


class TestDistribution:
    def test_lossless_arm_passes(self) -> None:
        """Mean-zero differences with a tight interval: PASS within ±margin."""
        decision = component(evaluate(sampled(noise(400, 0.0, 0.3))))
        assert decision is not None and decision.state is GateState.PASS
        assert decision.threshold == QualityGateConfig().distribution_margin

    def test_identical_outputs_pass(self) -> None:
        """A healthy fake gives exactly zero every pair: the sd floor keeps it sane."""
        decision = component(evaluate(sampled([0.0] * 200)))
        assert decision is not None and decision.state is GateState.PASS

    def test_more_likely_arm_fails(self) -> None:
        """A greedy-leaning arm (negative delta) trips the lower CUSUM."""
        decision = component(evaluate(sampled(noise(200, -0.5, 0.4))))
        assert decision is not None and decision.state is GateState.FAIL
        assert decision.estimate is not None and decision.estimate < 0

    def test_less_likely_arm_fails(self) -> None:
        decision = component(evaluate(sampled(noise(200, 0.5, 0.4))))
        assert decision is not None and decision.state is GateState.FAIL

    def test_fails_the_quality_gate(self) -> None:
        decision = evaluate(sampled(noise(200, -0.5, 0.4)))
        assert decision.state is GateState.FAIL
        assert decision.detail.startswith(f"FAIL by {NAME}")

    def test_one_outlier_cannot_alarm_alone(self) -> None:
        """One huge outlier in a quiet window (it inflates the window's sd, and is clipped)
        does not FAIL the distribution check."""
        decision = component(evaluate(sampled([0.0] * 20 + [-50.0] + [0.0] * 20)))
        assert decision is not None and decision.state is not GateState.FAIL

    def test_left_out_without_scored_sampled_pairs(self) -> None:
        """No nll_delta (remote arms), or greedy pairs only: no component, a note."""
        for records in (sampled([None] * 50), sampled([0.1] * 50, temperature=0.0)):
            decision = evaluate(records)
            assert component(decision) is None
            assert "distribution: no sampled pair" in decision.detail


class TestNoContentCheck:
    def test_loops_alone_never_pass_quality(self) -> None:
        """Sampled pairs with no teacher score and no task check (live pairs, servers
        without a teacher): quality is INCONCLUSIVE however many pairs, never PASS."""
        from gates import GatesConfig, GateState
        from gates.pairs.quality import quality_gate
        from gates.pairs.testing import at, record, scores

        unjudged = scores(exact=False, delta=None)
        records = [record(i, temperature=0.7, pair_scores=unjudged) for i in range(600)]
        decision = quality_gate(records, GatesConfig().quality, now=at(599), arl0=DEFAULT_ARL0)
        assert decision.state is GateState.INCONCLUSIVE
        assert "no content check ran" in decision.detail
