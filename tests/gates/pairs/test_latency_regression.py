"""The latency gate's regression check (issue #23 part 3): an arm that was 25 % faster
than its baseline and turns 1.5× slower stays inside `max_ratio` = 1.2, so only a check
against the arm's own pinned ratio catches it. Seeded draws: the same values every run."""

from __future__ import annotations

import math
import random

from gates import GateDecision, GateState, latency_gate
from gates.config import LatencyGateConfig
from gates.pairs.testing import at, record, result
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0, DEFAULT_DETECTOR_BUDGET

PIN = LatencyGateConfig().regression_pin_pairs  # 1,000 by default


def pairs(count: int, ratio: float, seed: int, first: int = 0) -> list[PairRecord]:
    """Baseline e2e log-normal (sd 0.3), the speculative arm `ratio` × it with 10 %
    noise of its own."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        base = math.exp(rng.gauss(0.0, 0.3))
        spec = base * ratio * math.exp(rng.gauss(0.0, 0.1))
        out.append(record(first + i, baseline=result(base), speculative=result(spec)))
    return out


def check(
    records: list[PairRecord], name: str = "latency.e2e.regression"
) -> tuple[GateDecision, GateDecision | None]:
    decision = latency_gate(
        records,
        LatencyGateConfig(),
        now=at(len(records)),
        arl0=DEFAULT_ARL0,
        budget_30d=DEFAULT_DETECTOR_BUDGET,
    )
    return decision, next((c for c in decision.components if c.name == name), None)


def first_fail(records: list[PairRecord], start: int, every: int = 6) -> int | None:
    for end in range(start, len(records) + 1, every):
        _, regression = check(records[:end])
        if regression is not None and regression.state is GateState.FAIL:
            return end - start
    return None


class TestRegressionCheck:
    def test_a_fast_arm_that_turns_slow_fails_by_regression_not_by_max_ratio(self) -> None:
        """The pin's pairs and 100 more at 0.8; then ×1.5 (a typical ratio of 1.2, inside
        max_ratio): the regression check FAILs within 100 pairs; the median check does not."""
        onset = PIN + 100
        records = pairs(onset, 0.8, 1) + pairs(300, 1.2, 2, first=onset)
        after = first_fail(records, onset)
        assert after is not None and after <= 100, after
        decision, _ = check(records[: onset + after])
        median = next(c for c in decision.components if c.name == "latency.e2e.median")
        assert median.state is not GateState.FAIL

    def test_a_steady_arm_never_fails_and_passes(self) -> None:
        """3,000 pairs at a steady 0.8: the regression check never FAILs, and PASSes."""
        records = pairs(3000, 0.8, 3)
        assert first_fail(records, PIN + 10, every=300) is None
        _, regression = check(records)
        assert regression is not None and regression.state is GateState.PASS

    def test_a_regression_within_the_tolerance_never_fails(self) -> None:
        """5 % slower than the pin (tolerance 10 %): never a FAIL over 3,000 pairs."""
        records = pairs(PIN, 0.8, 4) + pairs(3000 - PIN, 0.84, 5, first=PIN)
        assert first_fail(records, PIN + 10, every=300) is None

    def test_not_judged_while_the_pin_fills_or_too_few_pairs_follow(self) -> None:
        """Fewer than the pin + 3 pairs: no regression component, a note instead; then,
        until min_samples (300) pairs follow the pin, a note with the detector's reading —
        so the pin's wait never holds a restore back."""
        decision, regression = check(pairs(150, 0.8, 6))
        assert regression is None
        note = f"e2e regression: pinning the arm's own ratio (150 of {PIN} pairs)"
        assert note in decision.detail
        decision, regression = check(pairs(PIN + 200, 0.8, 6))
        assert regression is None
        assert "e2e regression: typical ratio" in decision.detail

    def test_two_stalls_in_a_row_do_not_decide(self) -> None:
        """A steady arm (log-ratio scale 0.11) whose two requests 400 pairs after the pin
        stall ×5: one pair earns at most 7.5 nats, so the peak stays under h."""
        records = pairs(PIN + 410, 0.8, 7)
        for k in (PIN + 400, PIN + 401):
            stalled = records[k]
            records[k] = record(
                k,
                baseline=result(stalled.baseline.e2e_s),
                speculative=result(stalled.speculative.e2e_s * 5),
            )
        _, regression = check(records)
        assert regression is not None
        assert regression.detector is not None
        reading = regression.detector
        assert 14.0 < reading.peak < reading.threshold
