"""What the telemetry gates read: an arm's production request counts, interval by interval,
and the telemetry gates' configuration.

A serving engine or a gateway counts every production request it answers; canaryd scrapes
those counters and hands the gates the increase between two scrapes as one
`CountInterval` (how many requests finished in it, how many of them failed). The unit of
evidence is the request, not the scrape: an interval of 75 requests weighs 75 times one
of a single request. The records are plain values built by the caller (canaryd's
telemetry package), so the gates stay pure and never import `canaryd`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from pydantic import Field

from gates.config import GateConfigBase


@dataclass(frozen=True, slots=True)
class CountInterval:
    """The requests an arm finished between two scrapes (`start`, `end`], and how many of
    them failed (a 5xx answer, or an engine's `error` finish reason)."""

    start: datetime
    end: datetime
    requests: int
    errors: int

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"an interval ends after it starts: {self.start} → {self.end}")
        if not 0 <= self.errors <= self.requests:
            raise ValueError(
                f"need 0 ≤ errors ≤ requests, got {self.errors!r} errors "
                f"of {self.requests!r} requests"
            )


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


class TelemetryErrorGateConfig(GateConfigBase):
    """`telemetry.errors`: the speculative arm's error rate per production request may
    exceed the baseline's by at most `max_excess_rate`. The window is counted in scrape
    intervals (`window_pairs`) and seconds; `min_samples` in requests per arm."""

    min_samples: int = Field(
        default=500,
        ge=1,
        description="requests per arm before a PASS (100 s at 5 requests per second)",
    )
    window_pairs: int | None = Field(
        default=None,
        ge=1,
        description="telemetry: the last this many scrape intervals (null: window_seconds alone)",
    )
    window_seconds: float | None = Field(default=6 * 3600.0, gt=0)
    max_excess_rate: float = Field(
        default=0.01,
        ge=0,
        lt=1,
        description="speculative minus baseline error rate per request tolerated",
    )
    alarm_factor: float = Field(
        default=2.0,
        gt=1,
        description="the detector's first alternative, × the tolerated edge (the baseline's "
        "rate plus max_excess_rate); its bank adds 4× and 16× that",
    )
    outage_alpha: float = Field(
        default=0.001,
        gt=0,
        lt=0.5,
        description="shared outages: a baseline interval with more errors than a calm "
        "baseline (failing at the window's rate) makes with probability at most this is "
        "an outage; speculative intervals overlapping it are left out",
    )
    outage_margin_intervals: int = Field(
        default=1,
        ge=0,
        description="shared outages: baseline intervals on each side of an outage left "
        "out with it (an outage starts before the first error it causes is counted)",
    )
