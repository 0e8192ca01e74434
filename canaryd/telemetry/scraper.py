"""Every arm's telemetry read at one instant, and consecutive readings turned into windows.

`TelemetryScraper` opens one source per configured arm and concurrent stable
(`TelemetryConfig.sources`, `sources.open_source`) and, on
each `scrape(now)`, reads them all in parallel at that one instant, so that the arms'
intervals line up and judge the same minutes of production. It keeps each arm's last
reading: the window of an arm is what happened between it and the new one
(`deltas.telemetry_window`), so the first scrape after start gives no window. A reading in
which no replica answered keeps the last one standing (the next window then spans the gap,
and nothing counted meanwhile is lost); a source that raises, which none should, counts
as such a reading, with the exception as its reason. A window whose summed histogram
(the arm's replicas together) has more `le` bounds than `telemetry.max_buckets` is refused
(`ArmScrape.refusal`; each replica passed the cap, but their layouts differ): no window
of any arm holds more bounds than the cap, so a stored interval stays small whatever the
replicas send. Nothing here touches the database: the daemon's scrape job stores the
windows, `canaryd judge` keeps them in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import structlog

from canaryd.redact import redact_text
from canaryd.telemetry.config import TelemetryConfig
from canaryd.telemetry.deltas import TelemetryWindow, carry_forward, telemetry_window
from canaryd.telemetry.signals import ArmReading, ReplicaFailure, ReplicaReading
from canaryd.telemetry.sources import TelemetrySource, open_source

__all__ = ["SUMMED", "ArmScrape", "TelemetryScraper"]

log = structlog.get_logger(__name__)

SUMMED = "(replicas summed)"  # the url of a refusal of the replicas' window together
# How many of an arm's readings the reading before a reset is kept as a ghost: a load
# balancer returns to it within a reading or two, a real process not for weeks.
GHOST_READINGS = 10
Opener = Callable[[str, TelemetryConfig, str], TelemetrySource]


@dataclass(frozen=True, slots=True)
class ArmScrape:
    """One arm at one scrape: what its replicas said, and the window since the arm's last
    reading (None on the first, when no replica was read at both ends, or when it was
    refused: `refusal` then says why)."""

    reading: ArmReading
    window: TelemetryWindow | None
    refusal: ReplicaFailure | None = None


class TelemetryScraper:
    """The configured arms' sources and their last readings (a context manager: `close`
    closes the sources). `source` names the configuration file in errors."""

    def __init__(
        self, config: TelemetryConfig, source: str = "[telemetry]", *, opener: Opener = open_source
    ) -> None:
        self.config = config
        self._sources: dict[str, TelemetrySource] = {}
        self._last: dict[str, ArmReading] = {}
        self._refusals_logged: set[tuple[str, str, str]] = set()
        # Per (arm, URL): the reading before a reset the counters alone showed, and the
        # arm's reading count until which it is kept (`deltas.telemetry_window`).
        self._ghosts: dict[tuple[str, str], tuple[ReplicaReading, int]] = {}
        self._readings: dict[str, int] = {}
        try:
            for arm in config.sources():
                self._sources[arm] = opener(arm, config, source)
        except BaseException:
            self.close()
            raise

    @property
    def arms(self) -> tuple[str, ...]:
        return tuple(self._sources)

    def __enter__(self) -> TelemetryScraper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for source in self._sources.values():
            source.close()
        self._sources.clear()

    def scrape(self, now: datetime) -> dict[str, ArmScrape]:
        """Every arm read at `now`, in parallel, with its window since its last reading."""
        if not self._sources:
            return {}
        with ThreadPoolExecutor(len(self._sources), thread_name_prefix="canaryd-scrape") as pool:
            readings = dict(
                zip(
                    self._sources,
                    pool.map(lambda arm: self._read(arm, now), self._sources),
                    strict=True,
                )
            )
        return {arm: self._advance(reading) for arm, reading in readings.items()}

    def _read(self, arm: str, now: datetime) -> ArmReading:
        try:
            return self._sources[arm].read(now)
        except Exception as exc:  # a source must not raise; if one does, it read nothing
            log.exception("telemetry.source_crashed", arm=arm)
            return ArmReading(
                arm=arm,
                at=now,
                mapped=frozenset(),
                failures=(ReplicaFailure("(source)", f"{type(exc).__name__}: {exc}"),),
            )

    def _advance(self, reading: ArmReading) -> ArmScrape:
        last = self._last.get(reading.arm)
        window = None
        refused: set[str] = set()
        if last is not None and last.at < reading.at:
            found = telemetry_window(last, reading, self._ghosts_of(reading.arm))
            window = found if found.replicas > 0 else None
            refused = {url for url, _ in found.refused}
            self._log_refusals(reading.arm, found.refused)
            self._haunt(reading.arm, last, found.reset, refused)
        if reading.replicas:
            self._last[reading.arm] = (
                reading if last is None else carry_forward(last, reading, refused)
            )
        refusal = None if window is None else self._oversized(window)
        return ArmScrape(reading, None if refusal else window, refusal)

    def _ghosts_of(self, arm: str) -> dict[str, ReplicaReading]:
        count = self._readings.get(arm, 0)
        return {
            url: ghost
            for (owner, url), (ghost, until) in self._ghosts.items()
            if owner == arm and count <= until
        }

    def _haunt(self, arm: str, last: ArmReading, reset: tuple[str, ...], refused: set[str]) -> None:
        """Keep, for `GHOST_READINGS` readings, the reading before each reset the counters
        alone showed; a refusal of a reading that returned to it keeps it longer."""
        count = self._readings[arm] = self._readings.get(arm, 0) + 1
        before = {replica.url: replica for replica in last.replicas}
        for url in reset:
            if url in before:
                self._ghosts[(arm, url)] = (before[url], count + GHOST_READINGS)
        for url in refused:
            if (kept := self._ghosts.get((arm, url))) is not None:
                self._ghosts[(arm, url)] = (kept[0], count + GHOST_READINGS)
        for key in [k for k, (_, until) in self._ghosts.items() if k[0] == arm and until < count]:
            del self._ghosts[key]

    def _oversized(self, window: TelemetryWindow) -> ReplicaFailure | None:
        """The refusal of a window with a histogram of more bounds than the cap."""
        cap = self.config.max_buckets
        interval = window.interval
        for signal, buckets in (
            ("e2e", interval.e2e),
            ("ttft", interval.ttft),
            ("itl", interval.itl),
        ):
            if buckets is not None and len(buckets.bounds) > cap:
                reason = (
                    f"the replicas' {signal} histograms have {len(buckets.bounds)} distinct le "
                    f"bounds together, more than {cap} (telemetry.max_buckets)"
                )
                return ReplicaFailure(SUMMED, reason, refusal="buckets")
        return None

    def _log_refusals(self, arm: str, refused: tuple[tuple[str, str], ...]) -> None:
        """One warning per arm, replica and cause (its first words), however often."""
        for url, why in refused:
            key = (arm, url, why.split(" (", 1)[0])
            if key in self._refusals_logged:
                continue
            self._refusals_logged.add(key)
            log.warning(
                "telemetry.reading_refused",
                arm=arm,
                url=redact_text(url),
                reason=why,
                kept="the replica's last reading that agreed, as the next interval's start",
            )
