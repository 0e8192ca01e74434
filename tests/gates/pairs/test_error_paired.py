"""The error gate's PASS bound on the paired excess (issue #23 part 3): Bonett–Price's
adjusted Wald bound for paired proportions, checked for coverage on seeded draws and
against the bound from the two rates' separate intervals it replaced."""

from __future__ import annotations

import numpy as np
import pytest

from gates import GateState, error_gate
from gates.config import ErrorGateConfig
from gates.pairs.error_rate import paired_difference_bounds
from gates.pairs.testing import at, record, result
from gates.stats.budget import DEFAULT_ARL0
from gates.stats.descriptive import clopper_pearson


@pytest.mark.parametrize(("p_first", "p_second", "n"), [(0.01, 0.01, 300), (0.015, 0.01, 800)])
def test_the_upper_bound_covers_the_true_excess(p_first: float, p_second: float, n: int) -> None:
    """4,000 seeded draws of n pairs with independent failures on each arm: the upper
    bound at 0.8 lies at or above the true excess in at least 78 % of them."""
    rng = np.random.default_rng(7)
    first = rng.random((4000, n)) < p_first
    second = rng.random((4000, n)) < p_second
    truth = p_first * (1 - p_second) - p_second * (1 - p_first)
    covered = 0
    for a, b in zip(first, second, strict=True):
        upper = paired_difference_bounds(int((a & ~b).sum()), int((b & ~a).sum()), n, 0.8)[1]
        covered += upper >= truth
    assert covered / 4000 >= 0.78, covered / 4000


def test_the_paired_bound_is_tighter_than_two_separate_intervals() -> None:
    """5 speculative-only and 5 baseline-only failures in 700 pairs: the paired bound is
    within 0.5 %; the difference of the two Clopper–Pearson bounds is not."""
    lower, upper = paired_difference_bounds(5, 5, 700, 0.8)
    separate = clopper_pearson(5, 700, 0.8)[1] - clopper_pearson(5, 700, 0.8)[0]
    assert lower < 0.0 < upper <= 0.005 < separate


def test_a_healthy_pair_with_one_percent_failures_on_each_arm_passes() -> None:
    """Each arm fails alone on 1 pair in 100 (different pairs): PASS on the paired bound
    at 700 pairs; the excess is 0."""
    records = [
        record(i, baseline=result(ok=i % 100 != 7), speculative=result(ok=i % 100 != 57))
        for i in range(700)
    ]
    decision = error_gate(records, ErrorGateConfig(), now=at(700), arl0=DEFAULT_ARL0)
    paired = next(c for c in decision.components if c.name == "error.paired")
    assert paired.state is GateState.PASS, paired.detail
    assert paired.upper is not None and paired.upper <= 0.005
