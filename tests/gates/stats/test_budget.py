"""The false-alarm budget: how many detectors share it, and each one's ARL0 and threshold."""

from __future__ import annotations

import math

import pytest

from gates import GatesConfig
from gates.core import checks
from gates.cycle import judge
from gates.evidence import Evidence
from gates.pairs.testing import at, record
from gates.stats.budget import (
    DEFAULT_ARL0,
    MINOR_SHARE,
    SECONDS_PER_30_DAYS,
    budget_shares,
    design_pairs_per_minute,
    detector_arl0,
    detector_count,
    rate_ratio,
    rebudget,
)
from gates.stats.sequential import lorden_threshold


def config(**sections: object) -> GatesConfig:
    return GatesConfig.model_validate(sections)


class TestDetectorCount:
    def test_defaults_count_sixteen_detectors(self) -> None:
        """Liveness 1 + error 2 + latency 3 metrics × (median + 1 quantile) + the e2e
        regression check + quality 4 + speedup 1 + drift 1 = 16."""
        assert detector_count(GatesConfig()) == 1 + 2 + 3 * 2 + 1 + 4 + 1 + 1 == 16

    @pytest.mark.parametrize(
        ("section", "share"),
        [
            ("liveness", 1),
            ("error", 2),
            ("latency", 7),
            ("quality", 4),
            ("speedup", 1),
            ("drift", 1),
        ],
    )
    @pytest.mark.parametrize("mode", ["warn", "dry_run"])
    def test_a_gate_that_cannot_roll_back_takes_no_share(
        self, section: str, share: int, mode: str
    ) -> None:
        """A gate in warn or dry_run mode leaves its detectors out of the count."""
        assert detector_count(config(**{section: {"mode": mode}})) == 16 - share

    def test_latency_counts_medians_metric_quantile_pairs_and_slos(self) -> None:
        """Two metrics × (median + two quantiles) plus one SLO and the e2e regression check
        are eight latency detectors."""
        latency = {
            "metrics": ["e2e", "ttft"],
            "quantiles": [0.9, 0.99],
            "slos": [{"metric": "e2e", "quantile": 0.9, "max_seconds": 2.0}],
        }
        assert detector_count(config(latency=latency)) == 1 + 2 + 8 + 4 + 1 + 1

    def test_nothing_enforced_still_counts_one(self) -> None:
        """With every gate in warn mode the count is one, never zero."""
        warn = {"mode": "warn"}
        names = ("liveness", "error", "latency", "quality", "speedup", "drift")
        sections = {s: warn for s in names}
        assert detector_count(config(**sections)) == 1


class TestDetectorArl0:
    def test_default_arl0_and_threshold(self) -> None:
        """0.1 false rollbacks per 30 days at one pair per 10 s over 15 2/16 shares (15
        detectors, and 1/16 each for liveness and quality's tie-rate chart): each
        detector's ARL0 is 259,200 × 15.125 / 0.1 = 39,204,000 pairs, and h = log of it
        (about 17.48)."""
        pairs = SECONDS_PER_30_DAYS / 10.0
        assert pairs == 259_200
        assert budget_shares(GatesConfig()) == 15 + 2 * MINOR_SHARE == 15.125
        assert detector_arl0(GatesConfig()) == pytest.approx(pairs * 15.125 / 0.1)
        assert detector_arl0(GatesConfig()) == pytest.approx(39_204_000)
        assert detector_arl0(GatesConfig()) == DEFAULT_ARL0
        assert lorden_threshold(DEFAULT_ARL0) == pytest.approx(math.log(DEFAULT_ARL0))
        assert lorden_threshold(DEFAULT_ARL0) == pytest.approx(17.48, abs=0.01)

    def test_scales_with_the_detector_count(self) -> None:
        """Putting the error gate (2 of 15.125 shares) in warn mode scales ARL0 by
        13.125 / 15.125."""
        fewer = detector_arl0(config(error={"mode": "warn"}))
        assert fewer == pytest.approx(DEFAULT_ARL0 * 13.125 / 15.125)

    @pytest.mark.parametrize(("section", "shares"), [("liveness", 15.0625), ("quality", 11.0625)])
    def test_gross_detectors_take_a_minor_share(self, section: str, shares: float) -> None:
        """Liveness (a dead arm) and quality's tie-rate chart (a tie on nearly every greedy
        output) have gross alternatives and take 1/16 of a share each: liveness in warn
        mode leaves 15 + 1/16, quality (its 4 detectors and the tie chart) 11 + 1/16."""
        assert budget_shares(config(**{section: {"mode": "warn"}})) == shares
        assert detector_arl0(config(**{section: {"mode": "warn"}})) == pytest.approx(
            DEFAULT_ARL0 * shares / 15.125
        )

    def test_scales_inversely_with_the_budget(self) -> None:
        """Doubling the allowed false rollbacks halves each detector's ARL0."""
        doubled = detector_arl0(config(budget={"false_rollbacks_per_30_days": 0.2}))
        assert doubled == pytest.approx(DEFAULT_ARL0 / 2)

    def test_a_slower_design_schedule_needs_fewer_pairs(self) -> None:
        """At one pair a minute a 30-day budget covers six times fewer pairs."""
        slower = detector_arl0(config(budget={"design_pair_interval_s": 60.0}))
        assert slower == pytest.approx(DEFAULT_ARL0 / 6)


class TestRebudget:
    def test_a_rate_at_or_below_the_design_rate_keeps_the_config(self) -> None:
        """At or below 6 pairs a minute (or unknown) the very same config is judged."""
        designed = GatesConfig()
        for rate in (None, 0.0, 2.0, 6.0):
            assert rebudget(designed, rate) is designed
            assert rate_ratio(designed, rate) == 1.0

    def test_a_faster_rate_raises_every_threshold_by_the_log_of_the_ratio(self) -> None:
        """18 pairs a minute is 3x the design rate: a copy sized for one pair every
        3.33 s, ARL0 three times larger; the original is untouched."""
        designed = GatesConfig()
        faster = rebudget(designed, 18.0)
        assert rate_ratio(designed, 18.0) == pytest.approx(3.0)
        assert faster.budget.design_pair_interval_s == pytest.approx(10 / 3)
        assert designed.budget.design_pair_interval_s == 10.0
        assert detector_arl0(faster) == pytest.approx(3 * detector_arl0(designed))
        raised = lorden_threshold(detector_arl0(faster)) - lorden_threshold(detector_arl0(designed))
        assert raised == pytest.approx(math.log(3.0))
        assert design_pairs_per_minute(designed) == 6.0


class TestJudgeAtARate:
    def test_judge_rebudgets_and_says_so(self) -> None:
        """`judge` with a measured rate twice the design rate: every detector's threshold
        log(2) higher than without it, and the reason names the rate."""
        records = [record(i) for i in range(200)]
        now = at(200)
        plain = judge(Evidence(records), GatesConfig(), now)
        rated = judge(Evidence(records, pair_rate=12.0), GatesConfig(), now)
        assert plain.rate_ratio == 1.0 and rated.rate_ratio == pytest.approx(2.0)
        assert "re-budgeted" not in plain.reason
        assert "re-budgeted for 12 pairs a minute, 2x the design rate" in rated.reason
        before = {c.name: c.detector for c in checks(plain.decisions) if c.detector}
        after = {c.name: c.detector for c in checks(rated.decisions) if c.detector}
        assert before.keys() == after.keys()
        shifted = [
            name
            for name, reading in before.items()
            if after[name].threshold - reading.threshold == pytest.approx(math.log(2.0))
        ]
        assert "error.paired" in shifted and "quality.mismatch" in shifted
