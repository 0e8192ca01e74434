"""The CUSUMs against hand-computed paths, the likelihood ratios they add up, and their
calibration (Lorden's bound) against simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from gates.stats.sequential import (
    LlrCusum,
    bernoulli_llr,
    gaussian_llr,
    llr_cusum,
    lorden_threshold,
)


class TestLlrCusum:
    def test_hand_computed_path(self) -> None:
        """Increments 1, −0.5, 2, −4, 0.5, 0.5 at h = 2.5: S = 1, 0.5, 2.5, 0, 0.5, 1 —
        alarm at index 2, peak 2.5 in the excursion that began at index 0."""
        result = llr_cusum([1.0, -0.5, 2.0, -4.0, 0.5, 0.5], 2.5)
        assert result == LlrCusum(
            statistic=1.0, peak=2.5, alarm_index=2, change_index=0, observations=6
        )

    def test_change_index_is_start_of_peak_excursion(self) -> None:
        """Increments −1, 1, 1, −5, 2, 2: the second excursion (from index 4) holds the peak 4."""
        result = llr_cusum([-1.0, 1.0, 1.0, -5.0, 2.0, 2.0], 10.0)
        assert result.peak == 4.0
        assert result.change_index == 4
        assert result.alarm_index is None

    def test_alarm_is_the_first_crossing_only(self) -> None:
        """The alarm index stays at the first crossing after S falls back and crosses again."""
        result = llr_cusum([3.0, -3.0, 3.0], 3.0)
        assert result.alarm_index == 0
        assert result.statistic == 3.0

    def test_empty_and_negative_runs_stay_at_zero(self) -> None:
        """No observations, or only negative increments: S and its peak stay at zero."""
        empty = llr_cusum([], 1.0)
        assert empty == LlrCusum(0.0, 0.0, None, None, 0)
        negative = llr_cusum([-0.1] * 20, 1.0)
        assert (negative.statistic, negative.peak, negative.change_index) == (0.0, 0.0, None)
        assert negative.observations == 20


class TestBernoulliLlr:
    def test_values_are_log_ratios_of_hit_and_miss(self) -> None:
        """Bernoulli(0.04) against Bernoulli(0.02): a hit adds log 2, a miss log(0.96/0.98)."""
        hit, miss = bernoulli_llr(0.02, 0.04)
        assert hit == pytest.approx(math.log(2.0))
        assert miss == pytest.approx(math.log(0.96 / 0.98))
        assert miss < 0.0 < hit

    def test_in_control_drift_is_negative_and_out_of_control_positive(self) -> None:
        """The expected increment is −KL(p0‖p1) < 0 at p0 and KL(p1‖p0) > 0 at p1."""
        p0, p1 = 0.1, 0.3
        hit, miss = bernoulli_llr(p0, p1)
        assert p0 * hit + (1 - p0) * miss < 0.0
        assert p1 * hit + (1 - p1) * miss > 0.0

    @pytest.mark.parametrize(
        ("p0", "p1"), [(0.0, 0.1), (0.1, 0.1), (0.2, 0.1), (0.1, 1.0), (-0.1, 0.5)]
    )
    def test_rejects_probabilities_out_of_order_or_range(self, p0: float, p1: float) -> None:
        """Anything but 0 < p0 < p1 < 1 is a ValueError naming both probabilities."""
        with pytest.raises(ValueError, match="0 < p0 < p1 < 1"):
            bernoulli_llr(p0, p1)


class TestGaussianLlr:
    def test_sign_follows_the_nearer_mean(self) -> None:
        """For a drop 3 → 2 (sd 0.5): a value at 2 is +2, at 3 is −2, at the midpoint 0."""
        assert gaussian_llr([2.0, 3.0, 2.5], mu0=3.0, mu1=2.0, sigma=0.5) == pytest.approx(
            [2.0, -2.0, 0.0]
        )

    def test_equals_the_log_density_ratio(self) -> None:
        """Each increment is log N(x; mu1, σ²) − log N(x; mu0, σ²)."""
        values = [1.7, 2.2, 2.9, 3.4]
        expected = [norm.logpdf(v, 2.0, 0.4) - norm.logpdf(v, 3.0, 0.4) for v in values]
        assert gaussian_llr(values, 3.0, 2.0, 0.4) == pytest.approx(expected)

    def test_scale_grows_with_the_shift_and_falls_with_the_variance(self) -> None:
        """Halving σ quadruples every increment; doubling the shift (about the same
        midpoint) doubles it."""
        base = gaussian_llr([1.0], 3.0, 2.0, 1.0)[0]
        assert gaussian_llr([1.0], 3.0, 2.0, 0.5)[0] == pytest.approx(4 * base)
        assert gaussian_llr([1.0], 3.5, 1.5, 1.0)[0] == pytest.approx(2 * base)

    def test_rejects_non_positive_sigma(self) -> None:
        """A zero or negative sd is a ValueError."""
        with pytest.raises(ValueError, match="sigma"):
            gaussian_llr([1.0], 3.0, 2.0, 0.0)


class TestLordenThreshold:
    def test_threshold_is_log_arl0(self) -> None:
        """h = log(ARL0); an ARL0 below one is clamped to h = 0."""
        assert lorden_threshold(200.0) == pytest.approx(math.log(200.0))
        assert lorden_threshold(0.5) == 0.0

    def test_simulated_in_control_run_length_is_at_least_arl0(self) -> None:
        """A Bernoulli(0.3)-vs-(0.1) CUSUM at h = log 200 on in-control Bernoulli(0.1) data
        runs at least 200 pairs on average (Lorden's bound) — counted conservatively, with
        runs still going at the horizon counted as ending there."""
        arl0, horizon, runs = 200.0, 1000, 400
        h = lorden_threshold(arl0)
        hit, miss = bernoulli_llr(0.1, 0.3)
        rng = np.random.default_rng(11)
        lengths = []
        for _ in range(runs):
            increments = np.where(rng.random(horizon) < 0.1, hit, miss).tolist()
            alarm = llr_cusum(increments, h).alarm_index
            lengths.append(horizon if alarm is None else alarm + 1)
        assert float(np.mean(lengths)) >= arl0

    def test_out_of_control_data_alarms_within_wald_delay(self) -> None:
        """On Bernoulli(0.3) data the same CUSUM alarms in about h / KL(p1‖p0) ≈ 34 pairs."""
        h = lorden_threshold(200.0)
        hit, miss = bernoulli_llr(0.1, 0.3)
        rng = np.random.default_rng(12)
        delays = []
        for _ in range(200):
            increments = np.where(rng.random(400) < 0.3, hit, miss).tolist()
            alarm = llr_cusum(increments, h).alarm_index
            assert alarm is not None
            delays.append(alarm + 1)
        wald = h / (0.3 * hit + 0.7 * miss)
        assert float(np.mean(delays)) == pytest.approx(wald, rel=0.25)
