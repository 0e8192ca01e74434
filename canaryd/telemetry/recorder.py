"""Telemetry kept in memory for a one-shot judgement: `TelemetryRecorder`.

`canaryd judge` stores pairs but no telemetry (a daemon on the same database may be
storing the same arms' intervals already). The recorder scrapes every configured arm at
start, then every `scrape_interval_s` on a thread of its own, and keeps each arm's
intervals since; `evidence(arm)` is what the gates read for the baseline and `arm`. A
replica that cannot be read is logged once, with its reason (`telemetry.source_refused`
with the bound for a read refused for passing one of `[telemetry]`); its counts are missing
from the intervals, as in the daemon.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import structlog

from canaryd.redact import redact_text
from canaryd.telemetry.config import TelemetryConfig, stable_source
from canaryd.telemetry.scraper import TelemetryScraper
from gates.records import BASELINE_ARM
from gates.telemetry.intervals import ArmTelemetry, TelemetryEvidence, TelemetryInterval

__all__ = ["TelemetryRecorder"]

log = structlog.get_logger(__name__)


class TelemetryRecorder:
    """Every configured arm scraped on a thread of its own (a context manager: `close`
    stops the thread and closes the sources)."""

    def __init__(self, config: TelemetryConfig, source: str = "[telemetry]") -> None:
        self.interval_s = config.scrape_interval_s
        self._scraper = TelemetryScraper(config, source)
        self._intervals: dict[str, list[TelemetryInterval]] = {arm: [] for arm in config.sources()}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._logged: set[tuple[str, str]] = set()
        self._thread = threading.Thread(target=self._loop, name="canaryd-telemetry", daemon=True)

    def start(self) -> TelemetryRecorder:
        """The first reading now (the start of every interval kept), then the thread."""
        self.scrape(datetime.now(UTC))
        self._thread.start()
        return self

    def __enter__(self) -> TelemetryRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._scraper.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scrape(datetime.now(UTC))

    def scrape(self, now: datetime) -> None:
        """One scrape of every arm at `now`; each arm's new interval kept."""
        for arm, scrape in self._scraper.scrape(now).items():
            refusals = () if scrape.refusal is None else (scrape.refusal,)
            for failure in (*scrape.reading.failures, *refusals):
                if (arm, failure.url) not in self._logged:
                    self._logged.add((arm, failure.url))
                    log.warning(
                        "telemetry.replica_failed"
                        if failure.refusal is None
                        else "telemetry.source_refused",
                        arm=arm,
                        url=redact_text(failure.url),
                        reason=redact_text(failure.reason),
                    )
            if scrape.window is not None:
                with self._lock:
                    self._intervals[arm].append(scrape.window.interval)

    def evidence(self, arm: str) -> TelemetryEvidence:
        """The baseline's, `arm`'s and its concurrent stable's intervals kept so far."""
        with self._lock:
            return TelemetryEvidence(
                baseline=ArmTelemetry.of(self._intervals.get(BASELINE_ARM, ())),
                speculative=ArmTelemetry.of(self._intervals.get(arm, ())),
                stable=ArmTelemetry.of(self._intervals.get(stable_source(arm), ())),
            )
