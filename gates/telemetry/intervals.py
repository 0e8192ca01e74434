"""What the telemetry gates read: an arm's production telemetry, interval by interval, and
the telemetry gates' configuration.

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
from typing import Literal

from pydantic import Field, model_validator

from gates.config_base import GateConfigBase, check_quantiles_and_metrics
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
    """Both arms' production telemetry, as the telemetry gates read it."""

    baseline: ArmTelemetry = ArmTelemetry()
    speculative: ArmTelemetry = ArmTelemetry()


class TelemetryGateConfigBase(GateConfigBase):
    """What every telemetry gate has besides `GateConfigBase`: how long its evidence may
    stop before its decision expires (`gates.telemetry.silence`)."""

    max_silence_s: float = Field(
        default=300.0,
        gt=0,
        description="evidence expires: an arm the gate reads with no interval (no successful "
        "scrape) or no request for this long, or for max_silence_intervals of its scrape "
        "intervals where that is longer, makes the gate NODATA, naming the arm and why",
    )
    max_silence_intervals: int = Field(
        default=10,
        ge=1,
        description="evidence expires after this many of the arm's scrape intervals (its "
        "median interval) without an interval or a request, where longer than max_silence_s",
    )


class TelemetryErrorGateConfig(TelemetryGateConfigBase):
    """`telemetry.errors`: the speculative arm's error rate per production request may
    exceed the baseline's by at most `max_excess_rate`, and so may its rate of 4xx answers
    where both arms' sources report status codes. The window is counted in scrape
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
        "an outage; speculative intervals overlapping it are judged only on the failures "
        "beyond the outage's own rate there",
    )
    outage_margin_intervals: int = Field(
        default=1,
        ge=0,
        description="shared outages: baseline intervals on each side of an outage left "
        "out with it (an outage starts before the first error it causes is counted)",
    )


TelemetryLatencyMetric = Literal["e2e", "ttft", "itl"]


class TelemetryLatencyGateConfig(TelemetryGateConfigBase):
    """`telemetry.latency`: the speculative arm's production latency quantiles (e2e, TTFT,
    ITL) may be at most `max_ratio` × the baseline's, judged from the engines' latency
    histograms over intervals where both arms carried the same load per replica.
    `min_samples` counts requests per arm at matched load."""

    min_samples: int = Field(
        default=500,
        ge=1,
        description="requests per arm at matched load before a PASS (100 s at 5 per second)",
    )
    window_pairs: int | None = Field(
        default=None,
        ge=1,
        description="telemetry: the last this many scrape intervals (null: window_seconds alone)",
    )
    window_seconds: float | None = Field(default=3600.0, gt=0)
    metrics: tuple[TelemetryLatencyMetric, ...] = ("e2e", "ttft", "itl")
    quantiles: tuple[float, ...] = (0.5, 0.99)
    max_ratio: float = Field(
        default=1.2, gt=1, description="speculative / baseline quantile tolerated"
    )
    alarm_factor: float = Field(
        default=2.0,
        gt=1,
        description="the detector's first alternative: the speculative arm's odds of "
        "exceeding max_ratio × the baseline's quantile, × this (its bank adds 4× and 16× that)",
    )
    itl_per_token: bool = Field(
        default=True,
        description="divide an arm's inter-token latencies by its acceptance length over the "
        "window (a speculative step streams that many tokens as one observation)",
    )
    max_load_difference: float = Field(
        default=0.2,
        gt=0,
        lt=1,
        description="matched load: an interval is compared only when the arms' requests per "
        "second per replica (over the two minutes around it) differ by at most this "
        "fraction of the larger; where an arm counts no requests, their requests running + "
        "waiting per replica. 0.2 keeps a healthy arm within max_ratio 1.2 for latency up "
        "to ∝ load^0.8",
    )

    @model_validator(mode="after")
    def _quantiles_in_range(self) -> TelemetryLatencyGateConfig:
        check_quantiles_and_metrics(self.quantiles, self.metrics, "e2e, ttft, itl")
        return self


class TelemetryAcceptanceGateConfig(TelemetryGateConfigBase):
    """`telemetry.acceptance`: the speculative arm's acceptance length on all production
    traffic (1 + accepted ÷ drafts, from the engine's counters) may fall at most
    `max_relative_drop` below its reference: `reference_acceptance_length` when set,
    else one pinned from the arm's own healthy telemetry. `min_samples` counts drafts
    (verify steps)."""

    min_samples: int = Field(
        default=2000,
        ge=1,
        description="drafts (verify steps) before a PASS (10 s at 5 requests per second "
        "of ~100 tokens)",
    )
    min_intervals: int = Field(
        default=4,
        ge=3,
        description="scrape intervals with drafts before a PASS (their spread is the noise)",
    )
    window_pairs: int | None = Field(
        default=None,
        ge=1,
        description="telemetry: the last this many scrape intervals (null: window_seconds alone)",
    )
    window_seconds: float | None = Field(default=6 * 3600.0, gt=0)
    max_relative_drop: float = Field(
        default=0.15,
        gt=0,
        lt=1,
        description="drop of acceptance length below the reference tolerated",
    )
    alarm_relative_drop: float = Field(
        default=0.25,
        gt=0,
        lt=1,
        description="the detector's first alternative, a drop this large (its bank adds "
        "halfway to no acceptance at all, and none at all)",
    )
    reference_acceptance_length: float | None = Field(
        default=None,
        gt=1,
        description="a configured reference (taken as exact); null: pinned from telemetry",
    )
    pin_min_drafts: int = Field(
        default=20_000,
        ge=100,
        description="drafts the pinned reference is computed from (the first of the evidence)",
    )
    pin_min_intervals: int = Field(
        default=8,
        ge=3,
        description="scrape intervals with drafts the pinned reference spans at least",
    )

    @model_validator(mode="after")
    def _alarm_beyond_tolerance(self) -> TelemetryAcceptanceGateConfig:
        if self.alarm_relative_drop <= self.max_relative_drop:
            raise ValueError(
                f"alarm_relative_drop={self.alarm_relative_drop!r} must exceed "
                f"max_relative_drop={self.max_relative_drop!r}"
            )
        return self
