"""The `telemetry.errors` gate (gates/telemetry/errors.py) on simulated production traffic:
equal arms PASS once both have `min_samples` requests and never alarm over six hours; a
speculative arm failing 5 % more of its requests FAILs within the requests the CUSUM's
drift predicts; shared outages and intervals without a baseline are left out; the
decision carries its evidence under the name `telemetry.errors`."""

from __future__ import annotations

import math
import statistics
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from gates.config import TelemetryErrorGateConfig
from gates.core import GateDecision, GateMode, GateState
from gates.stats.budget import DEFAULT_ARL0
from gates.stats.descriptive import clopper_pearson
from gates.stats.detectors import CALIBRATION_CONFIDENCE
from gates.stats.sequential import bernoulli_llr, lorden_threshold
from gates.telemetry.errors import excess_bounds, shared_outages, telemetry_errors_gate
from gates.telemetry.intervals import CountInterval, TelemetryCounts

T0 = datetime(2025, 1, 1, tzinfo=UTC)
SCRAPE_S = 15
RPS = 5.0
PER_INTERVAL = int(RPS * SCRAPE_S)  # 75 requests per arm per scrape interval
CONFIG = TelemetryErrorGateConfig()


def interval(index: int, errors: int, requests: int = PER_INTERVAL) -> CountInterval:
    """Scrape interval number `index` (15 s each from T0) with its counts."""
    start = T0 + timedelta(seconds=index * SCRAPE_S)
    return CountInterval(start, start + timedelta(seconds=SCRAPE_S), requests, errors)


def end_of(index: int) -> datetime:
    return T0 + timedelta(seconds=(index + 1) * SCRAPE_S)


def counts(errors: list[int]) -> TelemetryCounts:
    return TelemetryCounts.of(interval(i, e) for i, e in enumerate(errors))


def simulate(seed: int, baseline_rate: float, speculative_rate: float, intervals: int):
    """Binomial error counts for both arms, interval by interval."""
    rng = np.random.default_rng(seed)
    base = rng.binomial(PER_INTERVAL, baseline_rate, intervals).tolist()
    spec = rng.binomial(PER_INTERVAL, speculative_rate, intervals).tolist()
    return base, spec


def requests_to_fail(seed: int, baseline_rate: float, speculative_rate: float) -> int | None:
    """The speculative requests judged when the gate first FAILs, evaluated after every
    scrape for up to an hour (None: never)."""
    base, spec = simulate(seed, baseline_rate, speculative_rate, 240)
    for k in range(len(base)):
        decision = telemetry_errors_gate(
            counts(base[: k + 1]), counts(spec[: k + 1]), CONFIG, now=end_of(k), arl0=DEFAULT_ARL0
        )
        if decision.state is GateState.FAIL:
            return decision.n_speculative
    return None


def predicted_requests(baseline_rate: float, speculative_rate: float, baseline_n: int) -> float:
    """h / drift: the requests the first chart needs at the in-control rate the gate
    calibrates from `baseline_n` baseline requests failing at `baseline_rate`."""
    errors = round(baseline_rate * baseline_n)
    _, upper = clopper_pearson(errors, baseline_n, CALIBRATION_CONFIDENCE)
    p0 = upper + CONFIG.max_excess_rate
    p1 = CONFIG.alarm_factor * p0
    failure, success = bernoulli_llr(p0, p1)
    drift = speculative_rate * failure + (1 - speculative_rate) * success
    h = lorden_threshold(DEFAULT_ARL0) + math.log(3)  # a bank of three charts
    return h / drift


class TestHealthy:
    def test_equal_arms_pass_once_both_have_min_samples(self) -> None:
        """Both arms failing 0.5 % of 5 requests per second: PASS at the first scrape with
        500 requests per arm (7 intervals, 525 requests, 105 s), with the excess's upper
        bound under the tolerance."""
        base, spec = simulate(1, 0.005, 0.005, 7)
        early = telemetry_errors_gate(
            counts(base[:6]), counts(spec[:6]), CONFIG, now=end_of(5), arl0=DEFAULT_ARL0
        )
        decision = telemetry_errors_gate(
            counts(base), counts(spec), CONFIG, now=end_of(6), arl0=DEFAULT_ARL0
        )
        assert early.state is GateState.NODATA
        assert decision.state is GateState.PASS
        assert decision.n_baseline == decision.n_speculative == 525
        assert decision.upper is not None and decision.upper <= CONFIG.max_excess_rate

    @pytest.mark.parametrize("rate", [0.0, 0.005, 0.05])
    def test_six_hours_of_equal_arms_never_alarm(self, rate: float) -> None:
        """Six hours (1,440 intervals, 108,000 requests per arm) of equal arms at 0 %,
        0.5 % and 5 % errors: PASS, and the detector's peak stays under half its
        threshold."""
        base, spec = simulate(7, rate, rate, 1440)
        decision = telemetry_errors_gate(
            counts(base), counts(spec), CONFIG, now=end_of(1439), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.PASS
        assert decision.detector is not None
        assert decision.detector.peak < decision.detector.threshold / 2


class TestFivePercentExcess:
    def test_fails_within_the_predicted_requests_at_five_per_second(self) -> None:
        """A 5 % excess (0.5 % → 5.5 %) at 5 requests per second FAILs, over 12 seeds,
        with a median of at most the h / drift prediction at 1,000 baseline requests
        (about 1,030 requests, 3.4 minutes) and every seed within 10 minutes."""
        predicted = predicted_requests(0.005, 0.055, 1000)
        assert 900 < predicted < 1200
        judged = [requests_to_fail(seed, 0.005, 0.055) for seed in range(12)]
        assert all(n is not None for n in judged)
        needed = [n for n in judged if n is not None]
        assert statistics.median(needed) <= predicted * 1.1
        assert statistics.median(needed) <= 5 * 60 * RPS  # the 5 minutes
        assert max(needed) <= 10 * 60 * RPS

    def test_a_dead_speculative_interval_fails_at_once(self) -> None:
        """Half the speculative requests of one interval failing, the baseline calm: the
        gross chart alarms on that interval alone."""
        base = [0] * 8
        spec = [0] * 7 + [38]
        decision = telemetry_errors_gate(
            counts(base), counts(spec), CONFIG, now=end_of(7), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.FAIL
        assert "excursion from interval 8" in decision.detail


class TestLeftOut:
    def test_a_shared_outage_is_left_out(self) -> None:
        """An interval where both arms fail half their requests (a gateway outage) is a
        shared outage: it and its neighbours are left out, and the gate PASSes."""
        base = [0] * 20
        spec = [0] * 20
        base[10] = spec[10] = 38
        decision = telemetry_errors_gate(
            counts(base), counts(spec), CONFIG, now=end_of(19), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.PASS
        assert "3 baseline intervals in shared outages, 3 speculative" in decision.detail
        assert decision.n_speculative == 17 * PER_INTERVAL

    def test_the_outage_screen_reads_the_baseline_only(self) -> None:
        """Calm baseline intervals are never outages, whatever their neighbours hold; a
        burst is one, with `margin` intervals on each side."""
        calm = [interval(i, 0) for i in range(10)]
        burst = [*calm[:5], interval(5, 30), *calm[6:]]
        assert shared_outages(calm, alpha=0.001, margin=1) == [False] * 10
        assert shared_outages(burst, alpha=0.001, margin=1) == [i in {4, 5, 6} for i in range(10)]

    def test_intervals_without_a_baseline_are_left_out(self) -> None:
        """Speculative intervals no baseline interval overlaps (a failed baseline scrape)
        are not judged; with no baseline at all the gate is NODATA."""
        spec = counts([0] * 10)
        base = TelemetryCounts.of(interval(i, 0) for i in range(10) if i not in {3, 4})
        decision = telemetry_errors_gate(base, spec, CONFIG, now=end_of(9), arl0=DEFAULT_ARL0)
        assert decision.n_speculative == 8 * PER_INTERVAL
        assert "2 with no baseline interval beside them" in decision.detail
        empty = telemetry_errors_gate(
            TelemetryCounts(), spec, CONFIG, now=end_of(9), arl0=DEFAULT_ARL0
        )
        assert empty.state is GateState.NODATA
        assert empty.n_speculative == 0

    def test_the_window_and_since_bound_the_intervals(self) -> None:
        """Intervals ending after `now`, older than `window_seconds`, or starting before
        `since` are not read."""
        base = spec = counts([0] * 40)
        config = TelemetryErrorGateConfig(window_seconds=300.0)
        windowed = telemetry_errors_gate(base, spec, config, now=end_of(29), arl0=DEFAULT_ARL0)
        assert windowed.n_speculative == 20 * PER_INTERVAL
        since = telemetry_errors_gate(
            base,
            spec,
            CONFIG,
            now=end_of(29),
            since=T0 + timedelta(seconds=25 * SCRAPE_S),
            arl0=DEFAULT_ARL0,
        )
        assert since.n_speculative == 5 * PER_INTERVAL
        assert since.window_start == T0 + timedelta(seconds=25 * SCRAPE_S)


class TestDecision:
    def test_the_decision_names_itself_and_carries_its_evidence(self) -> None:
        """name `telemetry.errors`, the gate's mode, requests per arm, the excess with its
        bounds, the tolerance, the detector, a JSON-ready dict."""
        config = TelemetryErrorGateConfig(mode=GateMode.WARN)
        decision: GateDecision = telemetry_errors_gate(
            counts([1] * 10), counts([3] * 10), config, now=end_of(9), arl0=DEFAULT_ARL0
        )
        assert decision.name == "telemetry.errors"
        assert decision.mode is GateMode.WARN
        assert (decision.n_baseline, decision.n_speculative) == (750, 750)
        assert decision.estimate == pytest.approx(20 / 750)
        assert decision.lower is not None and decision.upper is not None
        assert decision.lower < decision.estimate < decision.upper
        assert decision.threshold == CONFIG.max_excess_rate
        assert decision.window_start == T0 and decision.window_end == end_of(9)
        assert decision.detector is not None
        assert decision.to_dict()["name"] == "telemetry.errors"

    def test_the_excess_bound_covers_equal_arms_at_its_level(self) -> None:
        """Agresti–Caffo's upper bound at 80 % lies above the true excess 0 in at least
        80 % of 2,000 draws of equal arms (500 requests each, 1 % errors)."""
        rng = np.random.default_rng(3)
        first = rng.binomial(500, 0.01, 2000)
        second = rng.binomial(500, 0.01, 2000)
        covered = [
            excess_bounds(int(a), 500, int(b), 500, 0.8)[1] >= 0.0
            for a, b in zip(first, second, strict=True)
        ]
        assert sum(covered) / len(covered) >= 0.8

    def test_an_interval_checks_its_counts(self) -> None:
        """More errors than requests, or an interval that ends before it starts, is a
        ValueError naming the figures."""
        with pytest.raises(ValueError, match="3 errors of 2 requests"):
            CountInterval(T0, end_of(0), 2, 3)
        with pytest.raises(ValueError, match="ends after it starts"):
            CountInterval(end_of(0), T0, 2, 0)
