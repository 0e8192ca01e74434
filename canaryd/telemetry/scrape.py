"""The direct scrape: fetch each replica's Prometheus text exposition over HTTP and read
the arm's signals out of it as it arrives.

httpx fetches (the text format asked for, gzip accepted). Each replica's answer is read
under the bounds of `limits`: it is decoded here (`zlib`, a chunk of at most
`_CHUNK_BYTES` at a time, so a compressed answer is capped while it inflates, not after),
at most `max_bytes` of it, split into lines, and parsed line by line by prometheus-client's
own text parser straight into the `SignalReader` (series and buckets capped), with the
`timeout_s` deadline checked between chunks and every `_LINES_PER_CHECK` lines parsed. No
answer is ever held whole: one replica's read costs a chunk, a line (at most
`MAX_LINE_BYTES`) and its capped reading, whatever `max_bytes` and however many replicas
(at most `_MAX_PARALLEL` at once). A replica that cannot be read (no connection, a non-200
status, an exposition the parser refuses) is a `ReplicaFailure` with a one-line reason, and
one past a bound is one with its `refusal`: `ScrapeSource.read` never raises for what a
server does, so one bad replica costs only its own counts.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from typing import Self

import httpx
from prometheus_client.parser import text_fd_to_metric_families, text_string_to_metric_families
from prometheus_client.samples import Sample

from canaryd.telemetry.config import TelemetryArmConfig
from canaryd.telemetry.limits import (
    DEFAULT_MAX_BUCKETS,
    DEFAULT_MAX_SERIES,
    ByteBudget,
    Deadline,
    ReadRefusedError,
    ScrapeFailedError,
)
from canaryd.telemetry.signals import ArmReading, ReplicaFailure, ReplicaReading, SignalReader

__all__ = [
    "ACCEPT",
    "MAX_LINE_BYTES",
    "BoundedAnswer",
    "HttpSource",
    "ScrapeFailedError",
    "ScrapeSource",
    "bounded_get",
    "exposition_samples",
    "fetch_bounded",
    "parse_exposition",
]

# The classic text format: every Prometheus client serves it; OpenMetrics is not asked for.
ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
# gzip only: it is what Prometheus itself asks for, and the one decoder capped here.
ACCEPT_ENCODING = "gzip"
# zlib's window bits per content coding: gzip (32 + 15 also takes a zlib header), deflate (zlib).
_DECODERS = {"gzip": 32 + zlib.MAX_WBITS, "x-gzip": 32 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_CHUNK_BYTES = 64 * 1024  # decoded at a time: the byte cap and the deadline act between them
MAX_LINE_BYTES = 256 * 1024  # a label value of this size is no telemetry
_LINES_PER_CHECK = 256  # parsed between two looks at the deadline (about 15 ms)
_MAX_PARALLEL = 8  # replicas scraped at once


def parse_exposition(text: str) -> list[Sample]:
    """Every sample of a text exposition (prometheus-client's parser); ValueError when
    the parser refuses it."""
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


class BoundedAnswer:
    """An answer being read: its `status`, and `chunks()`, its body decoded, at most
    `budget` bytes of it and within `deadline`; `ReadRefusedError` past either."""

    def __init__(
        self, url: str, response: httpx.Response, deadline: Deadline, budget: ByteBudget
    ) -> None:
        self.url, self.status, self.deadline = url, response.status_code, deadline
        self._response, self._budget = response, budget
        coding = response.headers.get("content-encoding", "identity").strip().lower()
        if coding not in {"identity", "", *_DECODERS}:
            raise ScrapeFailedError(f"{url} answered in {coding!r}, which was not asked for")
        self._coding = coding

    def chunks(self) -> Iterator[bytes]:
        """The decoded body, chunk by chunk (at most `_CHUNK_BYTES` each when compressed)."""
        wbits = _DECODERS.get(self._coding)
        decoder = None if wbits is None else zlib.decompressobj(wbits)
        for raw in self._response.iter_raw():
            self.deadline.check(self.url)
            if decoder is None:
                yield self._take(raw)
            else:
                yield from self._inflated(decoder, raw)
        if decoder is not None:
            # Every input byte was inflated until zlib gave less than a chunk: what it
            # still holds is less than a chunk.
            rest = decoder.flush()
            if rest:
                yield self._take(rest)

    def _inflated(self, decoder: zlib._Decompress, raw: bytes) -> Iterator[bytes]:
        """`raw` inflated, at most a chunk at a time, counted as it is."""
        if decoder.eof and raw:
            raise ScrapeFailedError(
                f"{self.url} sent data after the end of its {self._coding} body"
            )
        pending = raw
        while True:
            try:
                decoded = decoder.decompress(pending, _CHUNK_BYTES)
            except zlib.error as exc:
                raise ScrapeFailedError(
                    f"{self.url} sent a {self._coding} body that does not decode: {exc}"
                ) from exc
            pending = decoder.unconsumed_tail
            if decoded:
                yield self._take(decoded)
                self.deadline.check(self.url)
            if not pending and len(decoded) < _CHUNK_BYTES:
                return

    def _take(self, chunk: bytes) -> bytes:
        self._budget.take(len(chunk), self.url)
        return chunk


@contextmanager
def bounded_get(
    client: httpx.Client,
    url: str,
    *,
    timeout_s: float,
    max_bytes: int,
    budget: ByteBudget | None = None,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    ok_statuses: frozenset[int] = frozenset({httpx.codes.OK}),
) -> Iterator[BoundedAnswer]:
    """GET `url` and the answer to read under the bounds: its whole reading (the caller's
    too, inside the `with`) within `timeout_s`, at most `max_bytes` of decoded body (or
    `budget`, shared with other answers). `ScrapeFailedError` on any failure or a status
    outside `ok_statuses`; `ReadRefusedError` past a bound."""
    deadline = Deadline(timeout_s)
    sent = {"Accept-Encoding": ACCEPT_ENCODING, **(headers or {})}
    try:
        with client.stream(
            "GET", url, headers=sent, params=params, timeout=httpx.Timeout(timeout_s)
        ) as response:
            if response.status_code not in ok_statuses:
                raise ScrapeFailedError(f"HTTP {response.status_code} from {url}")
            yield BoundedAnswer(url, response, deadline, budget or ByteBudget(max_bytes))
    except httpx.TimeoutException as exc:
        raise ReadRefusedError(
            "deadline",
            f"{url} sent no whole answer within {timeout_s:g} s (telemetry.timeout_s)",
        ) from exc
    except httpx.HTTPError as exc:
        raise ScrapeFailedError(f"{url}: {type(exc).__name__}: {exc}") from exc


def fetch_bounded(
    client: httpx.Client,
    url: str,
    *,
    timeout_s: float,
    max_bytes: int,
    budget: ByteBudget | None = None,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    ok_statuses: frozenset[int] = frozenset({httpx.codes.OK}),
) -> tuple[int, bytes]:
    """The status and whole decoded body of GET `url`, read as `bounded_get` reads it."""
    with bounded_get(
        client,
        url,
        timeout_s=timeout_s,
        max_bytes=max_bytes,
        budget=budget,
        headers=headers,
        params=params,
        ok_statuses=ok_statuses,
    ) as answer:
        return answer.status, b"".join(answer.chunks())


def exposition_samples(answer: BoundedAnswer) -> Iterator[Sample]:
    """The samples of an exposition as its chunks arrive, parsed by prometheus-client;
    ValueError when the parser refuses a line, `ScrapeFailedError` for a line that is not
    UTF-8, `ReadRefusedError` for one longer than `MAX_LINE_BYTES` or past the deadline."""
    # Without its HELP and TYPE lines the parser yields each sample as it reads it, where it
    # would hold a family's samples until the next family starts (memory as large as the
    # largest family). TYPE only adds `_total` to a counter exposed without it, and the
    # reader looks a counter up by both names.
    for family in text_fd_to_metric_families(_sample_lines(answer)):  # type: ignore[arg-type]
        yield from family.samples


def _sample_lines(answer: BoundedAnswer) -> Iterator[str]:
    """The exposition's sample lines (no comments, no blank lines), decoded; the deadline
    looked at every `_LINES_PER_CHECK` lines, whatever they hold."""
    for number, raw in enumerate(_lines(answer), start=1):
        if number % _LINES_PER_CHECK == 0:
            answer.deadline.check(answer.url)
        line = _decoded_line(raw, answer.url).strip()
        if line and not line.startswith("#"):
            yield line


def _lines(answer: BoundedAnswer) -> Iterator[bytes]:
    """The answer's lines as they arrive; `ReadRefusedError` for one over `MAX_LINE_BYTES`."""
    pending = b""
    for chunk in answer.chunks():
        *lines, pending = (pending + chunk).split(b"\n")
        if len(pending) > MAX_LINE_BYTES:
            raise ReadRefusedError(
                "bytes", f"{answer.url} sent a line longer than {MAX_LINE_BYTES} bytes"
            )
        yield from lines
    yield pending


def _decoded_line(raw: bytes, url: str) -> str:
    try:
        return raw.decode("utf-8")
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
        max_series: int = DEFAULT_MAX_SERIES,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
        client: httpx.Client | None = None,
    ) -> None:
        if not config.direct:
            raise ValueError(f"telemetry arm {arm!r} has no metrics_url to scrape")
        self.arm, self.urls = arm, config.metrics_url
        self.timeout_s, self.max_bytes = timeout_s, max_bytes
        self.reader = SignalReader.for_arm(config, max_series=max_series, max_buckets=max_buckets)
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
        """One replica read as its exposition arrives: its reading, or why there is none."""
        try:
            with bounded_get(
                self._client,
                url,
                timeout_s=self.timeout_s,
                max_bytes=self.max_bytes,
                headers={"Accept": ACCEPT},
            ) as answer:
                return self.reader.read(url, exposition_samples(answer))
        except ReadRefusedError as exc:
            return ReplicaFailure(url, str(exc), refusal=exc.reason)
        except ScrapeFailedError as exc:
            return ReplicaFailure(url, str(exc))
        except ValueError as exc:  # prometheus-client's parser refuses a line
            return ReplicaFailure(url, f"{url} sent an exposition the parser refuses: {exc}")
