"""Gross shifts decide in a handful of pairs (issue #27): the likelihood and task-score
checks carry a ladder of gross charts beside the chart at the tolerance, and the
implausible-token check counts the pairs where only the speculative output holds a token
the baseline model would all but never sample. None of them may alarm on one pair, or
on healthy heavy-tailed data."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from gates import GateState, quality_gate
from gates.config import QualityGateConfig
from gates.core import GateDecision
from gates.pairs.testing import at, record, scores
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0, DEFAULT_DETECTOR_BUDGET
from gates.stats.sequential import (
    GROSS_SEPARATION,
    cusum_bank,
    gross_charts,
    llr_cusum,
    sd_upper_bound,
    shift_ladder,
)


def sampled(deltas: list[float], **fields: float | bool | None) -> list[PairRecord]:
    return [
        record(
            i,
            pair_scores=replace(scores(exact=False, delta=None), nll_delta=d, **fields),  # type: ignore[arg-type]
            temperature=0.8,
        )
        for i, d in enumerate(deltas)
    ]


def state(records: list[PairRecord], name: str) -> GateState | None:
    decision = quality_gate(records, QualityGateConfig(), now=at(len(records)), arl0=DEFAULT_ARL0)
    part = next((c for c in decision.components if c.name == name), None)
    return None if part is None else part.state


def pairs_to_fail(values: list[float], name: str, build=sampled) -> int | None:  # type: ignore[no-untyped-def]
    """The first prefix of `values` whose window FAILs `name` (None: never)."""
    for n in range(1, len(values) + 1):
        if state(build(values[:n]), name) is GateState.FAIL:
            return n
    return None


class TestLadder:
    def test_shifts_grow_fourfold_up_to_the_largest(self) -> None:
        assert shift_ladder(0.1, 8.0) == pytest.approx([0.1, 0.4, 1.6, 6.4])
        assert shift_ladder(0.5, 0.1) == [0.5]
        with pytest.raises(ValueError, match="positive"):
            shift_ladder(0.0, 1.0)

    def test_the_sd_bound_is_above_the_estimate_and_unknown_for_one_value(self) -> None:
        values = [0.1, 0.3, -0.2, 0.4, 0.0]
        mean = sum(values) / 5
        sample_sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 4)
        assert sd_upper_bound(values, 0.95) > sample_sd
        assert sd_upper_bound([1.0], 0.95) == math.inf
        assert sd_upper_bound([-1.0, -1.0], 0.95) == math.inf  # two lost checks

    def test_a_gross_chart_caps_the_evidence_of_one_pair(self) -> None:
        """Scale ≥ shift / GROSS_SEPARATION: one pair, however wild, earns at most
        R²/2 + 3R (R = GROSS_SEPARATION)."""
        (chart,) = gross_charts([1e6], 0.0, [6.4], sigma=0.01)
        cap = GROSS_SEPARATION**2 / 2 + 3 * GROSS_SEPARATION
        assert chart[0] == pytest.approx(cap)
        assert llr_cusum(chart, 20.0).alarm_index is None

    def test_the_bank_pays_log_of_its_size(self) -> None:
        _, _, h = cusum_bank([[0.0], [0.0], [0.0], [0.0]], 10.0)
        assert h == pytest.approx(10.0 + math.log(4))


class TestLikelihood:
    NAME = "quality.distribution"

    def test_garbage_decides_in_a_handful_of_pairs(self) -> None:
        """+4 nats (sd 0.8), as the real vLLM arm at temperature 0.8 measured: the chart at
        the 0.1-nat margin alone took 58+ pairs; the bank decides within ten."""
        rng = random.Random(3)
        values = [rng.gauss(4.0, 0.8) for _ in range(60)]
        n = pairs_to_fail(values, self.NAME)
        assert n is not None and n <= 10

    def test_one_wild_pair_cannot_alarm(self) -> None:
        for first in (50.0, 8.0, -50.0):
            assert state(sampled([first]), self.NAME) is not GateState.FAIL
            assert state(sampled([first, 0.0]), self.NAME) is not GateState.FAIL

    def test_heavy_tailed_healthy_deltas_never_fail(self) -> None:
        """Student-t (3 degrees of freedom, sd 0.5), symmetric about zero: 1,500 pairs
        never FAIL, evaluated after every pair of the first 60 and every 25 after."""
        rng = random.Random(11)
        scale = 0.5 / math.sqrt(3.0)
        values = [
            scale * rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)
            for _ in range(1500)
        ]
        checkpoints = list(range(1, 61)) + list(range(75, 1501, 25))
        for n in checkpoints:
            assert state(sampled(values[:n]), self.NAME) is not GateState.FAIL, n


class TestScore:
    NAME = "quality.score"

    @staticmethod
    def scored(deltas: list[float]) -> list[PairRecord]:
        return [
            record(i, pair_scores=scores(exact=False, delta=d), temperature=0.8)
            for i, d in enumerate(deltas)
        ]

    def test_every_check_lost_decides_in_a_handful_of_pairs(self) -> None:
        """Garbage loses most task checks: 80 % of pairs −1, the rest 0."""
        rng = random.Random(5)
        values = [-1.0 if rng.random() < 0.8 else 0.0 for _ in range(60)]
        n = pairs_to_fail(values, self.NAME, self.scored)
        assert n is not None and n <= 12

    def test_rare_lost_checks_do_not_alarm(self) -> None:
        """2 % of pairs −1 and 2 % +1 over 1,000 pairs: never FAIL."""
        rng = random.Random(9)
        values = [
            -1.0 if (u := rng.random()) < 0.02 else 1.0 if u > 0.98 else 0.0 for _ in range(1000)
        ]
        for n in [*range(1, 40), *range(50, 1001, 50)]:
            assert state(self.scored(values[:n]), self.NAME) is not GateState.FAIL, n


class TestImplausible:
    NAME = "quality.implausible"

    @staticmethod
    def pairs(spec: list[float], base: list[float] | None = None) -> list[PairRecord]:
        base = base or [3.0] * len(spec)
        return [
            record(
                i,
                pair_scores=replace(
                    scores(exact=False, delta=None),
                    nll_delta=0.0,
                    speculative_max_nll=s,
                    baseline_max_nll=b,
                ),
                temperature=0.8,
            )
            for i, (s, b) in enumerate(zip(spec, base, strict=True))
        ]

    def decision(self, records: list[PairRecord]) -> GateDecision:
        decision = quality_gate(
            records, QualityGateConfig(), now=at(len(records)), arl0=DEFAULT_ARL0
        )
        return next(c for c in decision.components if c.name == self.NAME)

    def test_garbage_in_every_pair_decides_in_six(self) -> None:
        n = pairs_to_fail([15.0] * 20, self.NAME, lambda v: self.pairs(v))
        assert n is not None and n <= 6

    def test_garbage_in_most_pairs_decides_within_ten(self) -> None:
        """In four pairs of five: 7 pairs here. Half the pairs takes 14 (an oracle
        tuned to exactly one half needs h / KL(0.5 ‖ 0.01) ≈ 13)."""
        values = [4.0 if i % 5 == 4 else 15.0 for i in range(30)]
        n = pairs_to_fail(values, self.NAME, lambda v: self.pairs(v))
        assert n is not None and n <= 10
        values = [15.0 if i % 2 else 4.0 for i in range(40)]
        n = pairs_to_fail(values, self.NAME, lambda v: self.pairs(v))
        assert n is not None and n <= 16

    def test_implausible_on_both_arms_counts_against_neither(self) -> None:
        """A prompt that makes the model itself write rare tokens (both arms) is not
        the speculative arm's fault."""
        records = self.pairs([15.0] * 200, [14.0] * 200)
        assert self.decision(records).state is GateState.PASS

    def test_a_baseline_that_writes_rare_tokens_raises_the_edge(self) -> None:
        """5 % baseline-only and 5 % speculative-only: the arms are alike, no FAIL."""
        spec = [15.0 if i % 20 == 0 else 3.0 for i in range(400)]
        base = [15.0 if i % 20 == 10 else 3.0 for i in range(400)]
        assert self.decision(self.pairs(spec, base)).state is not GateState.FAIL

    def test_one_implausible_pair_does_not_alarm(self) -> None:
        assert self.decision(self.pairs([15.0] + [3.0] * 50)).state is not GateState.FAIL

    def test_identical_outputs_count_as_plausible(self) -> None:
        records = [
            record(i, pair_scores=replace(scores(exact=True), nll_delta=0.0), temperature=0.8)
            for i in range(200)
        ]
        assert self.decision(records).state is GateState.PASS

    def test_left_out_without_token_nlls(self) -> None:
        """Pairs stored before max_nll existed, or teachers without it: a note."""
        decision = quality_gate(
            sampled([0.0] * 50), QualityGateConfig(), now=at(50), arl0=DEFAULT_ARL0
        )
        assert all(c.name != self.NAME for c in decision.components)
        assert "implausible: no sampled pair" in decision.detail

    def test_a_model_that_itself_writes_rare_tokens_does_not_alarm(self) -> None:
        """Both arms draw an implausible token in 5 % of outputs, independently (a
        lossless arm on a long or hot deployment): 20 runs of 300 pairs, evaluated after
        every pair of the first 40 and every 20 after, never FAIL. (The check assumes a
        rate of a few percent at most: at 20 % an early run of speculative-only pairs
        before the baseline shows any can alarm — raise implausible_nll_nats there.)"""
        for seed in range(20):
            rng = random.Random(seed)
            spec = [15.0 if rng.random() < 0.05 else 3.0 for _ in range(300)]
            base = [15.0 if rng.random() < 0.05 else 3.0 for _ in range(300)]
            for n in [*range(1, 40), *range(40, 301, 20)]:
                decision = self.decision(self.pairs(spec[:n], base[:n]))
                assert decision.state is not GateState.FAIL, (seed, n, decision.detail)


class TestLatencyMedian:
    """The latency median chart had no floor relative to its shift: one cold first
    request (TTFT 7.8×, e2e 1.4× on a freshly started vLLM n-gram server) FAILed the
    gate on its own, at pair 1 of a window, and rolled speculation back."""

    @staticmethod
    def timed(ratios: list[float]) -> list[PairRecord]:
        from gates.pairs.testing import result

        return [
            record(
                i,
                baseline=result(1.0, ttft=0.1),
                speculative=result(1.0 * r, ttft=0.1 * r),
            )
            for i, r in enumerate(ratios)
        ]

    def state(self, ratios: list[float]) -> GateState:
        from gates import latency_gate
        from gates.config import LatencyGateConfig

        return latency_gate(
            self.timed(ratios),
            LatencyGateConfig(),
            now=at(len(ratios)),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        ).state

    def test_one_cold_first_request_does_not_fail(self) -> None:
        for ratio in (1.4, 7.8, 100.0):
            assert self.state([ratio]) is not GateState.FAIL
            assert self.state([ratio, 1.0, 1.0]) is not GateState.FAIL

    def test_a_slow_arm_still_fails_within_31_pairs(self) -> None:
        """Every request 3× slower: FAIL at the 31st pair — a sign vote is worth at most
        log(2 × 0.9) nats against h + log 2 ≈ 18.2, so no fewer pairs can decide — and
        WARN from the 16th."""
        assert self.state([3.0] * 31) is GateState.FAIL
        assert self.state([3.0] * 30) is GateState.WARN
        assert self.state([3.0] * 16) is GateState.WARN
