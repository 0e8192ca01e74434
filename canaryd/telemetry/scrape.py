"""The direct scrape: fetch each replica's Prometheus text exposition over HTTP and read
the arm's signals out of it.

httpx fetches (the text format asked for, a whole-answer deadline of `timeout_s`, at
most `max_bytes` of decoded body, so a compressed answer cannot inflate past it either);
prometheus-client's own text parser reads the answer. A replica that cannot be read (no
connection, a non-200 status, a body too large or too slow, an exposition the parser
refuses) is a `ReplicaFailure` with a one-line reason: `ScrapeSource.read` never raises
for what a server does, so one bad replica costs only its own counts.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Self

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from canaryd.telemetry.config import TelemetryArmConfig
from canaryd.telemetry.signals import ArmReading, ReplicaFailure, ReplicaReading, SignalReader

# The classic text format: every Prometheus client serves it; OpenMetrics is not asked for.
ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
_MAX_PARALLEL = 8  # replicas scraped at once


class ScrapeFailedError(Exception):
    """One replica's scrape failed; the message is the one-line reason."""


def parse_exposition(text: str) -> list[Sample]:
    """Every sample of a text exposition (prometheus-client's parser); ValueError when
    the parser refuses it."""
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def fetch_bounded(
    client: httpx.Client,
    url: str,
    *,
    timeout_s: float,
    max_bytes: int,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    ok_statuses: frozenset[int] = frozenset({httpx.codes.OK}),
) -> tuple[int, bytes]:
    """The status and body of GET `url`: the whole answer within `timeout_s`, at most
    `max_bytes` of decoded body; `ScrapeFailedError` on any failure or a status outside
    `ok_statuses`."""
    deadline = time.monotonic() + timeout_s
    body = bytearray()
    try:
        with client.stream(
            "GET", url, headers=headers, params=params, timeout=httpx.Timeout(timeout_s)
        ) as response:
            if response.status_code not in ok_statuses:
                raise ScrapeFailedError(f"HTTP {response.status_code} from {url}")
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise ScrapeFailedError(f"{url} sent more than {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise ScrapeFailedError(f"{url} sent no whole answer within {timeout_s:g} s")
            return response.status_code, bytes(body)
    except httpx.TimeoutException as exc:
        raise ScrapeFailedError(f"{url} sent no whole answer within {timeout_s:g} s") from exc
    except httpx.HTTPError as exc:
        raise ScrapeFailedError(f"{url}: {type(exc).__name__}: {exc}") from exc


def fetch_exposition(client: httpx.Client, url: str, *, timeout_s: float, max_bytes: int) -> str:
    """The exposition at `url` as text; `ScrapeFailedError` on any failure."""
    _, body = fetch_bounded(
        client, url, timeout_s=timeout_s, max_bytes=max_bytes, headers={"Accept": ACCEPT}
    )
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScrapeFailedError(f"{url} sent an exposition that is not UTF-8") from exc


class HttpSource:
    """A source's HTTP client: its own unless the caller passed one (then the caller
    closes it), closed with the source."""

    _own_client: bool
    _client: httpx.Client

    def _own(self, client: httpx.Client | None) -> None:
        self._own_client = client is None
        self._client = client or httpx.Client(follow_redirects=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own_client:
            self._client.close()


class ScrapeSource(HttpSource):
    """One arm's replicas, scraped directly (a context manager: closes its client)."""

    def __init__(
        self,
        arm: str,
        config: TelemetryArmConfig,
        *,
        timeout_s: float,
        max_bytes: int,
        client: httpx.Client | None = None,
    ) -> None:
        if not config.direct:
            raise ValueError(f"telemetry arm {arm!r} has no metrics_url to scrape")
        self.arm, self.urls = arm, config.metrics_url
        self.timeout_s, self.max_bytes = timeout_s, max_bytes
        self.reader = SignalReader.for_arm(config)
        self._own(client)

    def read(self, now: datetime) -> ArmReading:
        """Every replica's reading at `now` (the replicas are scraped in parallel)."""
        if len(self.urls) == 1:
            outcomes = [self._replica(self.urls[0])]
        else:
            with ThreadPoolExecutor(min(len(self.urls), _MAX_PARALLEL)) as pool:
                outcomes = list(pool.map(self._replica, self.urls))
        return ArmReading(
            arm=self.arm,
            at=now,
            mapped=self.reader.mapped,
            replicas=tuple(o for o in outcomes if isinstance(o, ReplicaReading)),
            failures=tuple(o for o in outcomes if isinstance(o, ReplicaFailure)),
        )

    def _replica(self, url: str) -> ReplicaReading | ReplicaFailure:
        try:
            text = fetch_exposition(
                self._client, url, timeout_s=self.timeout_s, max_bytes=self.max_bytes
            )
        except ScrapeFailedError as exc:
            return ReplicaFailure(url, str(exc))
        try:
            samples = parse_exposition(text)
        except ValueError as exc:
            return ReplicaFailure(url, f"{url} sent an exposition the parser refuses: {exc}")
        return self.reader.read(url, samples)
