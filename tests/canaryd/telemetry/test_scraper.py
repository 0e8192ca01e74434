"""Every arm read at one instant (canaryd.telemetry.scraper), against real HTTP servers on
loopback serving vLLM's series: the first scrape gives no window, the next one a window
per arm over the same interval; two baseline replicas are summed, a restarted one counts
from zero; a replica down costs only its own counts, an arm with every replica down keeps
its last reading, so the next window spans the gap and loses nothing; a URL that reaches
two pods by turns is refused, logged once, and never credits one pod's count to the
other."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from canaryd.telemetry.config import TelemetryConfig
from canaryd.telemetry.scraper import TelemetryScraper
from tests.canaryd.telemetry.replica import TextReplica, VllmReplica
from tests.support.hostile_metrics import load_balanced

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
STEP = timedelta(seconds=15)


@pytest.fixture
def replicas() -> Iterator[tuple[VllmReplica, VllmReplica, VllmReplica]]:
    """Two baseline replicas and one speculative replica."""
    with (
        VllmReplica(1_700_000_000.0) as first,
        VllmReplica(1_700_000_100.0) as second,
        VllmReplica(1_700_000_200.0) as speculative,
    ):
        yield first, second, speculative


def scraper(baseline: list[str], speculative: list[str]) -> TelemetryScraper:
    config = TelemetryConfig.model_validate(
        {
            "timeout_s": 2.0,
            "arms": {
                "baseline": {"metrics_url": baseline},
                "speculative": {"metrics_url": speculative},
            },
        }
    )
    return TelemetryScraper(config)


class TestTelemetryScraper:
    def test_the_first_scrape_gives_no_window_and_the_next_one_does(
        self, replicas: tuple[VllmReplica, VllmReplica, VllmReplica]
    ) -> None:
        """Both arms' windows cover the same interval; the baseline's replicas are summed;
        what happened before the first scrape is not counted."""
        first, second, speculative = replicas
        for replica in replicas:
            replica.finish(1000)
        speculative.draft(500, 2500, 1200)
        with scraper([first.url, second.url], [speculative.url]) as arms:
            opening = arms.scrape(T0)
            assert set(opening) == {"baseline", "speculative"}
            assert all(scrape.window is None for scrape in opening.values())
            first.finish(40)
            second.finish(35)
            second.finish(3, reason="error")
            speculative.finish(70)
            speculative.finish(1, reason="error")
            speculative.draft(300, 1500, 900)
            windows = arms.scrape(T0 + STEP)
        base, spec = windows["baseline"].window, windows["speculative"].window
        assert base is not None and spec is not None
        both = (base.interval, spec.interval)
        assert [(i.start, i.end) for i in both] == [(T0, T0 + STEP)] * 2
        assert (both[0].requests, both[0].errors, base.replicas) == (78, 3, 2)
        assert (both[1].requests, both[1].errors, spec.replicas) == (71, 1, 1)
        assert (both[1].drafts, both[1].accepted_tokens) == (300, 900)
        assert both[0].drafts == 0  # a plain server's spec-decode counters never move

    def test_a_restarted_replica_counts_from_zero(
        self, replicas: tuple[VllmReplica, VllmReplica, VllmReplica]
    ) -> None:
        """A replica whose process restarted between two scrapes counts all it has since."""
        first, second, speculative = replicas
        first.finish(500)
        second.finish(500)
        with scraper([first.url, second.url], [speculative.url]) as arms:
            arms.scrape(T0)
            first.restart(started_at=(T0 + STEP / 2).timestamp())
            first.finish(12)
            second.finish(20)
            window = arms.scrape(T0 + STEP)["baseline"].window
        assert window is not None
        assert window.interval.requests == 32 and window.restarted == (first.url,)

    def test_a_replica_down_costs_only_its_own_counts(
        self, replicas: tuple[VllmReplica, VllmReplica, VllmReplica]
    ) -> None:
        """A replica answering 503 is a failure with its reason; the other is counted."""
        first, second, speculative = replicas
        with scraper([first.url, second.url], [speculative.url]) as arms:
            arms.scrape(T0)
            first.finish(10)
            second.finish(20)
            second.status = 503
            scrape = arms.scrape(T0 + STEP)["baseline"]
        assert scrape.window is not None
        assert scrape.window.interval.requests == 10 and scrape.window.failed == (second.url,)
        (failure,) = scrape.reading.failures
        assert "HTTP 503" in failure.reason

    def test_an_arm_with_every_replica_down_loses_nothing(
        self, replicas: tuple[VllmReplica, VllmReplica, VllmReplica]
    ) -> None:
        """No window while the arm's only replica is down; the next window starts at the
        last reading and holds everything counted meanwhile. The other arm goes on."""
        _, _, speculative = replicas
        with VllmReplica() as baseline, scraper([baseline.url], [speculative.url]) as arms:
            arms.scrape(T0)
            speculative.finish(25)
            speculative.status = 500
            baseline.finish(5)
            during = arms.scrape(T0 + STEP)
            speculative.status = 200
            speculative.finish(15)
            after = arms.scrape(T0 + 2 * STEP)["speculative"].window
        assert during["speculative"].window is None
        assert during["baseline"].window is not None
        assert during["baseline"].window.interval.requests == 5
        assert after is not None
        interval = after.interval
        assert (interval.start, interval.end, interval.requests) == (T0, T0 + 2 * STEP, 40)

    def test_a_malformed_exposition_is_a_failure(self) -> None:
        """An exposition the parser refuses is the replica's failure, never an exception."""
        with (
            TextReplica("vllm:num_requests_running{ 1\n") as broken,
            VllmReplica() as healthy,
            scraper([broken.url], [healthy.url]) as arms,
        ):
            scrapes = arms.scrape(T0)
        (failure,) = scrapes["baseline"].reading.failures
        assert "parser refuses" in failure.reason
        assert scrapes["speculative"].reading.replicas

    def test_a_load_balanced_url_is_refused_and_logged_once(
        self, replicas: tuple[VllmReplica, VllmReplica, VllmReplica]
    ) -> None:
        """One `metrics_url` that a Service balances over two pods (each failing 20 % of
        its requests, one started long before the other): scrapes alternate between
        them. The readings of the other pod are refused with one log line naming the
        cause, and every window counts one pod's own requests, 20 % failed: never the
        other pod's whole count re-zeroed into one clean interval."""
        old, young, _ = replicas
        old.finish(50_000)
        young.finish(100)
        with TextReplica() as service, scraper([service.url], [service.url]) as arms:
            windows = []
            with capture_logs() as logs:
                for k in range(8):
                    pod = old if k % 2 else young
                    for each in (old, young):
                        each.finish(60)
                        each.finish(15, reason="error")
                    service.text = generate_latest(pod.registry).decode()
                    if (window := arms.scrape(T0 + k * STEP)["speculative"].window) is not None:
                        windows.append(window)
        refusals = [
            e
            for e in logs
            if e["event"] == "telemetry.reading_refused" and e["arm"] == "speculative"
        ]
        assert len(refusals) == 1, refusals
        assert "start time went back" in refusals[0]["reason"]
        assert windows
        for window in windows:
            assert window.interval.requests == 150 and window.interval.errors == 30

    def test_a_load_balanced_url_without_start_times_credits_no_other_pods_count(
        self,
    ) -> None:
        """The same Service over two pods that expose no process start time (one with 10
        million requests served, one with 100,000): the first fall reads as a reset, not
        counted; every answer of the other pod after it is back past its value and
        refused (one log line); the windows count the second pod's own 75 requests a
        scrape, 20 % failed, never a whole count re-zeroed into one clean interval (the
        rise back to 10 million is refused as past any serving rate, or as back at the
        value before the reset)."""
        with TextReplica() as service, scraper([service.url], [service.url]) as arms:
            windows = []
            with capture_logs() as logs:
                for k in range(12):
                    text = load_balanced(k, requests_per_scrape=75, error_share=0.2)
                    service.text = "".join(
                        line for line in text.splitlines(keepends=True) if "process_" not in line
                    )
                    if (window := arms.scrape(T0 + k * STEP)["speculative"].window) is not None:
                        windows.append(window)
        refusals = [
            e
            for e in logs
            if e["event"] == "telemetry.reading_refused" and e["arm"] == "speculative"
        ]
        assert len(refusals) == 1 and "more than one process" in refusals[0]["reason"]
        assert len(windows) >= 4
        for window in windows:
            assert (window.interval.requests, window.interval.errors) == (75, 15)
