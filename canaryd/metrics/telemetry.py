"""The production-telemetry series: how the scrapes of the arms' serving engines go.

`TelemetryMetrics` owns the replicas scraped per arm by outcome (`ok`, or `failed`: no
connection, a bad status, a body too large, slow or that the parser refuses), the reads
refused per arm for passing a bound of `[telemetry]` (by the bound,
`canaryd.telemetry.limits.REFUSAL_REASONS`), the scrape intervals stored per arm, and the
time of each arm's last scrape in which a replica answered. Replica URLs are never
labels: an arm's replicas are counted together.
"""

from __future__ import annotations

from canaryd.metrics.declare import Declarer
from canaryd.metrics.labels import BoundedLabel
from canaryd.telemetry.limits import RefusalReason

OUTCOMES = ("ok", "failed")


class TelemetryMetrics:
    """Scrape series of the arms' telemetry; `arm` bounds arm names."""

    def __init__(self, declare: Declarer, *, arm: BoundedLabel) -> None:
        self._arm = arm
        self.scrapes = declare.counter(
            "canaryd_telemetry_scrapes_total",
            "Replica scrapes of each arm's production telemetry ([telemetry]), by outcome "
            "(ok, failed: no connection, a bad status, a body too large or too slow, an "
            "exposition the parser refuses).",
            ("arm", "outcome"),
            'rate(canaryd_telemetry_scrapes_total{outcome="failed"}[10m]) > 0',
        )
        self.refusals = declare.counter(
            "canaryd_telemetry_refused_total",
            "Telemetry reads refused for passing a bound of [telemetry], by arm and reason "
            "(bytes: more than max_bytes decoded, or a line over 256 KiB; deadline: no whole "
            "answer, parsed, within timeout_s; series: more than max_series series of one "
            "signal; buckets: a histogram of more than max_buckets le bounds). A refused read "
            "stores nothing; each is logged once (telemetry.source_refused).",
            ("arm", "reason"),
            "sum by (arm, reason) (increase(canaryd_telemetry_refused_total[1h])) > 0",
        )
        self.intervals = declare.counter(
            "canaryd_telemetry_intervals_total",
            "Scrape intervals of each arm stored as telemetry evidence (by the daemon that "
            "leads the gates).",
            ("arm",),
            "rate(canaryd_telemetry_intervals_total[10m]) == 0",
        )
        self.last_scrape = declare.gauge(
            "canaryd_telemetry_last_scrape_timestamp_seconds",
            "Unix time of each arm's last scrape in which a replica answered.",
            ("arm",),
            "time() - canaryd_telemetry_last_scrape_timestamp_seconds > 300",
        )

    def scraped(self, arm: str, *, ok: int, failed: int, timestamp: float) -> None:
        """One scrape of `arm`: `ok` replicas answered, `failed` did not."""
        label = self._arm(arm)
        if ok:
            self.scrapes.labels(arm=label, outcome="ok").inc(ok)
            self.last_scrape.labels(arm=label).set(timestamp)
        if failed:
            self.scrapes.labels(arm=label, outcome="failed").inc(failed)

    def refused(self, arm: str, reason: RefusalReason) -> None:
        """One read of `arm` refused for passing the bound `reason`."""
        self.refusals.labels(arm=self._arm(arm), reason=reason).inc()

    def stored(self, arm: str) -> None:
        """One scrape interval of `arm` stored."""
        self.intervals.labels(arm=self._arm(arm)).inc()
