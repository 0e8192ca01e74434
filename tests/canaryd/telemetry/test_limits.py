"""Every telemetry read bounded (canaryd.telemetry.limits), through the real sources against
real HTTP servers on loopback: a replica with more series of a signal than `max_series`
(250k fabricated series) or a histogram with more `le` bounds than `max_buckets` (139k) is
refused with that bound named; an arm whose replicas' histograms together pass the cap
gives no window; a gzip bomb stops inflating at `max_bytes`; a line longer than
`MAX_LINE_BYTES` is refused; an exposition still parsing at `timeout_s` is refused then;
eight replicas at the byte cap cost a few MiB, not eight bodies; PromQL answers share one
byte budget and the same series and bucket caps. An honest exposition, plain or gzip,
reads the same under the caps."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from canaryd.telemetry.config import TelemetryArmConfig, TelemetryConfig
from canaryd.telemetry.deltas import telemetry_window
from canaryd.telemetry.limits import DEFAULT_MAX_BUCKETS, DEFAULT_MAX_SERIES
from canaryd.telemetry.promql_source import PromqlSource
from canaryd.telemetry.scrape import MAX_LINE_BYTES, ScrapeSource, parse_exposition
from canaryd.telemetry.scraper import SUMMED, TelemetryScraper
from canaryd.telemetry.signals import ArmReading, ReplicaFailure
from tests.support.hostile_metrics import (
    MetricsEndpoint,
    gzip_bomb,
    many_bounds,
    many_series,
    padded,
    vllm_exposition,
)

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
STEP = timedelta(seconds=15)
MiB = 1 << 20
FIXTURES = Path(__file__).parents[2] / "fixtures" / "servers"


def source(*urls: str, timeout_s: float = 10.0, max_bytes: int = 8 * MiB) -> ScrapeSource:
    config = TelemetryArmConfig.model_validate({"metrics_url": list(urls)})
    return ScrapeSource("speculative", config, timeout_s=timeout_s, max_bytes=max_bytes)


def refusal(reading: ArmReading) -> ReplicaFailure:
    """The reading's one failure, which must be a refusal."""
    assert reading.replicas == () and len(reading.failures) == 1
    failure = reading.failures[0]
    assert failure.refusal is not None, failure.reason
    return failure


class TestSeriesAndBuckets:
    def test_250k_fabricated_series_are_refused_by_the_series_cap(self) -> None:
        """250,000 series of finished requests (one per fabricated label, 13 MB, let in by
        a raised byte cap) would credit 250,000 requests a scrape: the replica is refused
        once its series of `requests` pass `max_series`, naming the setting."""
        with (
            MetricsEndpoint(lambda n: many_series(250_000, n)) as endpoint,
            source(endpoint.url, max_bytes=64 * MiB) as arm,
        ):
            failure = refusal(arm.read(T0))
        assert failure.refusal == "series"
        assert f"more than {DEFAULT_MAX_SERIES} series of requests" in failure.reason
        assert "telemetry.max_series" in failure.reason

    def test_139k_le_bounds_are_refused_by_the_bucket_cap(self) -> None:
        """An e2e histogram of 139,000 distinct bounds (7.6 MB, under the byte cap) would be
        stored whole in every interval: the replica is refused at the 65th bound."""
        with (
            MetricsEndpoint(lambda n: many_bounds(139_000, 100 * n)) as endpoint,
            source(endpoint.url) as arm,
        ):
            failure = refusal(arm.read(T0))
        assert failure.refusal == "buckets"
        assert f"a histogram of e2e with more than {DEFAULT_MAX_BUCKETS}" in failure.reason

    def test_a_histogram_at_the_cap_is_read(self) -> None:
        """`max_buckets` bounds, +Inf included, are read; one more is refused."""
        at_cap = DEFAULT_MAX_BUCKETS - 1  # finite bounds, then +Inf
        with (
            MetricsEndpoint(lambda n: many_bounds(at_cap, 100 * n)) as fits,
            MetricsEndpoint(lambda n: many_bounds(at_cap + 1, 100 * n)) as over,
        ):
            with source(fits.url) as arm:
                first = arm.read(T0)
                window = telemetry_window(first, arm.read(T0 + STEP))
            with source(over.url) as arm:
                assert refusal(arm.read(T0)).refusal == "buckets"
        e2e = window.interval.e2e
        assert e2e is not None and len(e2e.bounds) == DEFAULT_MAX_BUCKETS and e2e.count == 100

    def test_the_arms_summed_histogram_is_capped_too(self) -> None:
        """Two replicas of 40 bounds each, all different: each passes the cap, their sum
        of 80 does not, and the arm's window is refused (no interval), with the bound
        named."""

        def layout(offset: float) -> Callable[[int], str]:
            return lambda n: many_bounds(39, 100 * n, offset=offset)

        with ExitStack() as stack:
            urls = [
                stack.enter_context(MetricsEndpoint(layout(offset))).url for offset in (0.0, 0.0005)
            ]
            config = TelemetryConfig.model_validate(
                {"timeout_s": 5.0, "arms": {"speculative": {"metrics_url": urls}}}
            )
            with TelemetryScraper(config) as scraper:
                scraper.scrape(T0)
                scrape = scraper.scrape(T0 + STEP)["speculative"]
        assert scrape.window is None and scrape.refusal is not None
        assert scrape.refusal.url == SUMMED and scrape.refusal.refusal == "buckets"
        assert "telemetry.max_buckets" in scrape.refusal.reason


class TestBytes:
    def test_a_gzip_bomb_stops_inflating_at_the_cap(self) -> None:
        """A 64 KiB gzip body that inflates to 64 MiB, under a 1 MiB cap: refused, and no
        more than about the cap (and a chunk) was ever inflated in memory."""
        bomb = gzip_bomb(64 * MiB)
        assert len(bomb) < 256 * 1024
        with (
            MetricsEndpoint(lambda n: bomb, encoded=True) as endpoint,
            source(endpoint.url, max_bytes=MiB) as arm,
        ):
            tracemalloc.start()
            try:
                failure = refusal(arm.read(T0))
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        assert failure.refusal == "bytes" and "more than 1048576 bytes" in failure.reason
        assert peak < 2 * MiB

    def test_an_honest_gzip_exposition_reads_as_plain_text(self) -> None:
        """gzip is asked for and decoded: the same interval as the plain exposition."""
        windows = []
        for gzip in (False, True):
            with (
                MetricsEndpoint(lambda n: vllm_exposition(100 * n, n), gzip=gzip) as endpoint,
                source(endpoint.url) as arm,
            ):
                first = arm.read(T0)
                windows.append(telemetry_window(first, arm.read(T0 + STEP)).interval)
        assert windows[0] == windows[1]
        assert (windows[1].requests, windows[1].errors) == (100, 1)

    @pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
    @pytest.mark.parametrize(
        "name", ["vllm_metrics_before.txt", "vllm_metrics_after.txt", "vllm_metrics_restarted.txt"]
    )
    def test_the_streamed_parse_reads_what_the_whole_parse_reads(
        self, name: str, gzip: bool
    ) -> None:
        """Recorded vLLM expositions (HELP and TYPE lines, `_created` samples, two engines):
        read as they arrive, without their TYPE lines, they give the reading a parse of the
        whole text gives."""
        text = (FIXTURES / name).read_text()
        with MetricsEndpoint(lambda n: text, gzip=gzip) as endpoint, source(endpoint.url) as arm:
            streamed = arm.read(T0)
            whole = arm.reader.read(endpoint.url, parse_exposition(text))
        assert streamed.failures == () and streamed.replicas == (whole,)
        assert whole.counters["drafts"]

    def test_a_line_longer_than_the_line_cap_is_refused(self) -> None:
        """A label value of a megabyte is no telemetry: refused before it is held whole."""
        text = f'vllm:request_success_total{{id="{"x" * MiB}"}} 1\n'
        with MetricsEndpoint(lambda n: text) as endpoint, source(endpoint.url) as arm:
            failure = refusal(arm.read(T0))
        assert failure.refusal == "bytes"
        assert f"a line longer than {MAX_LINE_BYTES} bytes" in failure.reason


class TestDeadline:
    def test_an_exposition_still_parsing_at_the_deadline_is_refused(self) -> None:
        """8 MiB of valid samples take seconds to parse: the deadline is checked while
        parsing, so the read ends at `timeout_s`, not when the parse would."""
        body = padded(8 * MiB - 1, 100)
        with (
            MetricsEndpoint(lambda n: body) as endpoint,
            source(endpoint.url, timeout_s=0.5) as arm,
        ):
            started = time.monotonic()
            failure = refusal(arm.read(T0))
            elapsed = time.monotonic() - started
        assert failure.refusal == "deadline" and "within 0.5 s" in failure.reason
        assert elapsed < 2.0

    def test_eight_replicas_at_the_byte_cap_cost_a_few_mib(self) -> None:
        """Eight replicas of 4 MiB each, every one parsed as it arrives: memory is a
        chunk and a line per replica, not eight bodies and their samples; all eight end
        at the deadline."""
        body = padded(4 * MiB - 1, 100).encode()  # one body, served without copies
        with ExitStack() as stack:
            urls = [stack.enter_context(MetricsEndpoint(lambda n: body)).url for _ in range(8)]
            with source(*urls, timeout_s=1.0, max_bytes=4 * MiB) as arm:
                tracemalloc.start()
                try:
                    started = time.monotonic()
                    reading = arm.read(T0)
                    elapsed = time.monotonic() - started
                    _, peak = tracemalloc.get_traced_memory()
                finally:
                    tracemalloc.stop()
        assert len(reading.failures) == 8 and reading.replicas == ()
        assert {failure.refusal for failure in reading.failures} == {"deadline"}
        assert elapsed < 4.0
        assert peak < 8 * MiB  # the bodies alone would be 32 MiB


class _PromqlApi:
    """A Prometheus-compatible `/api/v1/query` on loopback answering `answer(query)`."""

    def __init__(self, answer: Callable[[str], list[dict[str, Any]]]) -> None:
        self.answer = answer
        self.paths: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                """Quiet."""

            def do_GET(self) -> None:
                api.paths.append(urlsplit(self.path).path)
                query = parse_qs(urlsplit(self.path).query)["query"][0]
                body = json.dumps(
                    {
                        "status": "success",
                        "data": {"resultType": "vector", "result": api.answer(query)},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}{self.base}"

    base = ""

    def __enter__(self) -> _PromqlApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def _series(count: int, **labels: str) -> list[dict[str, Any]]:
    return [
        {"metric": {"instance": f"pod-{i}", **labels}, "value": [1.7e9, "5"]} for i in range(count)
    ]


@pytest.fixture
def promql() -> Iterator[Callable[..., PromqlSource]]:
    with ExitStack() as stack:

        def open_source(
            answer: Callable[[str], list[dict[str, Any]]], **bounds: int
        ) -> PromqlSource:
            api = stack.enter_context(_PromqlApi(answer))
            config = TelemetryArmConfig.model_validate({"prometheus_url": api.url})
            made = PromqlSource(
                "speculative",
                config,
                timeout_s=5.0,
                range_s=15.0,
                **{"max_bytes": 8 * MiB, **bounds},  # type: ignore[arg-type]
            )
            stack.callback(made.close)
            return made

        yield open_source


class TestPromql:
    def test_too_many_series_of_a_signal_are_refused(
        self, promql: Callable[..., PromqlSource]
    ) -> None:
        """An answer of more series than `max_series` is refused before it is validated."""
        source = promql(lambda query: _series(40), max_series=32)
        failure = refusal(source.read(T0))
        assert failure.refusal == "series" and "40 series" in failure.reason

    def test_a_process_histogram_of_too_many_bounds_is_refused(
        self, promql: Callable[..., PromqlSource]
    ) -> None:
        """One process's histogram with more bounds than `max_buckets` refuses the arm."""

        def answer(query: str) -> list[dict[str, Any]]:
            if "_bucket" not in query:
                return _series(1)
            return [
                {"metric": {"instance": "pod-0", "le": str(0.01 * (i + 1))}, "value": [1.7e9, "5"]}
                for i in range(20)
            ]

        failure = refusal(promql(answer, max_buckets=16).read(T0))
        assert failure.refusal == "buckets" and "telemetry.max_buckets" in failure.reason

    def test_the_queries_of_one_read_share_one_byte_budget(
        self, promql: Callable[..., PromqlSource]
    ) -> None:
        """Each answer is under the cap, all of them together are not: refused for bytes."""
        answer = _series(300, pad="x" * 200)  # about 90 KB per query, 11 queries
        failure = refusal(promql(lambda query: answer, max_bytes=512 * 1024).read(T0))
        assert failure.refusal == "bytes"

    def test_the_path_base_of_prometheus_url_is_kept(self) -> None:
        """A querier behind `/prometheus/` is asked at `/prometheus/api/v1/query`."""
        with _PromqlApi(lambda query: _series(1)) as api:
            api.base = "/prometheus/"
            config = TelemetryArmConfig.model_validate({"prometheus_url": api.url})
            with PromqlSource(
                "speculative", config, timeout_s=5.0, max_bytes=MiB, range_s=15.0
            ) as source:
                assert source.read(T0).failures == ()
        assert set(api.paths) == {"/prometheus/api/v1/query"}
