"""The false-alarm budget: how many detectors share it, and each one's ARL0 and threshold."""

from __future__ import annotations

import math

import pytest

from gates import GatesConfig
from gates.budget import (
    DEFAULT_ARL0,
    MINOR_SHARE,
    SECONDS_PER_30_DAYS,
    budget_shares,
    detector_arl0,
    detector_count,
    detector_threshold,
)


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
        assert detector_threshold(GatesConfig()) == pytest.approx(math.log(DEFAULT_ARL0))
        assert detector_threshold(GatesConfig()) == pytest.approx(17.48, abs=0.01)

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
