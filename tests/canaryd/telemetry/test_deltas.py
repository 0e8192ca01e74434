"""The arithmetic between two scrapes (canaryd.telemetry.deltas): histogram quantiles as
Prometheus' `histogram_quantile` computes them, checked against known distributions;
counter and histogram increases across resets; buckets of several replicas summed; a
reader that keeps only the labels its matchers name, so the state between two scrapes
does not grow with per-request labels."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from canaryd.telemetry.config import SeriesSpec, SignalMap
from canaryd.telemetry.deltas import (
    BucketCounts,
    TelemetryWindow,
    add_buckets,
    carry_forward,
    counter_increase,
    histogram_increase,
    histogram_quantile,
    telemetry_window,
)
from canaryd.telemetry.scrape import parse_exposition
from canaryd.telemetry.signals import VLLM, ArmReading, SignalReader
from gates.stats.histogram import BucketCounts as GatesBucketCounts

T0 = datetime(2025, 1, 1, tzinfo=UTC)
INF = float("inf")


def observed(values: np.ndarray, bounds: list[float]) -> BucketCounts:
    """The buckets prometheus-client's Histogram fills with `values`, read back through
    the exposition and the reader."""
    registry = CollectorRegistry()
    histogram = Histogram("latency_seconds", "test", buckets=bounds, registry=registry)
    for value in values:
        histogram.observe(float(value))
    reader = SignalReader(SignalMap(e2e=SeriesSpec(series="latency_seconds")))
    samples = parse_exposition(generate_latest(registry).decode())
    groups = reader.read("r", samples).histograms["e2e"]
    return BucketCounts.of(add_buckets(groups.values()))


class TestHistogramQuantile:
    def test_uniform_values_give_exact_quantiles(self) -> None:
        """Values spread evenly over (0, 10] in unit buckets: linear interpolation inside
        a bucket is exact, so the q-quantile is 10 q."""
        values = (np.arange(10_000) + 0.5) / 1000.0
        buckets = observed(values, [float(b) for b in range(1, 11)])
        for q in (0.1, 0.25, 0.5, 0.9, 0.99):
            assert buckets.quantile(q) == pytest.approx(10 * q, abs=1e-9)

    def test_exponential_values_land_within_their_bucket(self) -> None:
        """20,000 draws of an exponential (mean 1 s) in vLLM-like buckets: each quantile
        lies in the bucket holding the true one, within 10 % of the sample's own
        quantile where the buckets are fine."""
        rng = np.random.default_rng(0)
        values = rng.exponential(1.0, 20_000)
        bounds = [0.1 * k for k in range(1, 51)]
        buckets = observed(values, bounds)
        for q in (0.5, 0.9, 0.99):
            estimate = buckets.quantile(q)
            true = -math.log(1 - q)
            assert estimate is not None
            assert math.floor(estimate * 10) == pytest.approx(math.floor(true * 10), abs=1)
            assert estimate == pytest.approx(float(np.quantile(values, q)), rel=0.1)

    def test_prometheus_edge_cases(self) -> None:
        """A rank in the +inf bucket is the largest finite bound; no observations, or no
        +inf bucket, is None; q outside [0, 1] is refused."""
        tail = BucketCounts((1.0, 2.0, INF), (10.0, 10.0, 20.0))
        assert histogram_quantile(0.99, tail) == 2.0
        assert histogram_quantile(0.5, BucketCounts((1.0, INF), (0.0, 0.0))) is None
        assert histogram_quantile(0.5, BucketCounts((1.0, 2.0), (1.0, 2.0))) is None
        with pytest.raises(ValueError, match="outside"):
            histogram_quantile(1.5, tail)

    def test_buckets_are_made_monotone(self) -> None:
        """A bucket counting fewer than its lower neighbour is raised to it."""
        assert BucketCounts.of({1.0: 5.0, 2.0: 4.0, INF: 6.0}).cumulative == (5.0, 5.0, 6.0)


class TestIncreases:
    def test_counter_increase(self) -> None:
        """The difference; after a decrease, a restart or a first sight, the new value;
        never below zero, whatever a hostile server exposes."""
        assert counter_increase(10.0, 15.0, restarted=False) == 5.0
        assert counter_increase(10.0, 3.0, restarted=False) == 3.0
        assert counter_increase(10.0, 15.0, restarted=True) == 15.0
        assert counter_increase(None, 4.0, restarted=False) == 4.0
        assert counter_increase(None, -4.0, restarted=False) == 0.0
        assert counter_increase(10.0, -4.0, restarted=False) == 0.0

    def test_histogram_increase(self) -> None:
        """Bucket-wise differences, or the whole later histogram when any bucket went
        down, the bounds changed, or the replica restarted."""
        before = {1.0: 2.0, INF: 4.0}
        assert histogram_increase(before, {1.0: 5.0, INF: 9.0}, False) == {1.0: 3.0, INF: 5.0}
        assert histogram_increase(before, {1.0: 1.0, INF: 6.0}, False) == {1.0: 1.0, INF: 6.0}
        assert histogram_increase(before, {2.0: 1.0, INF: 6.0}, False) == {2.0: 1.0, INF: 6.0}
        assert histogram_increase(before, {1.0: 5.0, INF: 9.0}, True) == {1.0: 5.0, INF: 9.0}

    def test_buckets_of_different_bounds_add_as_steps(self) -> None:
        """A histogram without a bound counts there what it counts at its next lower one."""
        total = add_buckets([{1.0: 2.0, INF: 4.0}, {0.5: 1.0, 2.0: 3.0, INF: 3.0}])
        assert total == {0.5: 1.0, 1.0: 3.0, 2.0: 5.0, INF: 7.0}


class TestReader:
    def test_per_request_labels_are_summed_away(self) -> None:
        """A thousand series that differ only by a label no matcher names read as one
        group: the state kept between scrapes does not grow with them."""
        registry = CollectorRegistry()
        requests = Counter(
            "vllm:request_success", "t", ["finished_reason", "request_id"], registry=registry
        )
        for index in range(1000):
            requests.labels("stop" if index % 10 else "error", f"r{index}").inc()
        reading = SignalReader(VLLM).read("r", parse_exposition(generate_latest(registry).decode()))
        assert reading.counters["requests"] == {(): 1000.0}
        assert reading.counters["errors"] == {(("finished_reason", "error"),): 100.0}

    def test_arm_labels_select_series(self) -> None:
        """The arm's label matchers are regular expressions over the whole value."""
        text = (
            'vllm:request_success_total{model_name="spec-7b",finished_reason="stop"} 5\n'
            'vllm:request_success_total{model_name="spec-7b-old",finished_reason="stop"} 9\n'
        )
        reader = SignalReader(VLLM, {"model_name": "spec-7b"})
        assert sum(reader.read("r", parse_exposition(text)).counters["requests"].values()) == 5


class TestWindow:
    def test_a_new_replica_has_no_start_to_count_from(self) -> None:
        """A replica first read in the later scrape is named and not counted."""
        reader = SignalReader(VLLM)

        def reading(at: datetime, *urls: str) -> ArmReading:
            samples = parse_exposition('vllm:request_success_total{finished_reason="stop"} 7\n')
            replicas = tuple(reader.read(url, samples) for url in urls)
            return ArmReading("spec", at, reader.mapped, replicas)

        window = telemetry_window(reading(T0, "a"), reading(T0 + timedelta(seconds=15), "a", "b"))
        assert (window.replicas, window.interval.requests, window.new_replicas) == (1, 0, ("b",))
        with pytest.raises(ValueError, match="out of order"):
            telemetry_window(reading(T0, "a"), reading(T0, "a"))

    def test_the_interval_carries_every_signal(self) -> None:
        """The window's interval holds every signal the arm's table names, summed over
        the replicas read at both scrapes, with errors capped at the requests (a
        gateway's error series reset apart from its request series can count more);
        a signal the table does not name is None, one it names and no replica exposed is
        missing; the gates' histogram type is the one canaryd builds."""
        table = SignalMap(
            requests=SeriesSpec(series="requests_total"),
            errors=SeriesSpec(series="errors_total"),
            e2e=SeriesSpec(series="latency_seconds"),
            running=SeriesSpec(series="running"),
            waiting=SeriesSpec(series="waiting"),
            drafts=SeriesSpec(series="drafts_total"),
            draft_tokens=SeriesSpec(series="draft_tokens_total"),
            accepted_tokens=SeriesSpec(series="accepted_tokens_total"),
        )
        reader = SignalReader(table)

        def reading(at: datetime, requests: int, errors: int, running: float) -> ArmReading:
            text = (
                f"requests_total {requests}\nerrors_total {errors}\n"
                f'latency_seconds_bucket{{le="1.0"}} {requests // 2}\n'
                f'latency_seconds_bucket{{le="+Inf"}} {requests}\n'
                f"running {running}\ndrafts_total {requests}\n"
                f"draft_tokens_total {4 * requests}\naccepted_tokens_total {3 * requests}\n"
            )
            replicas = tuple(reader.read(url, parse_exposition(text)) for url in ("a", "b"))
            return ArmReading("spec", at, reader.mapped, replicas)

        end = T0 + timedelta(seconds=15)
        window = telemetry_window(reading(T0, 10, 8, 1.0), reading(end, 14, 15, 3.0))
        interval = window.interval
        assert (interval.start, interval.end, interval.replicas, window.replicas) == (
            T0, end, 2, 2,
        )  # fmt: skip
        assert (interval.requests, interval.errors) == (8, 8)
        assert interval.e2e is not None and interval.e2e.as_mapping() == {1.0: 4.0, INF: 8.0}
        assert isinstance(interval.e2e, GatesBucketCounts)
        assert (interval.running, interval.waiting, interval.ttft) == (4.0, None, None)
        assert (interval.drafts, interval.draft_tokens, interval.accepted_tokens) == (8, 32, 24)
        assert interval.reported_acceptance_length is None
        assert window.missing == ("waiting",)


class TestCarryForward:
    @staticmethod
    def reading(at: datetime, replicas: dict[str, str]) -> ArmReading:
        reader = SignalReader(VLLM)
        return ArmReading(
            "spec",
            at,
            reader.mapped,
            tuple(reader.read(url, parse_exposition(text)) for url, text in replicas.items()),
        )

    def walk(self, *readings: ArmReading) -> list[TelemetryWindow]:
        """The windows a scraper records from these readings, each kept with what the
        ones before it saw (as canaryd.telemetry.scraper does)."""
        last, windows = readings[0], []
        for reading in readings[1:]:
            window = telemetry_window(last, reading)
            windows.append(window)
            last = carry_forward(last, reading, {url for url, _ in window.refused})
        return windows

    def test_a_series_absent_from_one_reading_is_not_counted_again(self) -> None:
        """Drafts 10 → (absent: Prometheus marked them stale between two queries) → 30:
        20 drafts in all, not 10 + 30; the requests read throughout count 12."""
        both = "vllm:spec_decode_num_drafts_total 10\nvllm:request_success_total 5\n"
        windows = self.walk(
            self.reading(T0, {"a": both}),
            self.reading(T0 + timedelta(seconds=15), {"a": "vllm:request_success_total 8\n"}),
            self.reading(
                T0 + timedelta(seconds=30),
                {"a": "vllm:spec_decode_num_drafts_total 30\nvllm:request_success_total 17\n"},
            ),
        )
        assert sum(w.interval.drafts or 0 for w in windows) == 20
        assert sum(w.interval.requests or 0 for w in windows) == 12

    def test_a_replica_absent_from_one_reading_counts_from_its_last_values(self) -> None:
        """A replica missing from one reading is back at the next: counted from the values
        it had before, not skipped as new; one that went down (a reset with no start time
        to show it) is left out of that interval and counted from there."""
        first = "vllm:request_success_total 5\n"
        windows = self.walk(
            self.reading(T0, {"a": first, "b": first}),
            self.reading(T0 + timedelta(seconds=15), {"a": "vllm:request_success_total 9\n"}),
            self.reading(
                T0 + timedelta(seconds=30),
                {"a": "vllm:request_success_total 10\n", "b": "vllm:request_success_total 11\n"},
            ),
            self.reading(
                T0 + timedelta(seconds=45),
                {"a": "vllm:request_success_total 12\n", "b": "vllm:request_success_total 3\n"},
            ),
        )
        assert [w.interval.requests for w in windows] == [4, 1 + 6, 2]
        assert windows[-1].reset == ("b",)
        assert all(w.new_replicas == () for w in windows)


class TestRestarts:
    """A restart is believed only when the process start time says so or the series
    really reset; any other fall of a counter refuses the replica's reading, and the next
    interval counts from the last reading that agreed."""

    START = T0.timestamp() - 86_400.0  # the process started a day before T0

    @staticmethod
    def text(requests: float, errors: float = 0.0, started: float | None = None) -> str:
        lines = [
            f'vllm:request_success_total{{finished_reason="stop"}} {requests - errors}',
            f'vllm:request_success_total{{finished_reason="error"}} {errors}',
        ]
        if started is not None:
            lines.append(f"process_start_time_seconds {started}")
        return "\n".join(lines) + "\n"

    def walk(self, *texts: str) -> list[TelemetryWindow]:
        readings = [
            TestCarryForward.reading(T0 + timedelta(seconds=15 * k), {"a": text})
            for k, text in enumerate(texts)
        ]
        return TestCarryForward().walk(*readings)

    def test_one_value_a_little_low_is_refused_not_a_restart(self) -> None:
        """An HA Prometheus pair's skew: 108,000 requests, then 107,999 from the other
        member (same process start), then 108,150. The low reading is refused (no
        interval, the cause named), not read as a restart crediting 107,999 clean
        requests; the next interval counts the 150 from the reading that agreed."""
        low, back = self.walk(
            self.text(108_000, 100, self.START),
            self.text(107_999, 100, self.START),
            self.text(108_150, 130, self.START),
        )
        assert low.replicas == 0 and low.interval.requests is None
        ((url, why),) = low.refused
        assert (
            url == "a" and "requests went down (108000 → 107999) with the same process start" in why
        )
        assert (back.interval.requests, back.interval.errors, back.refused) == (150, 30, ())

    def test_without_a_start_time_a_small_fall_is_refused_a_reset_believed(self) -> None:
        """No process start time: 1,000 → 990 is another source's value (refused);
        1,000 → 12 a restart, believed but not counted (nothing shows how much of the 12
        fell in the interval, or that it was one process), then counted from 12."""
        (skewed,) = self.walk(self.text(1000), self.text(990))
        assert skewed.replicas == 0 and "by less than a restart would" in skewed.refused[0][1]
        reset, after = self.walk(self.text(1000), self.text(12), self.text(20))
        assert (reset.replicas, reset.reset, reset.refused) == (0, ("a",), ())
        assert (after.interval.requests, after.refused) == (8, ())

    def test_a_rise_past_any_serving_rate_is_refused(self) -> None:
        """Two pods behind one URL sharing a start time: from the young pod's 100,075 to
        the old one's 10,000,150 in 15 s is no traffic (660,000 a second); refused, and
        the next reading counts from the last that agreed."""
        young, old, young_again = self.walk(
            self.text(100_000, 0, self.START),
            self.text(100_075, 15, self.START),
            self.text(10_000_150, 30, self.START),
            self.text(100_150, 30, self.START),
        )
        assert (young.interval.requests, young.interval.errors) == (75, 15)
        assert old.replicas == 0 and "more than a serving replica finishes" in old.refused[0][1]
        assert (young_again.interval.requests, young_again.interval.errors) == (75, 15)

    def test_a_reading_back_at_the_value_before_a_reset_is_refused(self) -> None:
        """Two pods behind one URL, no start times: the first fall is believed a reset
        (not counted); the other pod's next answer, back at the value before it, is
        refused against the ghost, and only the second pod's own increase is counted."""
        earlier = TestCarryForward.reading(T0, {"a": self.text(10_000)})
        ghost = {r.url: r for r in earlier.replicas}
        texts = (self.text(4_075, 15), self.text(10_150, 30), self.text(4_150, 30))
        readings = [
            TestCarryForward.reading(T0 + timedelta(seconds=15 * (k + 1)), {"a": text})
            for k, text in enumerate(texts)
        ]
        back = telemetry_window(readings[0], readings[1], ghost)
        assert back.replicas == 0 and "back at or past" in back.refused[0][1]
        own = telemetry_window(readings[0], readings[2], ghost)
        assert (own.interval.requests, own.interval.errors) == (75, 15)

    def test_a_start_time_that_went_back_is_another_process(self) -> None:
        """A URL that reaches two pods: the start time alternates between them. Going
        back is no restart (refused); moving to a pod already running at the previous
        reading is none either (refused); neither credits the other pod's count."""
        older, younger = self.START, self.START + 3600.0
        back, forward = self.walk(
            self.text(5000, 0, younger), self.text(90_000, 0, older), self.text(5050, 0, younger)
        )
        assert back.replicas == 0 and "start time went back" in back.refused[0][1]
        # the held reading is the younger pod's, and it agrees: 50 requests
        assert (forward.interval.requests, forward.refused) == (50, ())
        (jump,) = self.walk(self.text(90_000, 0, older), self.text(5000, 0, younger))
        assert (
            jump.replicas == 0 and "already running at the previous reading" in (jump.refused[0][1])
        )

    def test_a_process_started_since_the_previous_reading_is_a_restart(self) -> None:
        """The start time moved to a moment after the previous reading: a restart, its
        counters counted from zero (even grown past their old values)."""
        restarted_at = T0.timestamp() + 5.0
        (window,) = self.walk(self.text(50, 0, self.START), self.text(80, 4, restarted_at))
        counts = (window.interval.requests, window.interval.errors)
        assert (counts, window.restarted, window.refused) == ((80, 4), ("a",), ())

    def test_a_load_balanced_url_never_credits_a_huge_interval(self) -> None:
        """Scrapes alternate between two pods behind one URL (each failing 20 % of its
        requests, each 75 requests a scrape): every interval that is not refused counts
        one pod's own 75 requests a scrape, 20 % failed; nothing is re-zeroed."""
        pods = {"old": (500_000.0, self.START), "young": (2_000.0, self.START + 7200.0)}
        texts = []
        for k in range(12):
            name = "old" if k % 3 else "young"
            pods = {n: (count + 75.0, started) for n, (count, started) in pods.items()}
            count, started = pods[name]
            texts.append(self.text(count, count * 0.2, started))
        walked = self.walk(*texts)
        assert any(w.refused for w in walked)
        windows = [w for w in walked if w.replicas]
        assert windows
        for window in windows:
            assert window.interval.requests is not None and window.interval.errors is not None
            assert window.interval.requests % 75 == 0 and window.interval.requests <= 75 * 3
            assert window.interval.errors == pytest.approx(0.2 * window.interval.requests, abs=1)
