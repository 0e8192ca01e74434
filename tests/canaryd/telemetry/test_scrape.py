"""The direct scrape (canaryd.telemetry.scrape) against real HTTP servers on loopback that
serve prometheus-client's own exposition of vLLM's series: two scrapes give the
interval's requests, errors, latency buckets, load and draft counters; a restarted replica's
counters count from zero; two replicas are summed; a gateway's 503 series that appears
mid-interval and a Go counter without `_total` are read; a replica that answers badly is a
failure with its reason, never an exception, and costs only its own counts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from canaryd.telemetry.config import TelemetryArmConfig
from canaryd.telemetry.deltas import telemetry_window
from canaryd.telemetry.scrape import ScrapeSource
from tests.canaryd.telemetry.replica import TextReplica, VllmReplica

T0 = datetime(2025, 1, 1, tzinfo=UTC)
STEP = timedelta(seconds=15)


@pytest.fixture
def replica() -> Iterator[VllmReplica]:
    with VllmReplica() as server:
        yield server


@pytest.fixture
def second() -> Iterator[VllmReplica]:
    with VllmReplica(started_at=1_700_000_100.0) as server:
        yield server


def source(*urls: str, kind: str = "vllm", **extra: object) -> ScrapeSource:
    config = TelemetryArmConfig.model_validate({"kind": kind, "metrics_url": list(urls), **extra})
    return ScrapeSource("speculative", config, timeout_s=2.0, max_bytes=1 << 20)


class TestVllmReplica:
    def test_two_scrapes_give_the_interval(self, replica: VllmReplica) -> None:
        """Counts finished before the first scrape are not in the interval; those between
        are: requests of every finish reason, errors of `error`, latency buckets, the
        mean of the two scrapes' gauges, the draft counters' differences."""
        replica.finish(100)
        replica.draft(50, 200, 100)
        replica.load(running=4, waiting=0)
        with source(replica.url) as arm:
            first = arm.read(T0)
            replica.finish(60, e2e=1.2, ttft=0.07, itl=0.03)
            replica.finish(20, reason="length", e2e=2.2, ttft=0.3, itl=0.045)
            replica.finish(5, reason="error", e2e=0.4, ttft=0.07, itl=0.03)
            replica.draft(100, 400, 260)
            replica.load(running=8, waiting=2)
            window = telemetry_window(first, arm.read(T0 + STEP))
        interval = window.interval
        assert (interval.requests, interval.errors) == (85, 5)
        assert window.replicas == 1 and window.missing == ()
        assert interval.e2e is not None and interval.e2e.count == 85
        assert interval.ttft is not None and interval.itl is not None
        # 65 of 85 at or under 1.5 s; the median lies in (1.0, 1.5], the P99 in (2.0, 2.5]
        assert interval.e2e.quantile(0.5) == pytest.approx(1.0 + 0.5 * (42.5 - 5) / 60)
        assert 2.0 < (interval.e2e.quantile(0.99) or 0) <= 2.5
        assert 0.06 < (interval.ttft.quantile(0.5) or 0) <= 0.08
        assert (interval.running, interval.waiting) == (6.0, 1.0)
        assert (interval.drafts, interval.draft_tokens, interval.accepted_tokens) == (100, 400, 260)

    def test_a_restart_counts_from_zero(self, replica: VllmReplica) -> None:
        """A counter that went down restarted: its new value is the increase."""
        replica.finish(500)
        replica.finish(9, reason="error")
        with source(replica.url) as arm:
            first = arm.read(T0)
            replica.restart(started_at=(T0 + STEP / 2).timestamp())
            replica.finish(30)
            replica.finish(2, reason="error")
            window = telemetry_window(first, arm.read(T0 + STEP))
        interval = window.interval
        assert (interval.requests, interval.errors) == (32, 2)
        assert interval.e2e is not None and interval.e2e.count == 32
        assert window.restarted == (replica.url,)

    def test_a_restart_is_seen_when_counters_grew_past_their_old_values(
        self, replica: VllmReplica
    ) -> None:
        """A new process_start_time_seconds is a restart even when every counter has since
        grown past its old value (a plain decrease check would count 110 − 10 = 100)."""
        replica.finish(10)
        with source(replica.url) as arm:
            first = arm.read(T0)
            replica.restart(started_at=(T0 + STEP / 2).timestamp())
            replica.finish(110)
            window = telemetry_window(first, arm.read(T0 + STEP))
        interval = window.interval
        assert interval.requests == 110
        assert interval.e2e is not None and interval.e2e.count == 110

    def test_two_replicas_are_summed(self, replica: VllmReplica, second: VllmReplica) -> None:
        """Counts, buckets and gauges of both replicas add up, the draft counters too (so
        acceptance is pooled over all drafts, not a mean of the replicas')."""
        with source(replica.url, second.url) as arm:
            first = arm.read(T0)
            replica.finish(40)
            replica.finish(1, reason="error")
            replica.draft(10, 40, 30)
            replica.load(2, 0)
            second.finish(60, e2e=3.0)
            second.finish(3, reason="error")
            second.draft(30, 120, 30)
            second.load(6, 4)
            window = telemetry_window(first, arm.read(T0 + STEP))
        interval = window.interval
        assert (window.replicas, interval.requests, interval.errors) == (2, 104, 4)
        assert interval.e2e is not None and interval.e2e.count == 104
        assert (interval.running, interval.waiting) == (4.0, 2.0)
        assert (interval.drafts, interval.accepted_tokens) == (40, 60)

    def test_an_arm_without_speculation_names_what_is_missing(self) -> None:
        """A server without the draft counters: they count 0 (no acceptance), and the
        window names the signals its table expected and the exposition lacked."""
        plain = TextReplica('vllm:request_success_total{finished_reason="stop"} 3\n')
        with plain, source(plain.url) as arm:
            first = arm.read(T0)
            window = telemetry_window(first, arm.read(T0 + STEP))
        assert (window.interval.drafts, window.interval.reported_acceptance_length) == (0, None)
        assert {"drafts", "e2e", "running"} <= set(window.missing)
        assert window.interval.requests == 0


class TestGateways:
    def test_istio_counts_the_destination_report_and_a_new_503_series(self) -> None:
        """Istio's two reports of one request count once; a 503 series first seen in the
        later scrape counted up from zero within the interval; the millisecond histogram
        is read in seconds; the arm's labels pick its workload."""
        head = "# TYPE istio_requests_total counter\n"
        line = (
            'istio_requests_total{{reporter="{r}",destination_workload="{w}",'
            'response_code="{c}"}} {v}\n'
        )

        def exposition(ok: int, failed: int | None) -> str:
            text = head
            for reporter in ("source", "destination"):
                text += line.format(r=reporter, w="spec", c="200", v=ok)
                text += line.format(r=reporter, w="other", c="200", v=ok * 10)
                if failed is not None:
                    text += line.format(r=reporter, w="spec", c="503", v=failed)
            return text + (
                "# TYPE istio_request_duration_milliseconds histogram\n"
                'istio_request_duration_milliseconds_bucket{reporter="destination",'
                f'destination_workload="spec",le="250"}} {ok}\n'
                'istio_request_duration_milliseconds_bucket{reporter="destination",'
                f'destination_workload="spec",le="+Inf"}} {ok}\n'
            )

        with TextReplica(exposition(100, None)) as gateway:
            extra = {"gateway": "istio", "labels": {"destination_workload": "spec"}}
            with source(gateway.url, kind="gateway", **extra) as arm:
                first = arm.read(T0)
                gateway.text = exposition(150, 7)
                window = telemetry_window(first, arm.read(T0 + STEP))
        interval = window.interval
        assert (interval.requests, interval.errors) == (57, 7)
        assert interval.e2e is not None and interval.e2e.bounds == (0.25, float("inf"))
        assert interval.e2e.quantile(0.5) == pytest.approx(0.125)

    def test_istio_counts_4xx_apart_from_5xx(self) -> None:
        """A gateway reports every answer's status: 4xx are `client_errors`, counted
        among the requests and apart from the 5xx errors, and carried into the interval
        the telemetry gates read."""
        line = 'istio_requests_total{{reporter="destination",response_code="{c}"}} {v}\n'

        def exposition(ok: int, refused: int, failed: int) -> str:
            return "# TYPE istio_requests_total counter\n" + "".join(
                line.format(c=code, v=value)
                for code, value in (
                    ("200", ok),
                    ("404", refused),
                    ("429", refused),
                    ("503", failed),
                )
            )

        with (
            TextReplica(exposition(100, 10, 2)) as gateway,
            source(gateway.url, kind="gateway", gateway="istio") as arm,
        ):
            first = arm.read(T0)
            gateway.text = exposition(160, 25, 3)
            window = telemetry_window(first, arm.read(T0 + STEP))
        assert (
            window.interval.requests,
            window.interval.errors,
            window.interval.client_errors,
        ) == (91, 1, 30)
        counted = window.interval.count_interval()
        assert counted is not None and counted.client_errors == 30

    def test_an_engine_counts_no_4xx(self, replica: VllmReplica) -> None:
        """vLLM's own counters never see a 4xx (its API server refuses the request before
        the engine counts it): `client_errors` stays None, not 0."""
        with source(replica.url) as arm:
            first = arm.read(T0)
            replica.finish(5)
            window = telemetry_window(first, arm.read(T0 + STEP))
        assert window.interval.requests == 5 and window.interval.client_errors is None

    def test_a_go_counter_without_total_is_read(self) -> None:
        """ingress-nginx exposes `nginx_ingress_controller_requests` without `_total`;
        the parser names it with the suffix, and the table finds it either way."""

        def exposition(ok: int, failed: int) -> str:
            return (
                "# TYPE nginx_ingress_controller_requests counter\n"
                f'nginx_ingress_controller_requests{{status="200"}} {ok}\n'
                f'nginx_ingress_controller_requests{{status="502"}} {failed}\n'
            )

        gateway = TextReplica(exposition(10, 1))
        with gateway, source(gateway.url, kind="gateway", gateway="ingress-nginx") as arm:
            first = arm.read(T0)
            gateway.text = exposition(30, 4)
            window = telemetry_window(first, arm.read(T0 + STEP))
        interval = window.interval
        assert (interval.requests, interval.errors) == (23, 3)


class TestFailures:
    @pytest.mark.parametrize(
        ("setup", "reason"),
        [
            (lambda r: setattr(r, "status", 503), "HTTP 503"),
            (lambda r: setattr(r, "padding_bytes", 2 << 20), "more than 1048576 bytes"),
            (lambda r: setattr(r, "delay_s", 5.0), "no whole answer within 2 s"),
            (lambda r: setattr(r, "text", 'broken{a="1" 2\n'), "parser refuses"),
        ],
        ids=["status", "too-large", "too-slow", "malformed"],
    )
    def test_a_bad_answer_is_a_failure_with_its_reason(self, setup: object, reason: str) -> None:
        """The replica's failure names why; `read` returns instead of raising."""
        with TextReplica("vllm:request_success_total 1\n") as bad:
            setup(bad)  # type: ignore[operator]
            with source(bad.url) as arm:
                reading = arm.read(T0)
        assert reading.replicas == ()
        assert len(reading.failures) == 1
        assert reason in reading.failures[0].reason

    def test_a_failed_replica_costs_only_its_own_counts(
        self, replica: VllmReplica, second: VllmReplica
    ) -> None:
        """With one of two replicas failing at the later scrape, the window counts the
        other alone and names the failed one; a refused connection is a failure too."""
        with source(replica.url, second.url, "http://127.0.0.1:9/metrics") as arm:
            first = arm.read(T0)
            replica.finish(10)
            second.finish(20)
            second.status = 500
            later = arm.read(T0 + STEP)
            window = telemetry_window(first, later)
        assert window.replicas == 1 and window.interval.requests == 10
        assert set(window.failed) == {second.url, "http://127.0.0.1:9/metrics"}
        assert any("127.0.0.1:9" in f.reason for f in later.failures)
