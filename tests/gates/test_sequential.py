"""The lower CUSUM against hand-computed paths, and its calibration against simulation."""

from __future__ import annotations

import numpy as np
import pytest

from gates.sequential import cusum_threshold, lower_cusum, siegmund_arl


class TestLowerCusum:
    def test_hand_computed_path(self) -> None:
        """z = 0, −2, −2, +3 with k = 0.5: S = 0, 1.5, 3.0, 0 — ends at zero, peak 3."""
        result = lower_cusum([0.0, -2.0, -2.0, 3.0], 0.5)
        assert result.statistic == 0.0
        assert result.peak == 3.0
        assert result.change_index is None

    def test_change_index_is_start_of_current_excursion(self) -> None:
        """After a reset the change point is where S last left zero."""
        result = lower_cusum([-2.0, 3.0, 0.0, -1.0, -1.0], 0.5)
        assert result.statistic == pytest.approx(1.0)
        assert result.change_index == 3

    def test_upward_moves_never_accumulate(self) -> None:
        """Values above the reference keep the lower CUSUM at zero."""
        assert lower_cusum([1.0] * 50, 0.5).peak == 0.0


class TestCalibration:
    def test_siegmund_matches_published_one_sided_arl(self) -> None:
        """k = 0.5, h = 5: one-sided ARL0 ≈ 930 (twice the two-sided 465 of the tables)."""
        assert siegmund_arl(5.0, 0.5) == pytest.approx(930, rel=0.02)

    def test_threshold_inverts_the_approximation(self) -> None:
        """h for ARL0 = 10,000 at k = 0.5 is about 7.35, and maps back to 10,000."""
        h = cusum_threshold(10_000, 0.5)
        assert h == pytest.approx(7.35, abs=0.01)
        assert siegmund_arl(h, 0.5) == pytest.approx(10_000)

    def test_simulated_in_control_arl_matches_target(self) -> None:
        """On N(0, 1) data the simulated run length at the h for ARL0 = 500 is 500 ± 15 %."""
        k, target = 0.5, 500.0
        h = cusum_threshold(target, k)
        rng = np.random.default_rng(5)
        runs, statistic = 2000, np.zeros(2000)
        stopped = np.full(runs, -1)
        for t in range(1, 20_000):
            statistic = np.maximum(0.0, statistic - rng.normal(size=runs) - k)
            newly = (statistic > h) & (stopped < 0)
            stopped[newly] = t
            statistic[stopped >= 0] = 0.0
            if (stopped >= 0).all():
                break
        assert (stopped >= 0).all()
        assert stopped.mean() == pytest.approx(target, rel=0.15)

    def test_detects_a_one_sd_drop_quickly(self) -> None:
        """Siegmund's out-of-control ARL for a 1 sd drop at the default h is about 14 pairs."""
        h = cusum_threshold(10_000, 0.5)
        assert 10 < siegmund_arl(h, 0.5, shift=1.0) < 20
