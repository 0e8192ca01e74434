"""Drift references are estimates (issue #23 part 2): a pin's mean error biases every
increment of the chart for as long as the pin lives, so the chart starts from the pinned
mean's lower bound, and a pin grows from its earliest pairs until `pin_target_samples`.
All data are seeded draws: the same values on every run."""

from __future__ import annotations

import math
import random

import pytest
from scipy.integrate import quad
from scipy.stats import norm

from gates import GateState, ReferenceStats, drift_gate, grow_references, pin_reference
from gates.config import DriftGateConfig
from gates.pairs.drift import drift_charts, pin_alpha, pin_margin
from gates.pairs.testing import at, record, result
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0, DEFAULT_DETECTOR_BUDGET

MEAN, SD = 2.0, 0.6  # a category whose acceptance length has a CV of 0.30


def lengths(count: int, seed: int, *, scale: float = 1.0) -> list[float]:
    rng = random.Random(seed)
    return [max(1.0, rng.gauss(MEAN * scale, SD * scale)) for _ in range(count)]


def records(values: list[float], first: int = 0, category: str = "code") -> list[PairRecord]:
    """One pair per value; acceptance length = value (40 verify steps, to 1/40)."""
    return [
        record(
            first + i,
            category=category,
            speculative=result(0.5, output_tokens=round(40 * v), verify_steps=40),
        )
        for i, v in enumerate(values)
    ]


def first_fail(values: list[float], reference: ReferenceStats, every: int = 6) -> int | None:
    """The pair at which a gate run every `every` pairs first sees drift FAIL."""
    config = DriftGateConfig()
    rows = records(values)
    for end in range(every, len(rows) + 1, every):
        window = rows[max(0, end - config.window_pairs) if config.window_pairs else 0 : end]
        state = drift_gate(
            window,
            config,
            now=at(end),
            references={"code": reference},
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        ).state
        if state is GateState.FAIL:
            return end
    return None


class TestMarginOnThePinnedMean:
    def test_the_chart_starts_below_a_pinned_mean_by_a_margin_that_shrinks(self) -> None:
        """m0 is the pinned mean less a margin on both scales; the margin shrinks as the pin
        grows, and a configured reference (n = 0) is taken as exact."""
        config = DriftGateConfig()
        design = {"alpha": pin_alpha(0.1 / 15, 9), "h": 18.17, "horizon": 28_800.0}
        margins = []
        for n in (30, 200, 2000):
            pinned = pin_reference(records(lengths(n, 1)))["code"]
            linear, log = drift_charts(pinned, config, **design)
            assert not linear.log and log.log
            assert linear.m1 == pytest.approx(linear.m0 - 0.15 * pinned.mean)
            assert log.m1 - log.m0 == pytest.approx(math.log(0.7))
            assert pinned.log_mean is not None
            margins.append((pinned.mean - linear.m0, pinned.log_mean - log.m0))
        assert margins[0][0] > margins[1][0] > margins[2][0] >= 0.0
        assert margins[0][1] > margins[1][1] >= margins[2][1] >= 0.0
        assert margins[0][0] > 0.1 * MEAN  # a 30-pair pin is uncertain by more than 10 %
        exact = drift_charts(ReferenceStats(MEAN, SD), config, **design)[0]
        assert exact.m0 == MEAN and exact.sigma == SD

    def test_the_margin_meets_its_false_alarm_target(self) -> None:
        """The closed form in pin_margin against numerical integration over the pin's
        error b ~ N(0, se²) of min(1, horizon × exp(−h θ(b − m))): alpha at the margin."""
        se, inflation, shift, h, horizon, alpha = 0.11, 1.28, 0.3, 18.1, 28_800.0, 2e-4
        m = float(pin_margin(se, inflation, shift, h, horizon, alpha))
        assert m > 0.0

        def chance(b: float) -> float:
            theta = inflation**2 * (1.0 - 2.0 * (b - m) / shift)
            return min(1.0, horizon * math.exp(-h * theta)) * norm.pdf(b / se) / se

        integral, _ = quad(chance, -12 * se, 12 * se, points=[m], limit=200)
        assert integral == pytest.approx(alpha, rel=1e-3)
        assert float(pin_margin(se / 4, inflation, shift, h, horizon, alpha)) < m / 4

    def test_a_pin_drawn_high_does_not_false_alarm(self) -> None:
        """Thirty pin values whose mean is 3 standard errors above the healthy mean (an
        unlucky pin, about 1 in 700): judged as exact, 2,000 healthy pairs FAIL; with the
        margin they don't."""
        values = lengths(30, 2)
        shift = MEAN + 3 * SD / math.sqrt(30) - sum(values) / 30
        high = pin_reference(records([v + shift for v in values]))["code"]
        assert high.mean == pytest.approx(MEAN + 3 * SD / math.sqrt(30), abs=0.02)
        healthy = lengths(2000, 3)
        exact = ReferenceStats(high.mean, high.sd, 0, high.log_mean, high.log_sd)
        assert first_fail(healthy, exact, every=100) is not None
        assert first_fail(healthy, high, every=100) is None

    def test_a_30_percent_drop_still_fails_within_a_hundred_pairs(self) -> None:
        """A pin grown to 200 pairs, then the category's acceptance falls 30 %."""
        pinned = pin_reference(records(lengths(200, 4)))["code"]
        at_pair = first_fail(lengths(300, 5, scale=0.7), pinned)
        assert at_pair is not None and at_pair <= 100, at_pair

    def test_restore_is_not_blocked_by_a_young_pin(self) -> None:
        """PASS counts both uncertainties (Welch): 40 healthy pairs against a 30-pair pin
        PASS; 40 pairs 20 % below it do not."""
        pinned = pin_reference(records(lengths(30, 6)))["code"]
        config = DriftGateConfig()
        for scale, passes in ((1.0, True), (0.8, False)):
            rows = records(lengths(40, 7, scale=scale))
            state = drift_gate(
                rows,
                config,
                now=at(40),
                references={"code": pinned},
                arl0=DEFAULT_ARL0,
                budget_30d=DEFAULT_DETECTOR_BUDGET,
            ).state
            assert (state is GateState.PASS) is passes, (scale, state)


class TestGrowingPins:
    def test_a_new_category_is_pinned_then_grows_to_the_target(self) -> None:
        config = DriftGateConfig()
        rows = records(lengths(25, 8))
        assert (
            grow_references(
                rows, {}, config, now=at(25), arl0=DEFAULT_ARL0, budget_30d=DEFAULT_DETECTOR_BUDGET
            )
            == {}
        )
        rows = records(lengths(250, 8))
        first = grow_references(
            rows[:40], {}, config, now=at(40), arl0=DEFAULT_ARL0, budget_30d=DEFAULT_DETECTOR_BUDGET
        )
        assert first["code"].n == 40
        grown = grow_references(
            rows, first, config, now=at(250), arl0=DEFAULT_ARL0, budget_30d=DEFAULT_DETECTOR_BUDGET
        )
        assert grown["code"].n == 200
        assert grown["code"] == pin_reference(rows[:200])["code"]  # its earliest pairs
        assert (
            grow_references(
                rows,
                grown,
                config,
                now=at(250),
                arl0=DEFAULT_ARL0,
                budget_30d=DEFAULT_DETECTOR_BUDGET,
            )
            == {}
        )

    def test_a_pin_does_not_grow_while_its_category_drifts(self) -> None:
        """Pinned from 30 healthy pairs, then 60 pairs at half the acceptance: the check is
        FAIL, so the pin keeps its 30 pairs instead of absorbing the drop."""
        config = DriftGateConfig()
        rows = records(lengths(30, 9)) + records(lengths(60, 10, scale=0.5), first=30)
        young = pin_reference(rows[:30])
        state = drift_gate(
            rows,
            config,
            now=at(90),
            references=young,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        ).state
        assert state is GateState.FAIL
        assert (
            grow_references(
                rows,
                young,
                config,
                now=at(90),
                arl0=DEFAULT_ARL0,
                budget_30d=DEFAULT_DETECTOR_BUDGET,
            )
            == {}
        )

    def test_a_configured_reference_never_grows(self) -> None:
        config = DriftGateConfig.model_validate({"references": {"code": {"mean": 2.0, "sd": 0.6}}})
        rows = records(lengths(100, 11))
        young = pin_reference(rows[:30])
        assert (
            grow_references(
                rows,
                young,
                config,
                now=at(100),
                arl0=DEFAULT_ARL0,
                budget_30d=DEFAULT_DETECTOR_BUDGET,
            )
            == {}
        )

    def test_target_below_the_minimum_is_refused(self) -> None:
        with pytest.raises(ValueError, match="pin_target_samples"):
            DriftGateConfig(pin_min_samples=50, pin_target_samples=40)
