"""The daemon's scrape job: every `telemetry.scrape_interval_s`, read every configured arm's
production telemetry at one instant and store each arm's interval since its last reading.

`TelemetryJob` is a collaborator of `Daemon` with its own APScheduler job and its own lock,
never the pair cycle's: a slow replica delays the next scrape, not a pair. It owns a
`canaryd.telemetry.TelemetryScraper` (the sources and their last readings, so the first
scrape after start, or after a reload that changed `[telemetry]`, stores nothing). Each
interval is stored (`TelemetryStore.save_telemetry`) under the arms key of the arm as
configured now (`canaryd.config.arms.arm_key`), so evidence measured under another
configuration of the arm, or of the baseline, is never read as this one's. Only a daemon
that leads the gates (or gates nothing) stores: followers on the same database scrape to
keep their readings current, so that a follower that takes over stores from its first
scrape, but never store twice what the leader stores. Nothing a server does, or the
database, stops the job: a replica that cannot be read is counted
(`canaryd_telemetry_scrapes_total{outcome="failed"}`) and logged once per
`FAILURE_LOG_EVERY_S` per replica with the number of failures since; a read refused for
passing a bound of `[telemetry]` (`canaryd.telemetry.limits`) is counted by its reason
(`canaryd_telemetry_refused_total`) and logged once (`telemetry.source_refused`), again
only after the replica was read in between; a database that is away loses the interval
(counted as a store error). Every hour the job deletes intervals older than
`telemetry.retention_days`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from canaryd.config import Settings
from canaryd.config.arms import arm_key
from canaryd.errors import CanarydError, DatabaseError
from canaryd.metrics.store import StoreMetrics
from canaryd.metrics.telemetry import TelemetryMetrics
from canaryd.redact import redact_text
from canaryd.store import StoredInterval, TelemetryStore
from canaryd.telemetry.config import TelemetryConfig, source_arm
from canaryd.telemetry.limits import RefusalReason
from canaryd.telemetry.scraper import SUMMED, ArmScrape, TelemetryScraper
from canaryd.telemetry.signals import ReplicaFailure

__all__ = ["FAILURE_LOG_EVERY_S", "PRUNE_EVERY", "TELEMETRY_JOB", "TelemetryJob"]

log = structlog.get_logger(__name__)

TELEMETRY_JOB = "telemetry"
FAILURE_LOG_EVERY_S = 300.0  # one log line per replica and this long, however many fail
PRUNE_EVERY = timedelta(hours=1)


class _Throttle:
    """At most one log line per key and `every_s`, carrying how many were held back."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def due(self, key: str, now: float) -> int | None:
        """The number of occurrences held back since the last line, when one is due now;
        None while it is not."""
        last = self._last.get(key)
        if last is not None and now - last < self.every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)


class TelemetryJob:
    """The scrape job of one daemon. `settings` returns the settings of the moment;
    `metrics` counts the scrapes, `store_metrics` the intervals the database refused;
    `store` the open store; `leading` whether this daemon stores (leads the gates, or
    gates nothing); `source` names the configuration file in errors."""

    def __init__(
        self,
        settings: Callable[[], Settings],
        metrics: TelemetryMetrics,
        *,
        store_metrics: StoreMetrics,
        store: Callable[[], TelemetryStore],
        leading: Callable[[], bool],
        source: Path | str | None = None,
    ) -> None:
        self._settings = settings
        self.metrics = metrics
        self.store_metrics = store_metrics
        self._store = store
        self._leading = leading
        self._source = str(source) if source is not None else "[telemetry]"
        self._lock = threading.Lock()  # one scrape at a time; a reload swaps between
        self._scraper: TelemetryScraper | None = None
        self._scheduler: BackgroundScheduler | None = None
        self._throttle = _Throttle(FAILURE_LOG_EVERY_S)
        self._refusals_logged: set[tuple[str, str, str]] = set()  # (arm, url, reason)
        self._pruned_at: datetime | None = None
        self.scrapes = 0  # scrapes run (for tests and /healthz-style checks)

    @property
    def config(self) -> TelemetryConfig | None:
        """The `[telemetry]` the sources were opened with (None: not scraping)."""
        return None if self._scraper is None else self._scraper.config

    def start(self, scheduler: BackgroundScheduler | None) -> None:
        """Open the sources and schedule the job, when `[telemetry]` names any arm; a
        source that cannot be opened (a PromQL arm) fails here with its key."""
        self._scheduler = scheduler
        self.reconfigure()

    def reconfigure(self) -> None:
        """Follow the settings of the moment (a reload): reopen the sources when
        `[telemetry]` changed, and add, move or remove the job."""
        config = self._settings().telemetry
        with self._lock:
            current = self._scraper.config if self._scraper is not None else TelemetryConfig()
            if current == config:
                return
            fresh = TelemetryScraper(config, self._source) if config.enabled else None
            old, self._scraper = self._scraper, fresh
        if old is not None:
            old.close()
        self._schedule(config)
        if fresh is not None:
            log.info(
                "telemetry.scraping",
                arms=list(fresh.arms),
                scrape_interval_s=config.scrape_interval_s,
            )

    def _schedule(self, config: TelemetryConfig) -> None:
        scheduler = self._scheduler
        if scheduler is None:
            return
        present = scheduler.get_job(TELEMETRY_JOB) is not None
        if not config.enabled:
            if present:
                scheduler.remove_job(TELEMETRY_JOB)
            return
        trigger = IntervalTrigger(seconds=config.scrape_interval_s)
        if present:
            scheduler.reschedule_job(TELEMETRY_JOB, trigger=trigger)
        else:
            scheduler.add_job(
                self.run,
                trigger,
                id=TELEMETRY_JOB,
                next_run_time=datetime.now(UTC),  # the first reading at once
                max_instances=1,
                coalesce=True,
            )

    def close(self) -> None:
        """Close the sources (the scheduler is the daemon's to stop)."""
        with self._lock:
            scraper, self._scraper = self._scraper, None
        if scraper is not None:
            scraper.close()

    def run(self, now: datetime | None = None) -> None:
        """One scrape of every arm at `now` (default: the clock), its intervals stored;
        never raises."""
        try:
            with self._lock:
                if self._scraper is None:
                    return
                self._scrape(self._scraper, now or datetime.now(UTC))
        except Exception:
            log.exception("telemetry.scrape_crashed")  # a bug here must not stop the soak

    def _scrape(self, scraper: TelemetryScraper, now: datetime) -> None:
        scrapes = scraper.scrape(now)
        self.scrapes += 1
        clock = time.time()
        for arm, scrape in scrapes.items():
            self._count(arm, scrape, clock)
        if not self._leading():
            return
        settings = self._settings()
        intervals = [
            StoredInterval(
                arm=arm,
                arms=arm_key(settings, source_arm(arm)),
                interval=scrape.window.interval,
                replicas=scrape.window.replicas,
                failed_replicas=len(scrape.window.failed),
                restarted_replicas=len(scrape.window.restarted),
            )
            for arm, scrape in scrapes.items()
            if scrape.window is not None
        ]
        try:
            self._store().save_telemetry(intervals)
            self._prune(settings, now)
        except (DatabaseError, CanarydError) as exc:
            self.store_metrics.error("telemetry")
            held = self._throttle.due("(database)", clock)
            if held is not None:
                log.error(
                    "telemetry.store_failed",
                    reason=str(exc),
                    failures_since_last_logged=held,
                    lost="the intervals of this scrape",
                )
            return
        for stored in intervals:
            self.metrics.stored(stored.arm)

    def _count(self, arm: str, scrape: ArmScrape, clock: float) -> None:
        reading = scrape.reading
        self.metrics.scraped(
            arm, ok=len(reading.replicas), failed=len(reading.failures), timestamp=clock
        )
        read = {replica.url for replica in reading.replicas}
        if scrape.window is not None:
            read.add(SUMMED)
        self._refusals_logged = {
            key for key in self._refusals_logged if key[0] != arm or key[1] not in read
        }
        refusals = () if scrape.refusal is None else (scrape.refusal,)
        for failure in (*reading.failures, *refusals):
            if failure.refusal is not None:
                self._refused(arm, failure, failure.refusal)
                continue
            held = self._throttle.due(f"{arm} {failure.url}", clock)
            if held is not None:
                log.warning(
                    "telemetry.replica_failed",
                    arm=arm,
                    url=redact_text(failure.url),
                    reason=redact_text(failure.reason),
                    failures_since_last_logged=held,
                )

    def _refused(self, arm: str, failure: ReplicaFailure, bound: RefusalReason) -> None:
        """Count a read refused for passing `bound`; log it unless that is logged already."""
        self.metrics.refused(arm, bound)
        key = (arm, failure.url, bound)
        if key in self._refusals_logged:
            return
        self._refusals_logged.add(key)
        log.warning(
            "telemetry.source_refused",
            arm=arm,
            url=redact_text(failure.url),
            bound=bound,
            reason=redact_text(failure.reason),
            stored="nothing of this read, and nothing more is logged until it is read again",
        )

    def _prune(self, settings: Settings, now: datetime) -> None:
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY:
            return
        self._pruned_at = now
        cut = now - timedelta(days=settings.telemetry.retention_days)
        deleted = self._store().prune_telemetry(cut)
        if deleted:
            log.info("telemetry.pruned", deleted=deleted, before=cut.isoformat())
