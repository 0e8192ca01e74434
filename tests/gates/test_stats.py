"""Descriptive statistics against hand-computed values."""

from __future__ import annotations

import pytest

from gates.stats import mean, quantile, rate


class TestQuantile:
    def test_median_of_odd_and_even_samples(self) -> None:
        """The median is the middle value, or the mean of the two middle values."""
        assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
        assert quantile([4.0, 1.0, 2.0, 3.0], 0.5) == 2.5

    def test_linear_interpolation_between_order_statistics(self) -> None:
        """P90 of 1..10 is 1 + 0.9 * 9 = 9.1 (type 7), P99 is 9.91."""
        values = [float(v) for v in range(1, 11)]
        assert quantile(values, 0.9) == pytest.approx(9.1)
        assert quantile(values, 0.99) == pytest.approx(9.91)

    def test_empty_and_non_finite(self) -> None:
        """No finite values: None; NaN and inf are ignored."""
        assert quantile([], 0.5) is None
        assert quantile([float("nan"), 1.0, float("inf"), 3.0], 0.5) == 2.0

    def test_q_out_of_range(self) -> None:
        """A quantile outside [0, 1] is a programming error."""
        with pytest.raises(ValueError, match="outside"):
            quantile([1.0], 1.5)


class TestMeanAndRate:
    def test_mean_and_rate(self) -> None:
        """Mean of 1, 2, 6 is 3; 3 hits in 4 is 0.75; no data is None."""
        assert mean([1.0, 2.0, 6.0]) == 3.0
        assert mean([]) is None
        assert rate(3, 4) == 0.75
        assert rate(0, 0) is None
