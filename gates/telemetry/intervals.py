"""What the telemetry gates read: an arm's production telemetry, interval by interval (their
configuration sections live with every other gate's, in `gates.config`).

A serving engine or a gateway counts every production request it answers; canaryd scrapes
those counters and hands the gates the increase between two scrapes as one
`CountInterval` (how many requests finished in it, how many of them failed, and how many
were answered 4xx where the source reports status codes). The unit of
evidence is the request, not the scrape: an interval of 75 requests weighs 75 times one
of a single request. A `TelemetryInterval` carries every signal of one interval (counts,
latency histogram increases, load gauges, speculative-decoding counters; None where the
arm's source does not say); `ArmTelemetry` holds one arm's intervals and
`TelemetryEvidence` both arms'. The records are plain values built by the caller
(canaryd's telemetry package), so the gates stay pure and never import `canaryd`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from gates.stats.histogram import BucketCounts


@dataclass(frozen=True, slots=True)
class CountInterval:
    """The requests an arm finished between two scrapes (`start`, `end`], how many of them
    failed (a 5xx answer, or an engine's `error` finish reason) and how many were answered
    4xx (`client_errors`; None where the source reports no status codes)."""

    start: datetime
    end: datetime
    requests: int
    errors: int
    client_errors: int | None = None

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"an interval ends after it starts: {self.start} → {self.end}")
        if not 0 <= self.errors <= self.requests:
            raise ValueError(
                f"need 0 ≤ errors ≤ requests, got {self.errors!r} errors "
                f"of {self.requests!r} requests"
            )
        if self.client_errors is not None and not 0 <= self.client_errors <= self.requests:
            raise ValueError(
                f"need 0 ≤ client_errors ≤ requests, got {self.client_errors!r} 4xx "
                f"of {self.requests!r} requests"
            )

    @property
    def served(self) -> bool:
        """Whether the arm finished any request in the interval."""
        return self.requests > 0


@dataclass(frozen=True, slots=True)
class TelemetryCounts:
    """One arm's count intervals, oldest first (sorted on construction)."""

    intervals: tuple[CountInterval, ...] = ()

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.intervals, key=lambda i: (i.start, i.end)))
        object.__setattr__(self, "intervals", ordered)

    @classmethod
    def of(cls, intervals: Iterable[CountInterval]) -> TelemetryCounts:
        return cls(tuple(intervals))

    @property
    def requests(self) -> int:
        return sum(i.requests for i in self.intervals)

    @property
    def errors(self) -> int:
        return sum(i.errors for i in self.intervals)


@dataclass(frozen=True, slots=True)
class TelemetryInterval:
    """Everything an arm's telemetry said about (`start`, `end`]: requests finished and
    failed, and answered 4xx (`client_errors`, counted among `requests`); the increases
    of the end-to-end, time-to-first-token and inter-token latency histograms; requests
    running and waiting (the mean of the two scrapes, summed over replicas); speculative
    drafts, draft tokens and accepted tokens; the acceptance the engine itself reports as
    a gauge (SGLang); and how many replicas were read at both scrapes. None: the source
    does not say."""

    start: datetime
    end: datetime
    requests: int | None = None
    errors: int | None = None
    client_errors: int | None = None
    e2e: BucketCounts | None = None
    ttft: BucketCounts | None = None
    itl: BucketCounts | None = None
    running: float | None = None
    waiting: float | None = None
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    reported_acceptance_length: float | None = None
    reported_acceptance_rate: float | None = None
    replicas: int | None = None

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"an interval ends after it starts: {self.start} → {self.end}")
        counts = {
            "requests": self.requests,
            "errors": self.errors,
            "client_errors": self.client_errors,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
        }
        for name, value in counts.items():
            if value is not None and value < 0:
                raise ValueError(f"{name} is a count, got {value!r}")
        if self.requests is not None and self.errors is not None and self.errors > self.requests:
            raise ValueError(
                f"need errors ≤ requests, got {self.errors!r} errors of {self.requests!r} requests"
            )
        if (
            self.requests is not None
            and self.client_errors is not None
            and self.client_errors > self.requests
        ):
            raise ValueError(
                f"need client_errors ≤ requests, got {self.client_errors!r} 4xx of "
                f"{self.requests!r} requests"
            )

    @property
    def served(self) -> bool:
        """Whether the arm served in the interval: requests finished where it counts them,
        else drafts or latency observations."""
        if self.requests is not None:
            return self.requests > 0
        histograms = (self.e2e, self.ttft, self.itl)
        return bool(self.drafts) or any(h is not None and h.count > 0 for h in histograms)

    @property
    def load(self) -> float | None:
        """Requests in the engine (running + waiting); None unless both are known."""
        if self.running is None or self.waiting is None:
            return None
        return self.running + self.waiting

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    def per_replica(self, value: float) -> float:
        """`value` (a sum over the arm's replicas) per replica; the arm's whole when the
        replica count is unknown. A canary at 10 % of the traffic on one replica beside a
        baseline on nine is at the same load per replica, not a ninth of it."""
        return value / self.replicas if self.replicas else value

    def count_interval(self) -> CountInterval | None:
        """The interval as `telemetry.errors` reads it; None without both counts."""
        if self.requests is None or self.errors is None:
            return None
        return CountInterval(self.start, self.end, self.requests, self.errors, self.client_errors)


@dataclass(frozen=True, slots=True)
class ArmTelemetry:
    """One arm's telemetry intervals, oldest first (sorted on construction)."""

    intervals: tuple[TelemetryInterval, ...] = ()

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.intervals, key=lambda i: (i.start, i.end)))
        object.__setattr__(self, "intervals", ordered)

    @classmethod
    def of(cls, intervals: Iterable[TelemetryInterval]) -> ArmTelemetry:
        return cls(tuple(intervals))

    def counts(self) -> TelemetryCounts:
        """The request and error counts of the intervals that have both."""
        return TelemetryCounts.of(
            counted for i in self.intervals if (counted := i.count_interval()) is not None
        )

    def window(
        self,
        now: datetime,
        *,
        window_seconds: float | None,
        window_intervals: int | None = None,
        since: datetime | None = None,
    ) -> list[TelemetryInterval]:
        """Intervals that ended at or before `now` and within `window_seconds` of it,
        started at or after `since`, the last `window_intervals` of them, oldest first."""
        chosen = [i for i in self.intervals if i.end <= now and (since is None or i.start >= since)]
        if window_seconds is not None:
            oldest = now - timedelta(seconds=window_seconds)
            chosen = [i for i in chosen if i.end > oldest]
        if window_intervals is not None:
            chosen = chosen[-window_intervals:]
        return chosen


@dataclass(frozen=True, slots=True)
class TelemetryEvidence:
    """Both arms' production telemetry, as the telemetry gates read it, and the concurrent
    stable's (`stable`): the speculative pods that still serve the previous revision
    beside the one judged (Argo's stable ReplicaSet, Flagger's primary), over the same
    scrapes; empty where none is configured."""

    baseline: ArmTelemetry = ArmTelemetry()
    speculative: ArmTelemetry = ArmTelemetry()
    stable: ArmTelemetry = ArmTelemetry()
