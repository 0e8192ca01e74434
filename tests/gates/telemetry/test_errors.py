"""The `telemetry.errors` gate (gates/telemetry/errors.py) on simulated production traffic:
equal arms PASS once both have `min_samples` requests and never alarm over six hours; a
speculative arm failing 5 % more of its requests FAILs within the requests the CUSUM's
drift predicts; in shared outages only the speculative failures beyond the outage's rate
count (a canary failing with the baseline PASSes, one failing 80–100 % there FAILs);
intervals without a baseline are left out; 4xx answers in excess of the baseline's FAIL
their own check; a decision whose evidence stopped is NODATA; the decision carries its
evidence under the name `telemetry.errors`."""

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
from gates.telemetry.errors import (
    beyond_outage,
    excess_bounds,
    shared_outages,
    telemetry_errors_gate,
)
from gates.telemetry.intervals import CountInterval, TelemetryCounts

T0 = datetime(2025, 1, 1, tzinfo=UTC)
SCRAPE_S = 15
RPS = 5.0
PER_INTERVAL = int(RPS * SCRAPE_S)  # 75 requests per arm per scrape interval
CONFIG = TelemetryErrorGateConfig()


def interval(
    index: int, errors: int, requests: int = PER_INTERVAL, client_errors: int | None = None
) -> CountInterval:
    """Scrape interval number `index` (15 s each from T0) with its counts."""
    start = T0 + timedelta(seconds=index * SCRAPE_S)
    return CountInterval(
        start, start + timedelta(seconds=SCRAPE_S), requests, errors, client_errors
    )


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


def correlated_outages(seed: int, speculative_in_outage: tuple[float, float], intervals: int):
    """Both arms at 0.5 % errors, except in outages (5 % of intervals) where the baseline
    fails 20 % of its requests and the speculative arm a share drawn uniformly from
    `speculative_in_outage`."""
    rng = np.random.default_rng(seed)
    outage = rng.random(intervals) < 0.05
    base = [int(rng.binomial(PER_INTERVAL, 0.2 if out else 0.005)) for out in outage]
    spec = [
        int(rng.binomial(PER_INTERVAL, rng.uniform(*speculative_in_outage) if out else 0.005))
        for out in outage
    ]
    return base, spec


def first_fail(
    base: list[int], spec: list[int], config: TelemetryErrorGateConfig = CONFIG, every: int = 1
) -> int | None:
    """The first interval after which the gate FAILs, judged after every `every`
    intervals (None: never)."""
    for k in range(every - 1, len(base), every):
        judged = telemetry_errors_gate(
            counts(base[: k + 1]), counts(spec[: k + 1]), config, now=end_of(k), arl0=DEFAULT_ARL0
        )
        if judged.state is GateState.FAIL:
            return k
    return None


class TestSharedOutages:
    def test_a_canary_failing_with_the_outage_passes(self) -> None:
        """An interval where both arms fail half their requests (a gateway outage) is a
        shared outage: the baseline's interval and its neighbours are left out of its
        rate, the speculative ones are judged only on failures beyond the outage's rate
        (none here), and the gate PASSes on the calm intervals."""
        base = [0] * 20
        spec = [0] * 20
        base[10] = spec[10] = 38
        decision = telemetry_errors_gate(
            counts(base), counts(spec), CONFIG, now=end_of(19), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.PASS
        assert "3 baseline intervals in shared outages" in decision.detail
        assert "3 speculative intervals overlapping an outage judged on their errors" in (
            decision.detail
        )
        assert decision.n_speculative == 17 * PER_INTERVAL

    def test_a_canary_failing_beyond_the_outage_fails(self) -> None:
        """The same outage, the baseline failing 20 % of that interval and the speculative
        arm all of it: its failures beyond the outage's rate are its own, and the gate
        FAILs on that interval though every calm interval is clean."""
        base = [0] * 20
        spec = [0] * 20
        base[10], spec[10] = 15, PER_INTERVAL
        decision = telemetry_errors_gate(
            counts(base), counts(spec), CONFIG, now=end_of(19), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.FAIL, decision.detail
        assert "excursion from interval 11" in decision.detail

    @pytest.mark.parametrize("seed", range(4))
    def test_correlated_outage_fault_fails_as_fast_as_without_the_screen(self, seed: int) -> None:
        """Outages in 5 % of intervals (baseline failing 20 % there) and a speculative arm
        failing 80–100 % in them: FAIL within 1.5× the intervals the gate takes with the
        screen off (outage_alpha so small that nothing is an outage), and within 20
        minutes."""
        base, spec = correlated_outages(seed, (0.8, 1.0), 80)
        screened = first_fail(base, spec)
        unscreened = first_fail(base, spec, CONFIG.model_copy(update={"outage_alpha": 1e-300}))
        assert screened is not None and unscreened is not None, (screened, unscreened)
        assert screened + 1 <= 1.5 * (unscreened + 1)

    @pytest.mark.parametrize("seed", range(4))
    def test_correlated_outage_healthy_never_fails(self, seed: int) -> None:
        """The same outages with a speculative arm failing as the baseline does in them
        (20 %): no FAIL in two hours (judged every 5 minutes), and a PASS at the end whose
        detector never reached half its threshold."""
        base, spec = correlated_outages(seed, (0.2, 0.2), 480)
        assert first_fail(base, spec, every=20) is None
        decision = telemetry_errors_gate(
            counts(base), counts(spec), CONFIG, now=end_of(479), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.PASS, decision.detail
        assert decision.detector is not None
        assert decision.detector.peak < decision.detector.threshold / 2

    def test_beyond_the_outage_counts_only_the_unshared_failures(self) -> None:
        """An interval of 100 requests in an outage failing 20 %: 25 failures count as 5 of
        80 requests; 10 failures count as none of 80."""
        assert beyond_outage(interval(0, 25, 100), 0.2) == pytest.approx((5.0, 80.0))
        assert beyond_outage(interval(0, 10, 100), 0.2) == pytest.approx((0.0, 80.0))


class TestLeftOut:
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
        assert "2 speculative intervals with no baseline interval beside them" in decision.detail
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


def client_counts(errors: list[int], client: list[int | None]) -> TelemetryCounts:
    return TelemetryCounts.of(
        interval(i, e, client_errors=c) for i, (e, c) in enumerate(zip(errors, client, strict=True))
    )


class TestClientErrors:
    def test_a_canary_refusing_thirty_percent_with_4xx_fails(self) -> None:
        """Both arms' sources count 4xx; the baseline answers 1 % of requests 4xx and the
        speculative arm 30 %: the 4xx check FAILs within the first minutes, while the
        5xx check (no excess) does not."""
        rng = np.random.default_rng(4)
        n = 20
        base_4xx = rng.binomial(PER_INTERVAL, 0.01, n).tolist()
        spec_4xx = rng.binomial(PER_INTERVAL, 0.30, n).tolist()
        decision = telemetry_errors_gate(
            client_counts([0] * n, base_4xx), client_counts([0] * n, spec_4xx), CONFIG,
            now=end_of(n - 1), arl0=DEFAULT_ARL0,
        )  # fmt: skip
        assert decision.state is GateState.FAIL, decision.detail
        states = {c.name: c.state for c in decision.components}
        assert states["telemetry.errors.4xx"] is GateState.FAIL
        assert states["telemetry.errors.5xx"] is not GateState.FAIL
        assert decision.detail.startswith("FAIL by telemetry.errors.4xx")
        assert "excess 4xx rate per request" in decision.detail

    def test_4xx_both_arms_share_count_for_nothing(self) -> None:
        """Both arms answering 10 % of requests 4xx (the clients' own bad requests): both
        checks PASS, over an hour."""
        rng = np.random.default_rng(5)
        n = 240
        base_4xx = rng.binomial(PER_INTERVAL, 0.10, n).tolist()
        spec_4xx = rng.binomial(PER_INTERVAL, 0.10, n).tolist()
        decision = telemetry_errors_gate(
            client_counts([0] * n, base_4xx), client_counts([0] * n, spec_4xx), CONFIG,
            now=end_of(n - 1), arl0=DEFAULT_ARL0,
        )  # fmt: skip
        assert decision.state is GateState.PASS, decision.detail
        assert [c.name for c in decision.components] == [
            "telemetry.errors.5xx",
            "telemetry.errors.4xx",
        ]
        for check in decision.components:
            assert check.detector is not None
            assert check.detector.peak < check.detector.threshold / 2

    def test_without_4xx_on_both_arms_the_gate_is_one_check(self) -> None:
        """4xx counted on the speculative arm only: no 4xx check (no baseline to compare
        with), the gate the one check named `telemetry.errors`, unchanged."""
        n = 10
        decision = telemetry_errors_gate(
            counts([0] * n),
            client_counts([0] * n, [20] * n),
            CONFIG,
            now=end_of(n - 1),
            arl0=DEFAULT_ARL0,
        )
        assert decision.components == ()
        assert decision.name == "telemetry.errors"
        assert decision.state is GateState.PASS

    def test_4xx_checks_share_the_gates_budget(self) -> None:
        """With two checks each detector's threshold is log(2 × arl0): the gate's share
        of the false-alarm budget split between them."""
        n = 10
        decision = telemetry_errors_gate(
            client_counts([0] * n, [1] * n), client_counts([0] * n, [1] * n), CONFIG,
            now=end_of(n - 1), arl0=1000.0,
        )  # fmt: skip
        for check in decision.components:
            assert check.detector is not None
            # a bank of three charts adds log 3 to the threshold
            assert check.detector.threshold == pytest.approx(lorden_threshold(2000.0) + math.log(3))


class TestSilence:
    def test_a_canary_gone_dark_after_pass_is_nodata_within_five_minutes(self) -> None:
        """Both arms PASS for half an hour; then the speculative arm's scrapes stop (no
        interval arrives): the gate still PASSes 4.75 minutes later, and is NODATA at 5
        minutes, naming the arm."""
        base, spec = simulate(1, 0.005, 0.005, 120)
        judged = telemetry_errors_gate(
            counts(base), counts(spec[:120]), CONFIG, now=end_of(119), arl0=DEFAULT_ARL0
        )
        assert judged.state is GateState.PASS
        more_base, _ = simulate(2, 0.005, 0.005, 20)
        longer = counts(base + more_base)
        before = telemetry_errors_gate(
            longer, counts(spec), CONFIG, now=end_of(119 + 19), arl0=DEFAULT_ARL0
        )
        after = telemetry_errors_gate(
            longer, counts(spec), CONFIG, now=end_of(119 + 20), arl0=DEFAULT_ARL0
        )
        assert before.state is GateState.PASS
        assert after.state is GateState.NODATA
        assert after.detail.startswith("evidence stopped: no interval from the speculative arm")

    def test_a_canary_that_serves_nothing_is_nodata(self) -> None:
        """Intervals keep arriving from the speculative arm but hold no request (its
        traffic routed away): NODATA once five minutes pass without one."""
        base, spec = simulate(3, 0.005, 0.005, 140)
        dark = TelemetryCounts.of(
            interval(i, e if i < 120 else 0, PER_INTERVAL if i < 120 else 0)
            for i, e in enumerate(spec)
        )
        decision = telemetry_errors_gate(
            counts(base), dark, CONFIG, now=end_of(139), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.NODATA
        assert "no request served by the speculative arm" in decision.detail

    def test_a_baseline_gone_dark_is_nodata_too(self) -> None:
        """Without the baseline's evidence there is no excess to judge: NODATA naming
        the baseline."""
        base, spec = simulate(4, 0.005, 0.005, 140)
        decision = telemetry_errors_gate(
            counts(base[:100]), counts(spec), CONFIG, now=end_of(139), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.NODATA
        assert "no interval from the baseline arm" in decision.detail


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
