"""The PromQL source (canaryd.telemetry.promql_source) against a real Prometheus on loopback
scraping real loopback expositions (prometheus-client registries under vLLM's names, and
the texts of Istio, ingress-nginx, Envoy and SGLang): the shipped templates, evaluated as
instant queries at two instants, give the same interval as a direct scrape of the same
replicas at those instants; a restarted replica counts from zero; a gateway's 503 series
that appears mid-interval counts up from zero, its millisecond histogram read in seconds;
every kind's templates run on Prometheus. Prometheus away, a query it refuses, a range
vector, no series or an answer too large is one failed reading with its reason, never an
exception; in the daemon's scrape job, Prometheus away is counted at every scrape and
logged once. The envelope parser is also checked on answers recorded from this
Prometheus (2.42)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from canaryd.config import load_settings
from canaryd.daemon.telemetry import TelemetryJob
from canaryd.metrics import CanarydMetrics
from canaryd.store import SqlStore
from canaryd.telemetry.config import TelemetryArmConfig, TelemetryConfig
from canaryd.telemetry.deltas import telemetry_window
from canaryd.telemetry.promql_source import PromqlSource, QueryFailedError, parse_answer
from canaryd.telemetry.scraper import TelemetryScraper
from canaryd.telemetry.signals import ArmReading
from tests.canaryd.telemetry.prometheus import PrometheusServer, free_port
from tests.canaryd.telemetry.replica import TextReplica, VllmReplica

BASELINE = 'deployment="llama-baseline"'
CANARY = 'deployment="llama-canary"'


def istio(ok: int, failed: int | None) -> str:
    """A sidecar's exposition: both reports of each request, another workload's series,
    a 503 series only once there was a 503, the duration histogram in milliseconds."""
    line = (
        'istio_requests_total{{reporter="{r}",destination_workload="{w}",'
        'response_code="{c}"}} {v}\n'
    )
    text = "# TYPE istio_requests_total counter\n"
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


def nginx(ok: int, failed: int) -> str:
    """ingress-nginx's Go counter, exposed without `_total`."""
    line = 'nginx_ingress_controller_requests{{ingress="llm",status="{s}"}} {v}\n'
    return (
        "# TYPE nginx_ingress_controller_requests counter\n"
        + line.format(s="200", v=ok)
        + line.format(s="502", v=failed)
    )


def sglang(requests: int, accept_length: float) -> str:
    """An SGLang server: its request counter, e2e histogram, queue gauges and acceptance
    gauge (it exports no draft counters)."""
    labels = 'model_name="llama"'
    return (
        "# TYPE sglang:num_requests_total counter\n"
        f"sglang:num_requests_total{{{labels}}} {requests}\n"
        "# TYPE sglang:e2e_request_latency_seconds histogram\n"
        f'sglang:e2e_request_latency_seconds_bucket{{{labels},le="1.0"}} {requests}\n'
        f'sglang:e2e_request_latency_seconds_bucket{{{labels},le="+Inf"}} {requests}\n'
        "# TYPE sglang:num_running_reqs gauge\n"
        f"sglang:num_running_reqs{{{labels}}} 4\n"
        "# TYPE sglang:num_queue_reqs gauge\n"
        f"sglang:num_queue_reqs{{{labels}}} 1\n"
        "# TYPE sglang:spec_accept_length gauge\n"
        f"sglang:spec_accept_length{{{labels}}} {accept_length}\n"
    )


def envoy(requests: int, failed: int) -> str:
    """Envoy's cluster stats as /stats/prometheus writes them: counters without `_total`
    but `upstream_rq_total`, the request time histogram in milliseconds."""
    cluster = 'envoy_cluster_name="llm"'
    return (
        "# TYPE envoy_cluster_upstream_rq_total counter\n"
        f"envoy_cluster_upstream_rq_total{{{cluster}}} {requests}\n"
        "# TYPE envoy_cluster_upstream_rq_xx counter\n"
        f'envoy_cluster_upstream_rq_xx{{envoy_response_code_class="2",{cluster}}} '
        f"{requests - failed}\n"
        f'envoy_cluster_upstream_rq_xx{{envoy_response_code_class="5",{cluster}}} {failed}\n'
        "# TYPE envoy_cluster_upstream_rq_time histogram\n"
        f'envoy_cluster_upstream_rq_time_bucket{{{cluster},le="500"}} {requests}\n'
        f'envoy_cluster_upstream_rq_time_bucket{{{cluster},le="+Inf"}} {requests}\n'
    )


@dataclass
class Fleet:
    """The servers every test of this module shares: two baseline vLLM replicas, one
    canary replica, an Istio sidecar, an ingress-nginx controller, an Envoy and an SGLang
    server, all scraped by one Prometheus."""

    prometheus: PrometheusServer
    first: VllmReplica
    second: VllmReplica
    canary: VllmReplica
    istio: TextReplica
    nginx: TextReplica
    envoy: TextReplica
    sglang: TextReplica

    def settled(self) -> None:
        """Waits until Prometheus holds every vLLM replica's current requests and drafts."""
        arms = {BASELINE: (self.first, self.second), CANARY: (self.canary,)}
        for selector, replicas in arms.items():
            for series in (REQUESTS, "vllm:spec_decode_num_drafts_total"):
                self.prometheus.wait_for_value(
                    total(selector, series), sum(r.total(series) for r in replicas)
                )


REQUESTS = "vllm:request_success_total"


def total(selector: str, series: str = REQUESTS) -> str:
    return f"sum({series}{{{selector}}})"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Every server answers on its own thread, so Prometheus' background scrapes start no
    thread during a test."""
    with (
        VllmReplica(1_700_000_000.0, threaded=False) as first,
        VllmReplica(1_700_000_100.0, threaded=False) as second,
        VllmReplica(1_700_000_200.0, threaded=False) as canary,
        TextReplica(istio(100, None), threaded=False) as sidecar,
        TextReplica(nginx(10, 0), threaded=False) as controller,
        TextReplica(envoy(10, 0), threaded=False) as proxy,
        TextReplica(sglang(10, 3.0), threaded=False) as server,
    ):
        targets = {
            "llama-baseline": [first.url, second.url],
            "llama-canary": [canary.url],
            "istio": [sidecar.url],
            "ingress": [controller.url],
            "envoy": [proxy.url],
            "sglang": [server.url],
        }
        with PrometheusServer(tmp_path_factory.mktemp("prometheus"), targets) as prometheus:
            prometheus.wait_until("up == 1", lambda result: len(result) == len(targets) + 1)
            yield Fleet(prometheus, first, second, canary, sidecar, controller, proxy, server)


def arm(**fields: Any) -> TelemetryArmConfig:
    return TelemetryArmConfig.model_validate(fields)


def promql(url: str, *, max_bytes: int = 1 << 20, **fields: Any) -> PromqlSource:
    return PromqlSource(
        "speculative",
        arm(prometheus_url=url, **fields),
        timeout_s=5.0,
        max_bytes=max_bytes,
        range_s=15.0,
    )


def now() -> datetime:
    return datetime.now(UTC)


def the_failure(reading: ArmReading) -> str:
    assert reading.replicas == () and len(reading.failures) == 1
    return reading.failures[0].reason


@pytest.mark.slow  # a Prometheus subprocess, shared by the module
class TestAgainstPrometheus:
    def test_the_same_interval_as_a_direct_scrape(self, fleet: Fleet) -> None:
        """Both arms read through Prometheus and directly at the same two instants give
        equal intervals: requests, errors, every latency bucket, load, drafts; the
        baseline's two replicas are two replicas summed."""
        config = TelemetryConfig.model_validate(
            {
                "timeout_s": 5.0,
                "arms": {
                    "baseline": {"prometheus_url": fleet.prometheus.url, "selector": BASELINE},
                    "speculative": {"prometheus_url": fleet.prometheus.url, "selector": CANARY},
                },
            }
        )
        direct = TelemetryConfig.model_validate(
            {
                "timeout_s": 5.0,
                "arms": {
                    "baseline": {"metrics_url": [fleet.first.url, fleet.second.url]},
                    "speculative": {"metrics_url": fleet.canary.url},
                },
            }
        )
        fleet.first.finish(100)
        fleet.canary.draft(50, 200, 120)
        with TelemetryScraper(config) as through, TelemetryScraper(direct) as scraped:
            fleet.settled()
            start = now()
            assert all(s.window is None for s in through.scrape(start).values())
            scraped.scrape(start)
            fleet.first.finish(40, e2e=0.9)
            fleet.second.finish(35, e2e=2.2, ttft=0.3)
            fleet.second.finish(3, reason="error", e2e=0.4)
            fleet.first.load(running=5, waiting=1)
            fleet.canary.finish(70, itl=0.012)
            fleet.canary.finish(1, reason="error")
            fleet.canary.draft(300, 1500, 900)
            fleet.settled()
            end = now()
            promql_windows = through.scrape(end)
            direct_windows = scraped.scrape(end)
        for name in ("baseline", "speculative"):
            from_promql = promql_windows[name].window
            from_scrape = direct_windows[name].window
            assert from_promql is not None and from_scrape is not None
            assert from_promql.interval == from_scrape.interval
            assert from_promql.replicas == from_scrape.replicas
        baseline = promql_windows["baseline"].window
        speculative = promql_windows["speculative"].window
        assert baseline is not None and speculative is not None
        baseline_interval = baseline.interval
        assert (baseline_interval.requests, baseline_interval.errors) == (78, 3)
        assert baseline.replicas == 2
        assert baseline_interval.e2e is not None and baseline_interval.e2e.count == 78
        speculative_interval = speculative.interval
        assert (speculative_interval.requests, speculative_interval.errors) == (71, 1)
        assert (speculative_interval.drafts, speculative_interval.accepted_tokens) == (300, 900)
        assert speculative.missing == ()

    def test_a_restarted_replica_counts_from_zero(self, fleet: Fleet) -> None:
        """A replica whose process started anew counts from zero, the error counter too,
        though it has grown past its old value (process_start_time_seconds, queried for
        the engines' kinds)."""
        fleet.canary.finish(500)
        fleet.canary.finish(1, reason="error")
        with promql(fleet.prometheus.url, selector=CANARY) as source:
            fleet.settled()
            first = source.read(now())
            fleet.canary.restart(started_at=now().timestamp())
            fleet.canary.finish(30)
            fleet.canary.finish(2, reason="error")
            fleet.settled()
            window = telemetry_window(first, source.read(now()))
        interval = window.interval
        assert (interval.requests, interval.errors, window.replicas) == (32, 2, 1)
        assert interval.e2e is not None and interval.e2e.count == 32

    def test_istio_counts_the_destination_report_and_a_new_503_series(self, fleet: Fleet) -> None:
        """Istio's template counts each request once; the 503 series first seen in the
        later reading counted up from zero; before it the errors signal is absent, not a
        failure; milliseconds are read in seconds."""
        config: dict[str, Any] = {
            "kind": "gateway",
            "gateway": "istio",
            "selector": 'destination_workload="spec"',
        }
        with promql(fleet.prometheus.url, **config) as source:
            fleet.istio.text = istio(100, None)
            total = 'sum(istio_requests_total{destination_workload="spec"})'
            fleet.prometheus.wait_for_value(total, 200)
            first = source.read(now())
            assert first.failures == ()
            fleet.istio.text = istio(150, 7)
            fleet.prometheus.wait_for_value(total, 314)
            window = telemetry_window(first, source.read(now()))
        interval = window.interval
        assert (interval.requests, interval.errors) == (57, 7)
        assert interval.e2e is not None and interval.e2e.bounds == (0.25, float("inf"))
        assert interval.e2e.quantile(0.5) == pytest.approx(0.125)

    def test_ingress_nginx_counter_without_total(self, fleet: Fleet) -> None:
        """ingress-nginx's counter is stored under its own name, without `_total`; with no
        process start time to read, a restart shows as its counters going down: believed,
        not counted (that interval leaves the controller out), and counted from there."""
        config: dict[str, Any] = {
            "kind": "gateway",
            "gateway": "ingress-nginx",
            "selector": 'ingress="llm"',
        }
        with promql(fleet.prometheus.url, **config) as source:
            fleet.nginx.text = nginx(10, 0)
            total = "sum(nginx_ingress_controller_requests)"
            fleet.prometheus.wait_for_value(total, 10)
            first = source.read(now())
            fleet.nginx.text = nginx(50, 4)
            fleet.prometheus.wait_for_value(total, 54)
            second = source.read(now())
            window = telemetry_window(first, second)
            fleet.nginx.text = nginx(3, 1)  # the controller restarted
            fleet.prometheus.wait_for_value(total, 4)
            third = source.read(now())
            after_restart = telemetry_window(second, third)
            fleet.nginx.text = nginx(9, 2)
            fleet.prometheus.wait_for_value(total, 11)
            later = telemetry_window(third, source.read(now()))
        interval = window.interval
        assert (interval.requests, interval.errors) == (44, 4)
        assert "e2e" in window.missing
        assert after_restart.replicas == 0 and after_restart.reset and not after_restart.refused
        assert (later.interval.requests, later.interval.errors) == (7, 1)

    def test_envoy_reads_the_5xx_class_and_milliseconds(self, fleet: Fleet) -> None:
        """Envoy's template: all upstream requests, the `5` response class, the request
        time histogram scaled from milliseconds."""
        config: dict[str, Any] = {
            "kind": "gateway",
            "gateway": "envoy",
            "selector": 'envoy_cluster_name="llm"',
        }
        with promql(fleet.prometheus.url, **config) as source:
            fleet.envoy.text = envoy(10, 0)
            total = "sum(envoy_cluster_upstream_rq_total)"
            fleet.prometheus.wait_for_value(total, 10)
            first = source.read(now())
            fleet.envoy.text = envoy(60, 3)
            fleet.prometheus.wait_for_value(total, 60)
            window = telemetry_window(first, source.read(now()))
        interval = window.interval
        assert (interval.requests, interval.errors) == (50, 3)
        assert interval.e2e is not None and interval.e2e.bounds == (0.5, float("inf"))

    def test_sglang_reads_its_counter_gauges_and_acceptance(self, fleet: Fleet) -> None:
        """SGLang's templates: the request counter's difference, the queue gauges, and its
        own acceptance length averaged over `$range`; no errors signal to read."""
        with promql(fleet.prometheus.url, kind="sglang", selector='model_name="llama"') as src:
            fleet.sglang.text = sglang(10, 3.0)
            total = "sum(sglang:num_requests_total)"
            fleet.prometheus.wait_for_value(total, 10)
            first = src.read(now())
            fleet.sglang.text = sglang(25, 3.0)
            fleet.prometheus.wait_for_value(total, 25)
            window = telemetry_window(first, src.read(now()))
        interval = window.interval
        assert (interval.requests, interval.errors) == (15, None)
        assert (interval.running, interval.waiting) == (4.0, 1.0)
        assert interval.drafts is None
        assert interval.reported_acceptance_length == pytest.approx(3.0)
        assert interval.e2e is not None and interval.e2e.count == 15
        assert set(window.missing) == {"ttft", "itl", "acceptance_rate"}


@pytest.mark.slow  # a Prometheus subprocess, shared by the module
class TestFailures:
    def test_prometheus_away(self) -> None:
        """Nothing listening: one failure naming the API and the connection error."""
        url = f"http://127.0.0.1:{free_port()}"
        with promql(url) as source:
            reason = the_failure(source.read(now()))
        assert reason.startswith(f"{url}: ") and "ConnectError" in reason

    def test_a_query_prometheus_refuses(self, fleet: Fleet) -> None:
        """`status: error` (HTTP 400, bad_data) fails the whole reading, naming the signal
        and Prometheus' own message; the other signals' answers are not kept."""
        with promql(fleet.prometheus.url, selector=CANARY, queries={"errors": "sum(("}) as src:
            reason = the_failure(src.read(now()))
        assert ": errors: bad_data: " in reason and "parse error" in reason

    def test_a_range_vector_is_refused(self, fleet: Fleet) -> None:
        query = "vllm:request_success_total{$selector}[1m]"
        with promql(fleet.prometheus.url, selector=CANARY, queries={"requests": query}) as src:
            reason = the_failure(src.read(now()))
        assert "returned a matrix, not an instant vector" in reason

    def test_no_series_for_any_signal(self, fleet: Fleet) -> None:
        """A selector that matches nothing is a failure, not an interval of zeros."""
        with promql(fleet.prometheus.url, selector='deployment="nobody"') as source:
            reason = the_failure(source.read(now()))
        assert "no series for any signal" in reason and "check selector" in reason

    def test_an_answer_too_large(self, fleet: Fleet) -> None:
        query = "{__name__=~'vllm:.+'}"
        with promql(
            fleet.prometheus.url, max_bytes=2000, kind="custom", queries={"running": query}
        ) as src:
            reason = the_failure(src.read(now()))
        assert "sent more than 2000 bytes" in reason


@pytest.mark.slow  # a Prometheus subprocess, shared by the module
class TestInTheDaemonJob:
    def test_prometheus_away_is_counted_every_scrape_and_logged_once(
        self, fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The daemon's scrape job with one arm read through Prometheus and one whose
        Prometheus is away: the first arm's intervals are stored; the other's failures
        are counted at every scrape (outcome="failed") and logged once, with the reason."""
        monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
        away = f"http://127.0.0.1:{free_port()}"
        config = tmp_path / "canaryd.toml"
        config.write_text(
            '[arms.baseline]\nkind = "fake"\n'
            '[arms.speculative]\nkind = "fake"\nspeculative = true\n'
            f'[storage]\nurl = "sqlite:///{tmp_path / "canaryd.db"}"\n'
            "[telemetry]\ntimeout_s = 2.0\n"
            f'[telemetry.arms.baseline]\nprometheus_url = "{fleet.prometheus.url}"\n'
            f"selector = '{BASELINE}'\n"
            f'[telemetry.arms.speculative]\nprometheus_url = "{away}"\n'
        )
        settings = load_settings(config)
        metrics = CanarydMetrics()
        with SqlStore.open(settings.storage.resolved_url(), create=True) as store:
            job = TelemetryJob(
                lambda: settings,
                metrics.telemetry,
                store_metrics=metrics.store,
                store=lambda: store,
                leading=lambda: True,
            )
            job.start(None)
            try:
                with capture_logs() as logs:
                    for _ in range(3):
                        fleet.first.finish(10)
                        fleet.settled()
                        job.run(now())
            finally:
                job.close()
            stored = store.telemetry("baseline")
            assert [row.interval.requests for row in stored] == [10, 10]
            assert store.telemetry("speculative") == []
        failed = [entry for entry in logs if entry["event"] == "telemetry.replica_failed"]
        assert len(failed) == 1 and failed[0]["arm"] == "speculative"
        assert "ConnectError" in failed[0]["reason"]

        def scrapes(arm: str, outcome: str) -> float:
            labels = {"arm": arm, "outcome": outcome}
            value = metrics.registry.get_sample_value("canaryd_telemetry_scrapes_total", labels)
            return value or 0.0

        assert scrapes("speculative", "failed") == 3 and scrapes("speculative", "ok") == 0
        assert scrapes("baseline", "ok") == 6  # two replicas (instances) a scrape


class TestParseAnswer:
    """Answers recorded from Prometheus 2.42's /api/v1/query."""

    def test_a_vector(self) -> None:
        body = (
            b'{"status":"success","data":{"resultType":"vector","result":[{"metric":'
            b'{"instance":"127.0.0.1:35319"},"value":[1796292721.414,"12"]}]}}'
        )
        assert parse_answer(body, "q") == [({"instance": "127.0.0.1:35319"}, 12.0)]

    def test_a_scalar_nan_is_no_series(self) -> None:
        body = (
            b'{"status":"success","data":{"resultType":"scalar","result":[1796292692.578,"NaN"]}}'
        )
        assert parse_answer(body, "scalar(up)") == []

    def test_an_error(self) -> None:
        body = (
            b'{"status":"error","errorType":"bad_data","error":"invalid parameter \\"query\\": '
            b'1:6: parse error: unclosed left parenthesis"}'
        )
        with pytest.raises(QueryFailedError, match=r"bad_data: invalid parameter .* in 'sum\(\('"):
            parse_answer(body, "sum((")

    def test_text_while_starting(self) -> None:
        """Prometheus answers 503 with plain text before it is ready."""
        with pytest.raises(QueryFailedError, match="not the query API's JSON"):
            parse_answer(b"Service Unavailable", "q")

    def test_a_native_histogram_sample_is_skipped(self) -> None:
        body = (
            b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},'
            b'"histogram":[1,{"count":"3","sum":"1","buckets":[]}]}]}}'
        )
        assert parse_answer(body, "q") == []
