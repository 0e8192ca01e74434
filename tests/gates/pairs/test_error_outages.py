"""The error gate and shared outages: a burst of errors on both arms (a gateway, a network,
a shared node) makes each arm fail alone too. Judged against the window-long baseline
rate, those pairs looked like a speculative fault and rolled a healthy deployment back
(benchmarks/gate_power, `deployment_bf16`: 9 false trips in 153,402 pairs before the
screen). The gate now leaves out the pairs around a cluster of baseline failures and
judges a pair once the pairs after it show whether an outage was starting."""

from __future__ import annotations

import numpy as np
import pytest

from gates import GateState, error_gate
from gates.config import ErrorGateConfig
from gates.pairs.error_rate import shared_outages
from gates.pairs.testing import at, record, result
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0

CALM = 0.012  # each arm's own failure rate outside an outage
BURST = 0.3  # each arm's failure rate inside one, independently of the other arm
# The gate before the screen: every pair judged at once against the window's rates (a
# failure right after the baseline's counts against the speculative arm too).
UNSCREENED = ErrorGateConfig(outage_spans=(), settle_pairs=0, lead_pairs=0)


def pairs(baseline_failed: np.ndarray, speculative_failed: np.ndarray) -> list[PairRecord]:
    return [
        record(i, baseline=result(ok=not b), speculative=result(ok=not s))
        for i, (b, s) in enumerate(zip(baseline_failed, speculative_failed, strict=True))
    ]


def with_burst(seed: int, calm: int, burst: int) -> list[PairRecord]:
    """`calm` pairs, then a burst of `burst` pairs, then 60 calm pairs."""
    rng = np.random.default_rng(seed)
    n = calm + burst + 60
    rate = np.full(n, CALM)
    rate[calm : calm + burst] = BURST
    return pairs(rng.random(n) < rate, rng.random(n) < rate)


def fails_anywhere(records: list[PairRecord], config: ErrorGateConfig, start: int) -> bool:
    """Whether the gate FAILs at any evaluation from pair `start` on, every 3 pairs (the
    daemon's 60 s cadence at 20 s a pair)."""
    return any(
        error_gate(records[:n], config, now=at(n), arl0=DEFAULT_ARL0).state is GateState.FAIL
        for n in range(start, len(records) + 1, 3)
    )


class TestSharedOutages:
    def test_a_cluster_is_left_out_with_its_margin(self) -> None:
        """3 baseline failures in 5 pairs at a calm rate of 1 % are a cluster (P ≈ 1e-5):
        the pairs from its first failure to its last and 10 on each side are left out,
        nothing else."""
        failed = [False] * 100
        for i in (50, 52, 54):
            failed[i] = True
        out = shared_outages(failed, 0.01, spans=(5, 10, 20, 40), alpha=0.01, margin=10)
        assert [i for i, x in enumerate(out) if x] == list(range(40, 65))

    def test_isolated_failures_are_not_a_cluster(self) -> None:
        """One failure per 30 pairs at a calm rate of 3 %: no span holds an improbable
        count, nothing is left out."""
        failed = [i % 30 == 0 for i in range(600)]
        out = shared_outages(failed, 0.03, spans=(5, 10, 20, 40), alpha=0.01, margin=10)
        assert not any(out)

    def test_a_calm_baseline_loses_few_pairs(self) -> None:
        """A baseline failing at random on 1.2 % of 5,000 pairs: under 5 % of them fall in
        a chance cluster (measured: 1.8 % on 50 such windows), so a fault on the
        speculative arm is judged on almost every pair."""
        rng = np.random.default_rng(5)
        failed = list(rng.random(5000) < CALM)
        out = shared_outages(failed, 0.016, spans=(5, 10, 20, 40), alpha=0.01, margin=10)
        assert 0 < sum(out) < 0.05 * len(out)

    def test_no_spans_no_screen(self) -> None:
        assert not any(shared_outages([True] * 50, 0.01, spans=(), alpha=0.01, margin=10))


class TestErrorBursts:
    @pytest.mark.parametrize("seed", range(2, 8))
    def test_a_burst_on_both_arms_never_fails(self, seed: int) -> None:
        """A 60-pair burst in which each arm fails 30 % of its requests on its own, after
        2,000 calm pairs: judged against the window's rate (no screen, every pair judged
        at once) the gate FAILs on every one of these seeds; with the defaults it never
        does, at any evaluation from the burst's start to 60 pairs after its end."""
        records = with_burst(seed, 2000, 60)
        assert fails_anywhere(records, UNSCREENED, 2000)
        assert not fails_anywhere(records, ErrorGateConfig(), 2000)

    def test_a_speculative_fault_is_still_caught_as_fast(self) -> None:
        """The speculative arm failing 6 % of its requests, the baseline 1.2 %: the screen
        costs the settle delay and the few pairs it leaves out, not the detection."""
        rng = np.random.default_rng(7)
        n = 3000
        records = pairs(rng.random(n) < CALM, rng.random(n) < 0.06)

        def first_fail(config: ErrorGateConfig) -> int:
            for k in range(100, n + 1, 10):
                if (
                    error_gate(records[:k], config, now=at(k), arl0=DEFAULT_ARL0).state
                    is GateState.FAIL
                ):
                    return k
            raise AssertionError("no FAIL")

        plain, screened = first_fail(UNSCREENED), first_fail(ErrorGateConfig())
        assert screened <= 1.1 * plain + ErrorGateConfig().settle_pairs, (plain, screened)

    def test_a_dead_arm_during_calm_fails_at_once(self) -> None:
        """The speculative arm dead after 1,000 calm pairs: FAIL within 6 judged pairs
        plus the settle delay, outages or not."""
        rng = np.random.default_rng(8)
        base = rng.random(1100) < CALM
        spec = np.concatenate([rng.random(1000) < CALM, np.ones(100, bool)])
        records = pairs(base, spec)
        config = ErrorGateConfig()
        first = next(
            k
            for k in range(1000, 1101)
            if error_gate(records[:k], config, now=at(k), arl0=DEFAULT_ARL0).state is GateState.FAIL
        )
        assert first <= 1000 + 6 + config.settle_pairs + 2
