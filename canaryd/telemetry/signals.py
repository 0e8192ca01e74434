"""Which series give which signal, per kind of source, and reading them out of one
replica's exposition.

The shipped tables name the series each server really exports: vLLM (finish reasons,
latency histograms, scheduler gauges, speculative decoding counters), SGLang (request
counter, latency histograms, queue gauges, and acceptance as gauges: it exports no
draft counters, and no error counter, so its errors come from a gateway), and the HTTP
counters of three gateways (Istio, Envoy, ingress-nginx), which see every answer's status
(5xx as `errors`, 4xx as `client_errors`) but nothing of decoding. An engine's own
counters never see a 4xx: its API server refuses the request before the engine counts
it. `SignalReader` applies one arm's table to a replica's samples and keeps only what the
deltas need: per signal, the sum of its matching series grouped by the labels its
matchers name (the few a reset check must keep apart); every other label, a request id
or a pod name included, is summed away at once, so the state kept between two scrapes
never grows with the traffic. It reads at most `max_series` series of one signal and
`max_buckets` distinct `le` bounds of one histogram from a replica, and refuses the
replica (`limits.ReadRefusedError`) past either: a fabricated exposition can neither
credit requests by the hundred thousand nor store a histogram of every bound.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from prometheus_client.samples import Sample

from canaryd.telemetry.config import (
    COUNTER_SIGNALS,
    GAUGE_SIGNALS,
    HISTOGRAM_SIGNALS,
    GatewayFlavour,
    SeriesSpec,
    Signal,
    SignalMap,
    TelemetryArmConfig,
)
from canaryd.telemetry.limits import (
    DEFAULT_MAX_BUCKETS,
    DEFAULT_MAX_SERIES,
    ReadRefusedError,
    RefusalReason,
)

# --- the shipped tables -------------------------------------------------------------------

VLLM = SignalMap(
    # finished_reason is stop, length, abort, error or repetition; `error` is answered 500
    requests=SeriesSpec(series="vllm:request_success_total"),
    errors=SeriesSpec(series="vllm:request_success_total", labels={"finished_reason": "error"}),
    e2e=SeriesSpec(series="vllm:e2e_request_latency_seconds"),
    ttft=SeriesSpec(series="vllm:time_to_first_token_seconds"),
    # vLLM before the rename: vllm:time_per_output_token_seconds (set it in `signals.itl`)
    itl=SeriesSpec(series="vllm:inter_token_latency_seconds"),
    running=SeriesSpec(series="vllm:num_requests_running"),
    waiting=SeriesSpec(series="vllm:num_requests_waiting"),
    drafts=SeriesSpec(series="vllm:spec_decode_num_drafts_total"),
    draft_tokens=SeriesSpec(series="vllm:spec_decode_num_draft_tokens_total"),
    accepted_tokens=SeriesSpec(series="vllm:spec_decode_num_accepted_tokens_total"),
)

SGLANG = SignalMap(
    requests=SeriesSpec(series="sglang:num_requests_total"),
    e2e=SeriesSpec(series="sglang:e2e_request_latency_seconds"),
    ttft=SeriesSpec(series="sglang:time_to_first_token_seconds"),
    itl=SeriesSpec(series="sglang:inter_token_latency_seconds"),
    running=SeriesSpec(series="sglang:num_running_reqs"),
    waiting=SeriesSpec(series="sglang:num_queue_reqs"),
    acceptance_length=SeriesSpec(series="sglang:spec_accept_length"),
    acceptance_rate=SeriesSpec(series="sglang:spec_accept_rate"),
)

_FIVE_XX = "5.."
_FOUR_XX = "4.."
GATEWAYS: dict[GatewayFlavour, SignalMap] = {
    # Both sidecars of a request report it: count the destination's report only.
    "istio": SignalMap(
        requests=SeriesSpec(series="istio_requests_total", labels={"reporter": "destination"}),
        errors=SeriesSpec(
            series="istio_requests_total",
            labels={"reporter": "destination", "response_code": _FIVE_XX},
        ),
        client_errors=SeriesSpec(
            series="istio_requests_total",
            labels={"reporter": "destination", "response_code": _FOUR_XX},
        ),
        e2e=SeriesSpec(
            series="istio_request_duration_milliseconds",
            labels={"reporter": "destination"},
            scale=0.001,
        ),
    ),
    "envoy": SignalMap(
        requests=SeriesSpec(series="envoy_cluster_upstream_rq_total"),
        errors=SeriesSpec(
            series="envoy_cluster_upstream_rq_xx", labels={"envoy_response_code_class": "5"}
        ),
        client_errors=SeriesSpec(
            series="envoy_cluster_upstream_rq_xx", labels={"envoy_response_code_class": "4"}
        ),
        e2e=SeriesSpec(series="envoy_cluster_upstream_rq_time", scale=0.001),
    ),
    "ingress-nginx": SignalMap(
        requests=SeriesSpec(series="nginx_ingress_controller_requests"),
        errors=SeriesSpec(series="nginx_ingress_controller_requests", labels={"status": _FIVE_XX}),
        client_errors=SeriesSpec(
            series="nginx_ingress_controller_requests", labels={"status": _FOUR_XX}
        ),
        e2e=SeriesSpec(series="nginx_ingress_controller_request_duration_seconds"),
    ),
}

# A replica whose process started anew restarted, even if its counters have since grown
# past their old values (prometheus-client and the Go client export it by default).
PROCESS_START = "process_start_time_seconds"
# Gauges of a mean (acceptance) are averaged over series and replicas, the others summed.
MEAN_GAUGES: frozenset[Signal] = frozenset({"acceptance_length", "acceptance_rate"})


def signal_map(config: TelemetryArmConfig) -> SignalMap:
    """The arm's table: the shipped one for its kind with its `signals` in place."""
    if config.kind == "vllm":
        shipped = VLLM
    elif config.kind == "sglang":
        shipped = SGLANG
    elif config.kind == "gateway" and config.gateway is not None:
        shipped = GATEWAYS[config.gateway]
    else:
        shipped = SignalMap()
    return shipped if config.signals is None else shipped.overridden_by(config.signals)


# --- what one replica said -----------------------------------------------------------------

GroupKey = tuple[tuple[str, str], ...]  # the values of the labels a signal keeps apart


@dataclass(frozen=True, slots=True)
class ReplicaReading:
    """One replica's signals at one scrape: counters and histogram buckets summed per
    group (`GroupKey`), gauges as (sum, number of series). A signal no series matched is
    absent."""

    url: str
    process_start: float | None
    counters: Mapping[Signal, Mapping[GroupKey, float]]
    histograms: Mapping[Signal, Mapping[GroupKey, Mapping[float, float]]]
    gauges: Mapping[Signal, tuple[float, int]]


@dataclass(frozen=True, slots=True)
class ReplicaFailure:
    """A replica that gave no reading, and why (one line); `refusal` names the bound it
    passed when it was refused for one (`limits.RefusalReason`)."""

    url: str
    reason: str
    refusal: RefusalReason | None = None


@dataclass(frozen=True, slots=True)
class ArmReading:
    """Every replica of one arm at one scrape: the readings of those that answered and
    the failures of the others. `mapped` are the signals the arm's table names."""

    arm: str
    at: datetime
    mapped: frozenset[Signal]
    replicas: tuple[ReplicaReading, ...] = ()
    failures: tuple[ReplicaFailure, ...] = ()


@dataclass(frozen=True, slots=True)
class _Compiled:
    signal: Signal
    series: str
    matchers: tuple[tuple[str, re.Pattern[str]], ...]
    group: tuple[str, ...]
    scale: float

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(pattern.fullmatch(labels.get(name, "")) for name, pattern in self.matchers)

    def key(self, labels: Mapping[str, str]) -> GroupKey:
        return tuple((name, labels.get(name, "")) for name in self.group)


class SignalReader:
    """One arm's table, compiled: `read` turns a replica's samples into its reading, at most
    `max_series` series of each signal and `max_buckets` bounds of each histogram."""

    def __init__(
        self,
        signals: SignalMap,
        labels: Mapping[str, str] | None = None,
        *,
        max_series: int = DEFAULT_MAX_SERIES,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
    ) -> None:
        self.max_series, self.max_buckets = max_series, max_buckets
        arm_matchers = dict(labels or {})
        self._compiled: dict[Signal, _Compiled] = {}
        for signal in (*COUNTER_SIGNALS, *HISTOGRAM_SIGNALS, *GAUGE_SIGNALS):
            spec = signals.spec(signal)
            if spec is None:
                continue
            pairs = [*arm_matchers.items(), *spec.labels.items()]
            self._compiled[signal] = _Compiled(
                signal=signal,
                series=spec.series,
                matchers=tuple((name, re.compile(pattern)) for name, pattern in pairs),
                group=tuple(sorted({name for name, _ in pairs})),
                scale=spec.scale,
            )
        self.mapped: frozenset[Signal] = frozenset(self._compiled)
        self._by_name: dict[str, list[_Compiled]] = {}
        for compiled in self._compiled.values():
            for name in sample_names(compiled.signal, compiled.series):
                self._by_name.setdefault(name, []).append(compiled)

    @classmethod
    def for_arm(
        cls,
        config: TelemetryArmConfig,
        *,
        max_series: int = DEFAULT_MAX_SERIES,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
    ) -> SignalReader:
        return cls(
            signal_map(config), config.labels, max_series=max_series, max_buckets=max_buckets
        )

    def read(self, url: str, samples: Iterable[Sample]) -> ReplicaReading:
        """The replica's reading: matching series summed per signal and group; samples
        that are not finite numbers are skipped. `ReadRefusedError` past `max_series`
        series of a signal or `max_buckets` bounds of a histogram (`samples` may be a
        stream: it is read no further)."""
        counters: dict[Signal, dict[GroupKey, float]] = {}
        histograms: dict[Signal, dict[GroupKey, dict[float, float]]] = {}
        gauges: dict[Signal, tuple[float, int]] = {}
        process_start: float | None = None
        caps = _Caps(url, self.max_series, self.max_buckets)
        for sample in samples:
            if sample.name == PROCESS_START and math.isfinite(sample.value):
                process_start = min(
                    sample.value, math.inf if process_start is None else process_start
                )
                continue
            for compiled in self._by_name.get(sample.name, ()):
                if not math.isfinite(sample.value) or not compiled.matches(sample.labels):
                    continue
                signal = compiled.signal
                if signal in HISTOGRAM_SIGNALS:
                    bound = bucket_bound(sample.labels.get("le"))
                    if bound is None:
                        continue
                    caps.bucket(signal, sample.labels, bound)
                    buckets = histograms.setdefault(signal, {}).setdefault(
                        compiled.key(sample.labels), {}
                    )
                    upper = bound * compiled.scale
                    buckets[upper] = buckets.get(upper, 0.0) + sample.value
                    continue
                caps.series(signal)
                if signal in GAUGE_SIGNALS:
                    total, series = gauges.get(signal, (0.0, 0))
                    gauges[signal] = (total + sample.value, series + 1)
                else:
                    groups = counters.setdefault(signal, {})
                    key = compiled.key(sample.labels)
                    groups[key] = groups.get(key, 0.0) + sample.value
        return ReplicaReading(url, process_start, counters, histograms, gauges)


class _Caps:
    """The bounds of one replica's reading: series per signal (a histogram's series once,
    whatever its buckets) and distinct `le` bounds per histogram signal, over all its
    series. The state is bounded too: at most `max_series` + 1 series keys and
    `max_buckets` + 1 bounds per signal before the replica is refused."""

    def __init__(self, url: str, max_series: int, max_buckets: int) -> None:
        self.url, self.max_series, self.max_buckets = url, max_series, max_buckets
        self._series: dict[Signal, int] = {}
        self._histogram_series: dict[Signal, set[int]] = {}
        self._bounds: dict[Signal, set[float]] = {}

    def series(self, signal: Signal) -> None:
        """One more series of a counter or gauge signal."""
        count = self._series.get(signal, 0) + 1
        self._series[signal] = count
        if count > self.max_series:
            self._too_many_series(signal)

    def bucket(self, signal: Signal, labels: Mapping[str, str], bound: float) -> None:
        """One bucket of a histogram signal: its series (the labels but `le`) and bound."""
        # A hash, not the labels: the keys are only counted, and this keeps them small.
        key = hash(frozenset(item for item in labels.items() if item[0] != "le"))
        series = self._histogram_series.setdefault(signal, set())
        series.add(key)
        if len(series) > self.max_series:
            self._too_many_series(signal)
        bounds = self._bounds.setdefault(signal, set())
        bounds.add(bound)
        if len(bounds) > self.max_buckets:
            raise ReadRefusedError(
                "buckets",
                f"{self.url} sent a histogram of {signal} with more than {self.max_buckets} "
                "distinct le bounds (telemetry.max_buckets)",
            )

    def _too_many_series(self, signal: Signal) -> None:
        raise ReadRefusedError(
            "series",
            f"{self.url} sent more than {self.max_series} series of {signal} "
            "(telemetry.max_series)",
        )


def sample_names(signal: Signal, series: str) -> tuple[str, ...]:
    """The sample names that carry `series` once parsed: a histogram's `_bucket`s; a
    counter with and without `_total` (prometheus-client's parser adds the suffix to a
    counter exposed without it, as Go servers such as ingress-nginx and Envoy do)."""
    if signal in HISTOGRAM_SIGNALS:
        return (f"{series}_bucket",)
    if signal in COUNTER_SIGNALS:
        bare = series.removesuffix("_total")
        return (bare, f"{bare}_total")
    return (series,)


def bucket_bound(le: str | None) -> float | None:
    """A bucket's upper bound from its `le` label (`+Inf` included); None without one."""
    if le is None:
        return None
    try:
        bound = float(le)
    except ValueError:
        return None
    return None if math.isnan(bound) else bound
