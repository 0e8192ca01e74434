"""The PromQL source: one arm's signals read from a Prometheus-compatible HTTP API
(`prometheus_url`), as instant queries evaluated at the scrape time.

Each of the arm's queries (`promql.templates`, rendered with its `selector`) is asked of
`GET /api/v1/query` with `time` set to the scrape instant, all at once, under one deadline
of `timeout_s` and one budget of `max_bytes` of (decoded) answer for them all (httpx, as the
direct scrape reads an exposition); the JSON answer is read by pydantic models of the API's
envelope, once its result is known to hold no more series than the caps allow. An arm with
more than `max_series` series of one signal, or a histogram with more than `max_buckets`
bounds on one serving process, is refused whole (`limits.ReadRefusedError`). The
series that come back become `ReplicaReading`s, one per value of the `instance` label (one
serving process), grouped by their other labels; from there on a reading is what a
direct scrape gives, and `deltas.telemetry_window` turns two of them into an interval.
A reading is whole or nothing: Prometheus unreachable, an answer too large or too slow,
`status: error`, a result that is not an instant vector, or no series for any query is
one `ReplicaFailure` naming the API and the reason (counted and logged as a failed
scrape), so a missing signal is never read as a zero. A query that finds no series while
others do leaves its signal absent (a gateway has no 5xx series before the first 5xx).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from canaryd.telemetry.config import (
    GAUGE_SIGNALS,
    HISTOGRAM_SIGNALS,
    Signal,
    TelemetryArmConfig,
)
from canaryd.telemetry.limits import (
    DEFAULT_MAX_BUCKETS,
    DEFAULT_MAX_SERIES,
    ByteBudget,
    ReadRefusedError,
    RefusalReason,
)
from canaryd.telemetry.promql import (
    REPLICA_LABEL,
    process_start_template,
    render,
    templates,
)
from canaryd.telemetry.scrape import HttpSource, ScrapeFailedError, fetch_bounded
from canaryd.telemetry.signals import (
    ArmReading,
    GroupKey,
    ReplicaFailure,
    ReplicaReading,
    bucket_bound,
    signal_map,
)

__all__ = ["PromqlSource", "QueryResponse", "Series", "instant_query"]

QUERY_PATH = "/api/v1/query"
# Prometheus answers a bad query 400, one it could not run 422, a timeout 503: each with
# the JSON envelope naming the error, which is the reason worth logging.
_API_STATUSES = frozenset({200, 400, 422, 503})
_MAX_PARALLEL = 13  # every query of a kind at once
PROCESS_START = "process_start"


class _Api(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class VectorSample(_Api):
    """One series of an instant vector: its labels and `[time, "value"]`; a native
    histogram (`histogram` instead of `value`) is not read."""

    metric: dict[str, str]
    value: tuple[float, str] | None = None


class QueryData(_Api):
    resultType: Literal["vector", "scalar", "matrix", "string"]  # noqa: N815 (the API's name)
    result: Any


class QueryResponse(_Api):
    """The API's envelope: `status`, then `data` on success or `errorType`/`error`."""

    status: Literal["success", "error"]
    data: QueryData | None = None
    errorType: str | None = None  # noqa: N815 (the API's name)
    error: str | None = None


_VECTOR = TypeAdapter(list[VectorSample])
_SCALAR = TypeAdapter(tuple[float, str])

Series = tuple[dict[str, str], float]  # one series' labels and finite value


class QueryFailedError(Exception):
    """One query gave no usable answer; the message is the one-line reason."""


def _finite(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_answer(body: bytes, query: str, *, max_results: int | None = None) -> list[Series]:
    """The series of an instant query's answer (a scalar is one unlabelled series);
    non-finite values and native histograms skipped; `QueryFailedError` otherwise, and
    `ReadRefusedError` for a result of more than `max_results` series (checked before the
    result is validated, which costs several times its JSON)."""
    try:
        answer = QueryResponse.model_validate(json.loads(body))
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise QueryFailedError(f"an answer that is not the query API's JSON: {first}") from exc
    if answer.status == "error" or answer.data is None:
        raise QueryFailedError(f"{answer.errorType or 'error'}: {answer.error} in {query!r}")
    data = answer.data
    try:
        if data.resultType == "scalar":
            value = _finite(_SCALAR.validate_python(data.result)[1])
            return [] if value is None else [({}, value)]
        if data.resultType != "vector":
            raise QueryFailedError(
                f"{query!r} returned a {data.resultType}, not an instant vector "
                "(no range selector outside a function)"
            )
        too_many = isinstance(data.result, list) and len(data.result) > (max_results or math.inf)
        if too_many:
            raise ReadRefusedError(
                "series",
                f"{len(data.result)} series for {query!r}, more than the {max_results} "
                "telemetry.max_series (× max_buckets for a histogram) allows",
            )
        samples = _VECTOR.validate_python(data.result)
    except ValidationError as exc:
        raise QueryFailedError(f"a result the query API does not give: {exc}") from exc
    found: list[Series] = []
    for sample in samples:
        value = None if sample.value is None else _finite(sample.value[1])
        if value is not None:
            found.append((sample.metric, value))
    return found


def instant_query(
    client: httpx.Client,
    base_url: str,
    query: str,
    *,
    at: datetime,
    timeout_s: float,
    max_bytes: int,
    budget: ByteBudget | None = None,
    max_results: int | None = None,
) -> list[Series]:
    """`query` evaluated at `at` by the API at `base_url`; `QueryFailedError` (with the
    reason) when there is no answer or it says `status: error`; `ReadRefusedError` past a
    bound (`budget`: bytes shared with other queries)."""
    url = base_url.rstrip("/") + QUERY_PATH
    # Prometheus' durations are whole numbers of a unit
    timeout = f"{max(int(timeout_s * 1000), 1)}ms"
    params = {"query": query, "time": f"{at.timestamp():.3f}", "timeout": timeout}
    try:
        _, body = fetch_bounded(
            client,
            url,
            timeout_s=timeout_s,
            max_bytes=max_bytes,
            budget=budget,
            headers={"Accept": "application/json"},
            params=params,
            ok_statuses=_API_STATUSES,
        )
    except ReadRefusedError:
        raise
    except ScrapeFailedError as exc:
        raise QueryFailedError(str(exc)) from exc
    return parse_answer(body, query, max_results=max_results)


class PromqlSource(HttpSource):
    """One arm's signals from a Prometheus-compatible API (a context manager: closes its
    client)."""

    def __init__(
        self,
        arm: str,
        config: TelemetryArmConfig,
        *,
        timeout_s: float,
        max_bytes: int,
        range_s: float,
        max_series: int = DEFAULT_MAX_SERIES,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
        client: httpx.Client | None = None,
    ) -> None:
        if config.prometheus_url is None:
            raise ValueError(f"telemetry arm {arm!r} has no prometheus_url to query")
        self.arm, self.url = arm, config.prometheus_url
        self.timeout_s, self.max_bytes = timeout_s, max_bytes
        self.max_series, self.max_buckets = max_series, max_buckets
        self.queries: dict[Signal, str] = {
            signal: render(template, selector=config.selector, range_s=range_s)
            for signal, template in templates(config).items()
        }
        table = signal_map(config)
        # a histogram's bounds in the kind's unit (Istio and Envoy: milliseconds)
        self.scales: dict[Signal, float] = {
            signal: spec.scale
            for signal in HISTOGRAM_SIGNALS
            if (spec := table.spec(signal)) is not None
        }
        self.mapped = frozenset(self.queries)
        start = process_start_template(config)
        self.process_start_query = (
            None if start is None else render(start, selector=config.selector, range_s=range_s)
        )
        self._own(client)

    def read(self, now: datetime) -> ArmReading:
        """Every serving process's reading at `now`, or one failure naming why none."""
        deadline = time.monotonic() + self.timeout_s
        budget = ByteBudget(self.max_bytes)
        jobs: list[tuple[str, str]] = list(self.queries.items())
        if self.process_start_query is not None:
            jobs.append((PROCESS_START, self.process_start_query))
        with ThreadPoolExecutor(min(len(jobs), _MAX_PARALLEL)) as pool:
            outcomes = list(pool.map(lambda job: self._query(job, now, deadline, budget), jobs))
        answers: dict[str, list[Series]] = {}
        for (name, _), outcome in zip(jobs, outcomes, strict=True):
            if isinstance(outcome, ReadRefusedError):
                return self._failed(now, f"{self.url}: {name}: {outcome}", outcome.reason)
            if isinstance(outcome, QueryFailedError):
                return self._failed(now, f"{self.url}: {name}: {outcome}")
            answers[name] = outcome
        starts = answers.pop(PROCESS_START, [])
        if not any(answers.values()):
            return self._failed(
                now,
                f"{self.url}: no series for any signal at {now.isoformat()} "
                "(check selector and that Prometheus scrapes the arm)",
            )
        signals = {signal: answers[signal] for signal in self.queries}
        try:
            replicas = self._replicas(signals, starts)
        except ReadRefusedError as exc:
            return self._failed(now, f"{self.url}: {exc}", exc.reason)
        return ArmReading(arm=self.arm, at=now, mapped=self.mapped, replicas=replicas)

    def _query(
        self, job: tuple[str, str], now: datetime, deadline: float, budget: ByteBudget
    ) -> list[Series] | QueryFailedError | ReadRefusedError:
        name, query = job
        left = deadline - time.monotonic()
        if left <= 0:
            return ReadRefusedError(
                "deadline", f"no answer within {self.timeout_s:g} s (telemetry.timeout_s)"
            )
        histogram = name in HISTOGRAM_SIGNALS
        try:
            return instant_query(
                self._client,
                self.url,
                query,
                at=now,
                timeout_s=left,
                max_bytes=self.max_bytes,
                budget=budget,
                max_results=self.max_series * (self.max_buckets if histogram else 1),
            )
        except (QueryFailedError, ReadRefusedError) as exc:
            return exc

    def _failed(
        self, now: datetime, reason: str, refusal: RefusalReason | None = None
    ) -> ArmReading:
        return ArmReading(
            arm=self.arm,
            at=now,
            mapped=self.mapped,
            failures=(ReplicaFailure(self.url, reason, refusal),),
        )

    def _replicas(
        self, answers: Mapping[Signal, list[Series]], starts: list[Series]
    ) -> tuple[ReplicaReading, ...]:
        """The answers split by serving process (`instance`; the API's URL when a query
        keeps no such label), each series' other labels its group; `starts` the
        processes' start times. `ReadRefusedError` past `max_series` series of a signal
        (a histogram's series once, not per bucket) or `max_buckets` bounds of one
        process's histogram."""
        series_seen: dict[Signal, set[GroupKey]] = {}
        bounds: dict[tuple[str, Signal], set[float]] = {}
        counters: dict[str, dict[Signal, dict[GroupKey, float]]] = {}
        histograms: dict[str, dict[Signal, dict[GroupKey, dict[float, float]]]] = {}
        gauges: dict[str, dict[Signal, tuple[float, int]]] = {}
        for signal, found in answers.items():
            for labels, value in found:
                replica = labels.get(REPLICA_LABEL, self.url)
                key = tuple(
                    sorted(
                        (name, text)
                        for name, text in labels.items()
                        if name not in {REPLICA_LABEL, "le", "__name__"}
                    )
                )
                seen = series_seen.setdefault(signal, set())
                seen.add((*key, (REPLICA_LABEL, replica)))
                if len(seen) > self.max_series:
                    raise ReadRefusedError(
                        "series",
                        f"more than {self.max_series} series of {signal} (telemetry.max_series)",
                    )
                if signal in HISTOGRAM_SIGNALS:
                    bound = bucket_bound(labels.get("le"))
                    if bound is None:
                        continue
                    upper = bound * self.scales.get(signal, 1.0)
                    by_group = histograms.setdefault(replica, {}).setdefault(signal, {})
                    buckets = by_group.setdefault(key, {})
                    buckets[upper] = buckets.get(upper, 0.0) + value
                    distinct = bounds.setdefault((replica, signal), set())
                    distinct.add(upper)
                    if len(distinct) > self.max_buckets:
                        raise ReadRefusedError(
                            "buckets",
                            f"{replica}'s {signal} histogram has more than {self.max_buckets} "
                            "distinct le bounds (telemetry.max_buckets)",
                        )
                elif signal in GAUGE_SIGNALS:
                    total, series = gauges.setdefault(replica, {}).get(signal, (0.0, 0))
                    gauges[replica][signal] = (total + value, series + 1)
                else:
                    groups = counters.setdefault(replica, {}).setdefault(signal, {})
                    groups[key] = groups.get(key, 0.0) + value
        names = sorted({*counters, *histograms, *gauges})
        started: dict[str, float] = {}
        for labels, value in starts:
            replica = labels.get(REPLICA_LABEL, self.url)
            started[replica] = min(value, started.get(replica, value))
        return tuple(
            ReplicaReading(
                url=name,
                process_start=started.get(name),
                counters=counters.get(name, {}),
                histograms=histograms.get(name, {}),
                gauges=gauges.get(name, {}),
            )
            for name in names
        )
