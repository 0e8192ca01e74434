"""The latency gate under isolated stalls: a host hiccup that hits one arm of a pair, and
in a rollout burst the `rollout.concurrency` pairs of one cycle at once. A healthy arm
must never FAIL for a minority of stalled pairs; a real slowdown must still FAIL.
Seeded draws: the same values every run."""

from __future__ import annotations

import math
import random
from datetime import timedelta

from gates import GateDecision, GateState, latency_gate
from gates.config import LatencyGateConfig
from gates.pairs.testing import T0, record, result
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0, DEFAULT_DETECTOR_BUDGET
from gates.window import concurrent_groups

CONCURRENCY = 4  # rollout.concurrency's default: pairs started at once in a burst cycle
SPACING = timedelta(seconds=10)  # the schedule's pair interval
SETTLE = timedelta(milliseconds=100)  # storing a cycle's pairs before the next starts


def timed_pairs(
    ratios: list[float],
    *,
    seed: int,
    burst: bool,
    base_e2e: float = 6.0,
    spread: float = 0.01,
) -> list[PairRecord]:
    """Pairs whose speculative e2e and TTFT are `ratios[i]` × the baseline's (tight arms:
    each arm's own noise `spread`, a log-normal sd), started as the daemon starts them:
    on the schedule one every 10 s, or once the pair before has ended; in a burst, cycles
    of `CONCURRENCY` pairs started together (a few milliseconds apart), each cycle once
    the one before has ended."""
    rng = random.Random(seed)
    timings = []
    for ratio in ratios:
        base = base_e2e * math.exp(rng.gauss(0.0, spread))
        timings.append((base, base * ratio * math.exp(rng.gauss(0.0, spread))))
    out: list[PairRecord] = []
    ended = T0
    for i, (base, spec) in enumerate(timings):
        slot = i % CONCURRENCY if burst else 0
        if slot == 0:
            cycle_start = max(ended + SETTLE, T0 + i * SPACING) if i else T0
        started = cycle_start + slot * timedelta(milliseconds=3)
        ended = max(ended, started + timedelta(seconds=base + spec))
        out.append(
            record(
                i,
                baseline=result(base, ttft=base / 60),
                speculative=result(spec, ttft=spec / 60),
                started_at=started,
            )
        )
    return out


def judge(records: list[PairRecord], config: LatencyGateConfig | None = None) -> GateDecision:
    config = config or LatencyGateConfig(metrics=("e2e", "ttft"))
    return latency_gate(
        records,
        config,
        now=records[-1].started_at,
        arl0=DEFAULT_ARL0,
        budget_30d=DEFAULT_DETECTOR_BUDGET,
    )


def components(decision: GateDecision) -> dict[str, GateDecision]:
    return {c.name: c for c in decision.components}


class TestConcurrentGroups:
    def test_a_burst_cycle_is_one_group_and_the_schedule_one_pair_each(self) -> None:
        """Pairs started together in a burst cycle form one group per cycle; scheduled
        pairs, each started after the one before ended, are a group each."""
        burst = timed_pairs([0.63] * 12, seed=0, burst=True)
        assert concurrent_groups(burst) == [0] * 4 + [1] * 4 + [2] * 4
        scheduled = timed_pairs([0.63] * 5, seed=0, burst=False)
        assert concurrent_groups(scheduled) == [0, 1, 2, 3, 4]

    def test_a_pair_that_starts_as_the_last_one_ends_is_not_concurrent(self) -> None:
        """Back-to-back cycles: a pair started exactly when the one before ended (its two
        arms, one after the other) shares nothing with it; one started a moment earlier
        does."""
        first = record(0, baseline=result(3.0), speculative=result(2.0), started_at=T0)
        after = record(1, started_at=T0 + timedelta(seconds=5.0))
        before = record(1, started_at=T0 + timedelta(seconds=4.9))
        assert concurrent_groups([first, after]) == [0, 1]
        assert concurrent_groups([first, before]) == [0, 0]


class TestStalledPairs:
    def test_4_stalled_pairs_of_184_in_one_burst_cycle_do_not_fail(self) -> None:
        """A healthy arm 37 % faster (ratio 0.63, tight), 184 pairs in burst cycles of 4,
        one cycle's speculative arms all stalled 13× by one hiccup (the rollback the
        Gaussian median chart made: 4 × 13.5 nats = CUSUM 54 against h ≈ 18): no FAIL, and
        the median component counts the cycle as one vote."""
        ratios = [0.63] * 184
        for i in range(120, 124):
            ratios[i] = 0.63 * 13.0
        decision = judge(timed_pairs(ratios, seed=1, burst=True))
        assert decision.state is not GateState.FAIL, decision.detail
        median = components(decision)["latency.e2e.median"]
        assert median.state is not GateState.FAIL
        assert median.detector is not None and median.detector.peak < 1.0
        assert "184 pairs ran in 46 concurrent groups, a vote each" in median.detail

    def test_4_stalled_pairs_in_a_row_on_the_schedule_do_not_fail(self) -> None:
        """The same 4 stalls on 4 consecutive scheduled pairs (4 votes): no FAIL either."""
        ratios = [0.63] * 184
        for i in range(120, 124):
            ratios[i] = 0.63 * 13.0
        decision = judge(timed_pairs(ratios, seed=2, burst=False))
        assert decision.state is not GateState.FAIL, decision.detail
        median = components(decision)["latency.e2e.median"]
        assert median.detector is not None and median.detector.peak < 4 * 0.6

    def test_2_percent_stalled_cycles_never_fail(self) -> None:
        """3,000 pairs in burst cycles, 2 % of the cycles stalled 3–20× on one arm (the
        same arm of all 4 pairs: the worst case): no detector's CUSUM ever reached its
        threshold (its peak over the whole window), and the healthy arm PASSes. (The
        Gaussian median chart peaked at 54 and the regression check at 30 here.)"""
        rng = random.Random(3)
        ratios = []
        for _ in range(3000 // CONCURRENCY):
            factor = rng.uniform(3.0, 20.0) if rng.random() < 0.02 else 1.0
            on_speculative = rng.random() < 0.5
            stalled = factor if on_speculative else 1.0 / factor
            ratios.extend([0.63 * stalled] * CONCURRENCY)
        records = timed_pairs(ratios, seed=4, burst=True)
        config = LatencyGateConfig(metrics=("e2e", "ttft"), bootstrap_resamples=200)
        decision = judge(records, config)
        assert decision.state is GateState.PASS, decision.detail
        names = set()
        for part in decision.components:
            assert part.detector is not None and part.detector.peak < part.detector.threshold
            names.add(part.name)
        assert "latency.e2e.regression" in names


class TestRealSlowdowns:
    def test_a_1_5x_slower_arm_fails_in_bursts_and_on_the_schedule(self) -> None:
        """An arm as fast as its baseline turns 1.5× slower on every request (a typical
        ratio of 1.5, past max_ratio 1.2), with the same 2 % stalled cycles as above: the
        median component FAILs within 40 votes (every vote above: 0.59 nats each)."""
        for burst in (True, False):
            rng = random.Random(5)
            ratios = [
                1.5 * (rng.uniform(3.0, 20.0) if rng.random() < 0.02 else 1.0) for _ in range(400)
            ]
            records = timed_pairs(ratios, seed=6, burst=burst, spread=0.1)
            per_vote = CONCURRENCY if burst else 1
            decision = judge(records[: 40 * per_vote])
            median = components(decision)["latency.e2e.median"]
            assert median.state is GateState.FAIL, (burst, median.detail)
            assert decision.state is GateState.FAIL

    def test_a_fast_arm_that_turns_1_5x_slower_in_bursts_fails_by_regression(self) -> None:
        """0.63 for the regression pin's 1,000 pairs and 200 more, then ×1.5 (0.945:
        inside max_ratio), all in burst cycles: the regression check, fed one value per
        cycle, FAILs within 300 pairs of the onset."""
        onset = LatencyGateConfig().regression_pin_pairs + 200
        ratios = [0.63] * onset + [0.945] * 400
        records = timed_pairs(ratios, seed=7, burst=True, spread=0.1)
        config = LatencyGateConfig(metrics=("e2e",), bootstrap_resamples=200)
        for end in range(onset, len(records) + 1, 12):
            regression = components(judge(records[:end], config)).get("latency.e2e.regression")
            if regression is not None and regression.state is GateState.FAIL:
                break
        else:
            raise AssertionError("the regression check never FAILed")
        assert end - onset <= 300, end - onset

    def test_a_tail_regression_in_bursts_still_fails(self) -> None:
        """Independent stalls ×4 on 3 % of speculative requests only (the median ratio
        unmoved), pairs in burst cycles: the tail detector FAILs, its votes per cycle."""
        rng = random.Random(8)
        ratios = [
            math.exp(rng.gauss(0.0, 0.3)) * (4.0 if rng.random() < 0.03 else 1.0)
            for _ in range(3000)
        ]
        records = timed_pairs(ratios, seed=9, burst=True, spread=0.0)
        decision = judge(records, LatencyGateConfig(metrics=("e2e",), bootstrap_resamples=200))
        parts = components(decision)
        assert parts["latency.e2e.p99"].state is GateState.FAIL, parts["latency.e2e.p99"].detail
        assert parts["latency.e2e.median"].state is not GateState.FAIL
