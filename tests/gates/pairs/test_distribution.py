"""quality.argmax: the paired sign-flip test on teacher-argmax excesses of sampled pairs,
and how the distribution checks share their budget."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from gates import GateState, quality_gate
from gates.config import QualityGateConfig
from gates.core import GateDecision
from gates.pairs.distribution import (
    ONE_SIDED_CUSUMS,
    joint_scores,
    shiryaev_roberts,
    sign_flip_increments,
)
from gates.pairs.testing import at, record, scores
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0
from gates.stats.sequential import llr_cusum

NAME = "quality.argmax"


def sampled(
    deltas: Sequence[float | None], temperature: float = 0.8, nll: float | None = None
) -> list[PairRecord]:
    return [
        record(
            i,
            pair_scores=replace(scores(delta=None), argmax_delta=d, nll_delta=nll),
            temperature=temperature,
        )
        for i, d in enumerate(deltas)
    ]


def component(decision: GateDecision, name: str = NAME) -> GateDecision | None:
    return next((c for c in decision.components if c.name == name), None)


def evaluate(records: list[PairRecord]) -> GateDecision:
    return quality_gate(records, QualityGateConfig(), now=at(len(records)), arl0=DEFAULT_ARL0)


def signs(n: int, share_more: float, tie_share: float = 0.0, seed: int = 0) -> list[float | None]:
    """Argmax-excess deltas: a tie with `tie_share`, else positive with `share_more`,
    sizes uniform in 0.01 … 0.3 on both sides."""
    rng = random.Random(seed)
    out: list[float | None] = []
    for _ in range(n):
        if rng.random() < tie_share:
            out.append(0.0)
        else:
            size = rng.uniform(0.01, 0.3)
            out.append(size if rng.random() < share_more else -size)
    return out


def first_fail(deltas: list[float | None]) -> int | None:
    """The pair count at which quality.argmax first FAILs, evaluating after every pair."""
    records = sampled(deltas)
    for n in range(1, len(records) + 1):
        decision = component(evaluate(records[:n]))
        if decision is not None and decision.state is GateState.FAIL:
            return n
    return None


class TestArgmaxSignFlipTest:
    def test_exchangeable_arms_pass(self) -> None:
        """Fair coin signs with ties: PASS, the net share near zero."""
        decision = component(evaluate(sampled(signs(400, 0.5, tie_share=0.2))))
        assert decision is not None and decision.state is GateState.PASS
        assert decision.estimate is not None and abs(decision.estimate) < 0.1

    def test_identical_outputs_pass(self) -> None:
        """A healthy arm whose outputs equal the baseline's: every pair a tie, PASS."""
        decision = component(evaluate(sampled([0.0] * 100)))
        assert decision is not None and decision.state is GateState.PASS
        assert "0/0 untied pairs (100 ties)" in decision.detail

    def test_argmax_heavy_arm_fails(self) -> None:
        """Speculative argmax excess larger in 95 % of pairs (a greedy-verifying arm) FAILs
        within about fifty pairs."""
        pairs = first_fail(signs(120, 0.95))
        assert pairs is not None and pairs <= 60
        assert "more argmax: Shiryaev-Roberts" in evaluate(sampled(signs(120, 0.95))).detail

    def test_a_subtle_bias_fails_later(self) -> None:
        """Larger in 75 % of pairs: still caught, later."""
        gross, subtle = first_fail(signs(400, 0.95)), first_fail(signs(400, 0.75))
        assert gross is not None and subtle is not None and gross < subtle

    def test_winning_big_and_losing_small_fails_sooner(self) -> None:
        """Bets are staked by size: an arm that wins its pairs by large margins and loses
        them by small ones (what greedy verification does) is caught sooner than the
        same signs with sizes unrelated to them."""
        plain = signs(300, 0.8, seed=5)
        lopsided = [None if d is None else (0.3 if d > 0 else -0.02) for d in plain]
        by_size, by_sign = first_fail(lopsided), first_fail(plain)
        assert by_size is not None and by_sign is not None and by_size < by_sign

    def test_argmax_light_arm_fails(self) -> None:
        """Two-sided: an arm whose outputs hold fewer argmax tokens FAILs too."""
        decision = component(evaluate(sampled(signs(200, 0.05))))
        assert decision is not None and decision.state is GateState.FAIL
        assert decision.estimate is not None and decision.estimate < 0

    def test_the_scale_does_not_matter(self) -> None:
        """Only sizes relative to the median size count: scaling every delta by 100
        changes nothing, and one huge delta stakes no more than a typical one."""
        deltas = signs(150, 0.6, tie_share=0.1, seed=3)
        scaled = [None if d is None else 100.0 * d for d in deltas]
        a, b = component(evaluate(sampled(deltas))), component(evaluate(sampled(scaled)))
        assert a is not None and b is not None
        assert (a.state, a.estimate) == (b.state, b.estimate)
        assert a.detail.split("more argmax:")[1] == b.detail.split("more argmax:")[1]

    def test_a_fair_coin_keeps_its_false_alarm_budget(self) -> None:
        """Under exchangeable arms (symmetric deltas) each sign-flip CUSUM's run length
        is at least e^h whatever the sizes. At a test-sized budget (h = log 50 for each
        of the 4 CUSUMs) 1,000 symmetric pairs, the detector restarted after each alarm,
        raise at most 1,000 × 4 / 50 alarms."""
        deltas = signs(1000, 0.5, tie_share=0.2, seed=11)
        arl0 = 50.0 / ONE_SIDED_CUSUMS
        alarms, current = 0, []
        for d in deltas:
            current.append(d)
            decision = component(
                quality_gate(sampled(current), QualityGateConfig(), now=at(len(current)), arl0=arl0)
            )
            if decision is not None and decision.state is GateState.FAIL:
                alarms, current = alarms + 1, []
        assert alarms <= 1000 * 4 / 50

    def test_greedy_pairs_and_unscored_pairs_are_left_out(self) -> None:
        """No argmax_delta (a teacher that cannot score), or greedy pairs only: no
        component, a note."""
        for records in (sampled([None] * 50), sampled([0.1] * 50, temperature=0.0)):
            decision = evaluate(records)
            assert component(decision) is None
            assert "argmax: no sampled pair" in decision.detail


class TestSignFlipIncrements:
    def test_a_fair_coin_has_mean_one_wealth(self) -> None:
        """Given the sizes, flipping every sign averages e^increment to exactly 1: the
        bets are fair under exchangeable arms."""
        deltas = [0.3, -0.1, 0.0, 0.2, -0.05, 0.4]
        flipped = [-d for d in deltas]
        for bet in (0.5, 0.9):
            for up, down in zip(
                sign_flip_increments(deltas, bet), sign_flip_increments(flipped, bet), strict=True
            ):
                assert (math.exp(up) + math.exp(down)) / 2 == pytest.approx(1.0)

    def test_stakes_follow_the_median_size_before(self) -> None:
        """The first untied pair stakes fully; later ones by size over the median size of
        the untied pairs before them (capped at 1); ties stake nothing."""
        increments = sign_flip_increments([0.2, 0.0, 0.1, -0.4], 0.5)
        assert increments == pytest.approx(
            [math.log(1.5), 0.0, math.log(1 + 0.5 * 0.1 / 0.2), math.log(1 - 0.5)]
        )

    def test_a_full_bet_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"need \|bet\| < 1, got 1.0"):
            sign_flip_increments([0.1], 1.0)


def joint(pairs: Sequence[tuple[float, float | None]]) -> list[PairRecord]:
    return [
        record(
            i,
            pair_scores=replace(scores(delta=None), argmax_delta=a, nll_delta=n),
            temperature=0.8,
        )
        for i, (a, n) in enumerate(pairs)
    ]


def first_fail_of(records: list[PairRecord]) -> int | None:
    for n in range(1, len(records) + 1):
        decision = component(evaluate(records[:n]))
        if decision is not None and decision.state is GateState.FAIL:
            return n
    return None


class TestJointScores:
    def test_exchanging_the_outputs_flips_the_score(self) -> None:
        """Flipping a pair's argmax and NLL deltas together flips its score and leaves
        the later scores' units alone: symmetric under exchangeable arms."""
        argmax = [0.2, -0.1, 0.0, 0.3, -0.05]
        nll = [-0.5, 0.4, 0.0, None, 1.0]
        base = joint_scores(argmax, nll)
        for i in range(len(argmax)):
            a, n = list(argmax), list(nll)
            a[i] = -a[i]
            n[i] = None if n[i] is None else -n[i]  # type: ignore[operator]
            flipped = joint_scores(a, n)
            assert flipped[i] == pytest.approx(-base[i])
            assert flipped[:i] + flipped[i + 1 :] == pytest.approx(base[:i] + base[i + 1 :])

    def test_units_of_the_median_size_before(self) -> None:
        """Each delta over the median size of its nonzero deltas before it (its own size
        first); an unscored NLL counts 0; a fifth of the NLL delta, likelier counting up."""
        score = joint_scores([0.2, 0.1, 0.0], [-0.5, None, 1.0])
        assert score == pytest.approx([1.0 + 0.2, 0.1 / 0.2, -0.2 * 1.0 / 0.5])

    def test_an_argmax_heavy_arm_that_is_also_likelier_fails_sooner(self) -> None:
        """Greedy-leaning arms are argmax-heavier and likelier at once: the same argmax
        deltas decide sooner when the NLL delta agrees than with no NLL scored."""
        argmax = [d or 0.0 for d in signs(300, 0.75, seed=2)]
        rng = random.Random(4)
        agreeing = [
            (a, -abs(rng.gauss(0.3, 0.5)) if a > 0 else rng.gauss(0.0, 0.5)) for a in argmax
        ]
        alone, helped = (
            first_fail_of(joint([(a, None) for a in argmax])),
            first_fail_of(joint(agreeing)),
        )
        assert alone is not None and helped is not None and helped < alone

    def test_a_fair_coin_on_both_deltas_keeps_its_budget(self) -> None:
        """Correlated argmax and NLL deltas whose pairs flip together at random: at a
        test-sized budget (h = log 50 per one-sided detector) 600 pairs raise at most
        600 × 4 / 50 alarms."""
        rng = random.Random(13)
        pairs = []
        for _ in range(600):
            a = rng.uniform(0.01, 0.3)
            n = -2.0 * a + rng.gauss(0.0, 0.3)
            flip = 1.0 if rng.random() < 0.5 else -1.0
            pairs.append((flip * a, flip * n))
        arl0 = 50.0 / ONE_SIDED_CUSUMS
        alarms, current = 0, []
        for pair in pairs:
            current.append(pair)
            decision = component(
                quality_gate(joint(current), QualityGateConfig(), now=at(len(current)), arl0=arl0)
            )
            if decision is not None and decision.state is GateState.FAIL:
                alarms, current = alarms + 1, []
        assert alarms <= 600 * 4 / 50


class TestShiryaevRoberts:
    def test_the_recursion(self) -> None:
        """R_n = (1 + R_(n-1)) e^increment from R_0 = 0, shown as log R floored at 0."""
        increments = [math.log(2.0), math.log(0.5), math.log(3.0)]
        r1 = 2.0
        r2 = (1 + r1) * 0.5
        r3 = (1 + r2) * 3.0
        detector = shiryaev_roberts(increments, h=math.log(r3) - 0.01)
        assert detector.statistic == pytest.approx(math.log(r3))
        assert detector.peak == pytest.approx(math.log(r3))
        assert (detector.alarm_index, detector.observations) == (2, 3)

    def test_never_behind_the_cusum(self) -> None:
        """The CUSUM is the largest term of the Shiryaev-Roberts sum: on any increments
        the statistic is at least the CUSUM's, and it alarms no later at the same h."""
        rng = random.Random(7)
        for _ in range(50):
            increments = [rng.gauss(0.1, 1.0) for _ in range(60)]
            sr, cusum = shiryaev_roberts(increments, 8.0), llr_cusum(increments, 8.0)
            assert sr.statistic >= cusum.statistic - 1e-12 and sr.peak >= cusum.peak - 1e-12
            if cusum.alarm_index is not None:
                assert sr.alarm_index is not None and sr.alarm_index <= cusum.alarm_index

    def test_a_long_run_of_gains_does_not_overflow(self) -> None:
        """Wealth 1.9 per step: R_n = 1.9 + … + 1.9^n = 1.9 (1.9^n − 1) / 0.9, past e^700
        long before the end; it alarms a step before the CUSUM (31 steps to h = 20)."""
        detector = shiryaev_roberts([math.log(1.9)] * 2000, h=20.0)
        assert detector.statistic == pytest.approx(2000 * math.log(1.9) + math.log(1.9 / 0.9))
        assert detector.alarm_index == 29  # the 30th step
        assert llr_cusum([math.log(1.9)] * 2000, h=20.0).alarm_index == 31
        assert detector.change_index == 0

    def test_a_falling_run_floors_at_zero(self) -> None:
        detector = shiryaev_roberts([math.log(0.1)] * 10, h=5.0)
        assert (detector.statistic, detector.peak, detector.alarm_index) == (0.0, 0.0, None)


class TestBudget:
    def test_six_one_sided_cusums_share_the_distribution_detector(self) -> None:
        """Likelihood (2) and argmax (2 directions × 2 bets) each at h =
        log(6 × ARL0), shown in both components' details; each likelihood side is a
        bank of its chart at the margin and three gross charts (0.4, 1.6, 6.4 nats),
        so its charts run at h + log 4."""
        decision = evaluate(sampled(signs(50, 0.5), nll=0.0))
        h = math.log(ONE_SIDED_CUSUMS * DEFAULT_ARL0)
        argmax = component(decision, NAME)
        assert argmax is not None and f"vs h {h:.2f}" in argmax.detail
        likelihood = component(decision, "quality.distribution")
        assert likelihood is not None
        assert f"vs h {h + math.log(4):.2f}" in likelihood.detail
