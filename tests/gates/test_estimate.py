"""gates.estimate: the evidence an undecided verdict still needs, and the minutes it takes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gates.config import GatesConfig
from gates.cycle import judge
from gates.estimate import estimate, unit_of
from gates.evidence import Evidence
from gates.pairs.testing import at, record, result
from gates.telemetry.intervals import ArmTelemetry, TelemetryEvidence, TelemetryInterval

NO_DRIFT = GatesConfig.model_validate({"drift": {"mode": "warn"}})
# Of the telemetry gates only telemetry.errors enforced: the evidence below has counts only.
ERRORS_ONLY = GatesConfig.model_validate(
    {
        "drift": {"mode": "warn"},
        "telemetry": {"latency": {"mode": "warn"}, "acceptance": {"mode": "warn"}},
    }
)


def healthy(n: int) -> list:
    return [record(i, speculative=result(0.5, verify_steps=10)) for i in range(n)]


def telemetry(intervals: int, requests: int = 10) -> TelemetryEvidence:
    """Both arms' last `intervals` 15 s scrapes up to the judgements' time, at(399)."""
    start = at(399) - timedelta(seconds=15 * intervals)
    arm = ArmTelemetry.of(
        TelemetryInterval(
            start + timedelta(seconds=15 * k),
            start + timedelta(seconds=15 * (k + 1)),
            requests=requests,
            errors=0,
        )
        for k in range(intervals)
    )
    return TelemetryEvidence(arm, arm)


class TestEstimate:
    def test_a_decided_verdict_needs_nothing(self) -> None:
        """PASS (and FAIL) carry no estimate."""
        judged = judge(Evidence(healthy(400)), NO_DRIFT, at(399))
        assert judged.verdict == "PASS"
        figures = estimate(judged, NO_DRIFT, pairs_per_minute=20)
        assert figures.pairs_to_decision is None and figures.minutes_to_decision is None

    def test_the_greedy_mismatch_bound_is_what_a_healthy_window_waits_for(self) -> None:
        """200 identical greedy pairs: the mismatch bound needs about 120 more pairs
        (6 minutes at 20 a minute); a few past the estimate the verdict PASSes, half of
        it does not."""
        judged = judge(Evidence(healthy(200)), NO_DRIFT, at(199))
        assert judged.verdict == "INCONCLUSIVE"
        figures = estimate(judged, NO_DRIFT, pairs_per_minute=20)
        assert figures.waiting_on == "quality.mismatch"
        assert figures.pairs_to_decision is not None and 100 <= figures.pairs_to_decision <= 150
        assert figures.minutes_to_decision == pytest.approx(figures.pairs_to_decision / 20, 0.05)
        after = 200 + figures.pairs_to_decision + 5
        assert judge(Evidence(healthy(after)), NO_DRIFT, at(after - 1)).verdict == "PASS"
        half = 200 + figures.pairs_to_decision // 2
        assert judge(Evidence(healthy(half)), NO_DRIFT, at(half - 1)).verdict != "PASS"

    def test_a_verdict_waiting_on_telemetry_needs_no_pairs(self) -> None:
        """Quality has PASSed; telemetry.errors has 200 of its 500 requests: no pairs
        needed, 300 requests at 60 a minute are 5 minutes."""
        scraped = Evidence(healthy(400), telemetry=telemetry(20), scrape_interval_s=15.0)
        judged = judge(scraped, ERRORS_ONLY, at(399))
        assert judged.verdict == "INCONCLUSIVE"
        figures = estimate(judged, ERRORS_ONLY, pairs_per_minute=20, requests_per_minute=60)
        assert figures.pairs_to_decision == 0
        assert figures.waiting_on == "telemetry.errors"
        assert figures.minutes_to_decision == pytest.approx(5.0)
        unknown = estimate(judged, ERRORS_ONLY, pairs_per_minute=20)
        assert unknown.minutes_to_decision is None and unknown.waiting_on == "telemetry.errors"
        assert figures.to_dict() == {
            "pairs_to_decision": 0,
            "minutes_to_decision": 5.0,
            "waiting_on": "telemetry.errors",
        }

    def test_min_pairs_is_a_need_too(self) -> None:
        """Below the caller's min_pairs the verdict waits for the rest of them."""
        judged = judge(Evidence(healthy(400)), NO_DRIFT, at(399), min_pairs=600)
        assert judged.verdict == "NODATA"
        figures = estimate(judged, NO_DRIFT, pairs_per_minute=20, min_pairs=600)
        assert figures.pairs_to_decision == 200
        assert figures.minutes_to_decision == pytest.approx(10.0)

    def test_units(self) -> None:
        """Pairs for the pair gates, requests and drafts for the telemetry gates."""
        assert unit_of("quality.mismatch") == "pairs"
        assert unit_of("telemetry.errors") == "requests"
        assert unit_of("telemetry.acceptance") == "drafts"
