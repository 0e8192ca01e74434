"""The error gate does not blind itself: the shared-outage screen leaves out only clusters
whose failures split as a shared outage's do, a PASS never rests on pairs older than the
ones left out, and the ceiling is relative to the baseline's own failure rate, so equal
arms on flaky infrastructure never FAIL while an arm that takes the baseline down with
it still does."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from gates import GateState, error_gate
from gates.config import ErrorGateConfig
from gates.pairs.testing import at, record, result
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0

CALM = 0.01  # each arm's own failure rate before a fault
SCREEN_OFF = ErrorGateConfig(outage_spans=())


def pairs(baseline_failed: np.ndarray, speculative_failed: np.ndarray) -> list[PairRecord]:
    return [
        record(i, baseline=result(ok=not b), speculative=result(ok=not s))
        for i, (b, s) in enumerate(zip(baseline_failed, speculative_failed, strict=True))
    ]


def correlated_fault(seed: int, calm: int = 1500, faulty: int = 1500) -> list[PairRecord]:
    """`calm` pairs, then the speculative arm failing 10 % of its requests, each failure
    also failing the baseline on each of the next 3 pairs with probability 1/2 (a shared
    node or GPU the speculative arm takes down)."""
    rng = np.random.default_rng(seed)
    n = calm + faulty
    baseline = rng.random(n) < CALM
    speculative = np.concatenate([rng.random(calm) < CALM, rng.random(faulty) < 0.10])
    for i in np.flatnonzero(speculative[calm:]) + calm:
        for j in range(i + 1, min(i + 4, n)):
            baseline[j] |= rng.random() < 0.5
    return pairs(baseline, speculative)


def first_fail(records: list[PairRecord], config: ErrorGateConfig, start: int, every: int) -> int:
    """Pairs from `start` to the first evaluation (every `every` pairs) that FAILs."""
    for n in range(start + every, len(records) + 1, every):
        if error_gate(records[:n], config, now=at(n), arl0=DEFAULT_ARL0).state is GateState.FAIL:
            return n - start
    raise AssertionError(f"no FAIL in {len(records) - start} pairs")


class TestTheScreenSplitsClusters:
    def test_a_fault_that_fails_the_baseline_too_is_not_hidden(self) -> None:
        """The speculative arm's failures take the baseline's next requests down: the
        baseline now fails more than the speculative arm, in clusters that begin with a
        speculative failure. The clusters' failures, pooled, are led by the speculative
        arm, so once they say so the screen leaves none out: over 9 seeds the gate's median
        pairs to FAIL are within 1.5 times those with the screen off, and no seed takes
        2.5 times as many (before: 1,668–1,884 pairs against 282–486; the screen hid the
        fault until the window's own baseline rate caught up with it)."""
        screened, unscreened = [], []
        for seed in range(9):
            records = correlated_fault(seed)
            screened.append(first_fail(records, ErrorGateConfig(), 1500, every=30))
            unscreened.append(first_fail(records, SCREEN_OFF, 1500, every=30))
        assert statistics.median(screened) <= 1.5 * statistics.median(unscreened)
        assert all(s <= 2.5 * u for s, u in zip(screened, unscreened, strict=True))

    @pytest.mark.parametrize("seed", range(3))
    def test_a_dead_arm_beside_a_failing_baseline_fails_within_100_pairs(self, seed: int) -> None:
        """After 1,500 calm pairs the speculative arm dies and the baseline fails 70 % of
        its requests: one long cluster of baseline failures, in which only the speculative
        arm ever fails alone. That is no shared outage: the gate judges it and FAILs within
        100 pairs (before: the cluster was left out and the gate PASSed on the pairs
        before it for 1,700 pairs and more)."""
        rng = np.random.default_rng(seed)
        baseline = np.concatenate([rng.random(1500) < CALM, rng.random(300) < 0.7])
        speculative = np.concatenate([rng.random(1500) < CALM, np.ones(300, bool)])
        records = pairs(baseline, speculative)
        assert first_fail(records, ErrorGateConfig(), 1500, every=6) <= 100


def turns(calm: int, outage: int, after: int) -> list[PairRecord]:
    """`calm` clean pairs, then a shared outage of `outage` pairs in which the arms take
    turns to fail alone (the baseline, then the speculative arm, then neither: balanced,
    and neither arm's failures leading), then `after` clean pairs."""
    baseline = np.zeros(calm + outage + after, bool)
    speculative = np.zeros_like(baseline)
    baseline[calm : calm + outage : 3] = True
    speculative[calm + 1 : calm + outage : 3] = True
    return pairs(baseline, speculative)


class TestNoPassWhileBlind:
    def test_no_pass_while_recent_pairs_are_screened(self) -> None:
        """1,000 clean pairs, a 45-pair shared outage, 20 clean pairs: the outage and its
        margins, 63 of the newest 100 settled pairs, are left out, and the gate is
        INCONCLUSIVE rather than PASSing on the pairs before them (before: PASS); 200
        clean pairs later it PASSes again."""
        records = turns(1000, 45, 220)
        config = ErrorGateConfig()
        during = error_gate(records[:1065], config, now=at(1065), arl0=DEFAULT_ARL0)
        assert during.state is GateState.INCONCLUSIVE, during.detail
        assert "63% of the newest 100 settled pairs lie in shared outages" in during.detail
        assert "in shared outages" in during.components[0].detail
        after = error_gate(records, config, now=at(len(records)), arl0=DEFAULT_ARL0)
        assert after.state is GateState.PASS, after.detail

    def test_no_pass_on_stale_pairs(self) -> None:
        """1,000 clean pairs, then 80 pairs where both arms failed (the screen off, so
        that only the stale rule speaks): none of them says anything about the speculative
        arm, and the newest judged pair has 70 settled pairs after it — INCONCLUSIVE, not
        the PASS of the pairs before (before: PASS)."""
        failed = np.concatenate([np.zeros(1000, bool), np.ones(80, bool)])
        records = pairs(failed, failed)
        decision = error_gate(records, SCREEN_OFF, now=at(1080), arl0=DEFAULT_ARL0)
        assert decision.state is GateState.INCONCLUSIVE, decision.detail
        assert "the newest judged pair has 70 settled pairs after it" in decision.detail
        fresh = error_gate(records[:1040], SCREEN_OFF, now=at(1040), arl0=DEFAULT_ARL0)
        assert fresh.state is GateState.PASS, fresh.detail


class TestTheCeilingIsRelative:
    @pytest.mark.parametrize(("rate", "seed"), [(0.05, 11), (0.10, 12)])
    def test_equal_arms_on_flaky_infrastructure_never_fail(self, rate: float, seed: int) -> None:
        """Both arms failing independently on `rate` of 3,000 pairs, evaluated every 100:
        never a FAIL (before: the ceiling was an absolute 2 %, and equal healthy arms
        FAILed after 858–1,746 pairs at 5 %, 192–342 at 10 %); the ceiling's edge is the
        baseline's own rate, which the speculative arm's is within, so the ceiling PASSes
        at the end: a restore is possible."""
        rng = np.random.default_rng(seed)
        records = pairs(rng.random(3000) < rate, rng.random(3000) < rate)
        config = ErrorGateConfig()
        for n in range(100, 3001, 100):
            decision = error_gate(records[:n], config, now=at(n), arl0=DEFAULT_ARL0)
            assert decision.state is not GateState.FAIL, (n, decision.detail)
        ceiling = decision.components[1]
        assert ceiling.state is GateState.PASS, ceiling.detail
        assert ceiling.threshold is not None and ceiling.threshold > rate
