"""Prometheus `/metrics` endpoints on loopback, honest and hostile, for the telemetry
bounds' tests and `benchmarks/hostile_metrics.py`.

`MetricsEndpoint` is a real HTTP/1.1 server (standard-library `ThreadingHTTPServer` in a
daemon thread) whose `GET /metrics` answers `exposition(n)`, `n` counting its answers from
0, so counters grow from one scrape to the next; `gzip = True` sends it gzip-encoded, and a
`bytes` exposition is sent as it is (a ready gzip body says so with `encoded = True`). The
expositions are those the audit of the telemetry intake used, named under vLLM's series:
`vllm_exposition` (an honest replica: requests, errors, an e2e histogram of vLLM's bounds,
gauges), `many_bounds` (an e2e histogram of that many distinct `le` bounds), `many_series`
(that many `vllm:request_success_total` series, each counting one more request per scrape),
`padded` (an honest exposition followed by valid series of another name up to a size),
`gzip_bomb` (a gzip body that inflates to far more than it weighs) and `load_balanced` (two
pods behind one Service: the answers alternate between them, so counters go down and up).
"""

from __future__ import annotations

import sys
import threading
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "E2E_BOUNDS",
    "MetricsEndpoint",
    "gzip_bomb",
    "load_balanced",
    "many_bounds",
    "many_series",
    "padded",
    "vllm_exposition",
]

E2E_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
              60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
E2E = "vllm:e2e_request_latency_seconds"


def _histogram(bounds: tuple[float, ...] | list[float], count: int, labels: str = "") -> str:
    """Every observation at 1.2 s: the cumulative buckets of `count` of them."""
    lines = [f"# TYPE {E2E} histogram\n"]
    for bound in bounds:
        lines.append(f'{E2E}_bucket{{{labels}le="{bound!r}"}} {count if bound >= 1.2 else 0}\n')
    lines.append(f'{E2E}_bucket{{{labels}le="+Inf"}} {count}\n')
    lines.append(f"{E2E}_count{{{labels.rstrip(',')}}} {count}\n")
    return "".join(lines)


def vllm_exposition(requests: int, errors: int = 0, *, started_at: float = 1.7e9) -> str:
    """An honest vLLM replica that finished `requests` requests, `errors` of them failed."""
    return (
        "# TYPE vllm:request_success_total counter\n"
        f'vllm:request_success_total{{finished_reason="stop"}} {requests - errors}\n'
        f'vllm:request_success_total{{finished_reason="error"}} {errors}\n'
        + _histogram(E2E_BOUNDS, requests)
        + "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 4\n"
        + "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
        + f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {started_at}\n"
    )


def many_bounds(bounds: int, requests: int, *, offset: float = 0.0) -> str:
    """An honest replica but for its e2e histogram: `bounds` distinct finite `le` bounds
    (`offset` + 1 ms, 2 ms, …) and +Inf."""
    honest = vllm_exposition(requests).split(f"# TYPE {E2E}", 1)[0]
    return honest + _histogram([offset + 0.001 * (i + 1) for i in range(bounds)], requests)


def many_series(series: int, scrape: int) -> str:
    """`series` series of finished requests (one per fabricated label value), each at
    `scrape`: every scrape credits `series` more requests, none of them failed."""
    lines = ["# TYPE vllm:request_success_total counter\n"]
    lines += [
        f'vllm:request_success_total{{finished_reason="stop",id="{i}"}} {scrape}\n'
        for i in range(series)
    ]
    return "".join(lines)


def padded(size: int, requests: int) -> str:
    """An honest replica followed by valid samples of another series, `size` bytes in all
    (parsing them all takes seconds)."""
    head = vllm_exposition(requests) + "# TYPE padding_total counter\n"
    line = 'padding_total{{pod="pad-{:09d}"}} 1\n'
    count = max(size - len(head), 0) // len(line.format(0))
    return head + "".join(line.format(i) for i in range(count))


def gzip_bomb(decoded: int) -> bytes:
    """A gzip body of comment lines that inflates to `decoded` bytes (about 1000:1)."""
    block = (b"#" * 1023 + b"\n") * 1024
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [compressor.compress(block) for _ in range(decoded // len(block))]
    return b"".join(parts) + compressor.flush()


def load_balanced(scrape: int, *, requests_per_scrape: int, error_share: float) -> str:
    """Two pods behind one Service, answering in turn. Pod A has served for weeks (10
    million requests at 0.1 % errors) and pod B for a day (100,000), so every other answer's
    counters are lower: a reset, to a reader that believes a counter going down. Each pod
    finishes `requests_per_scrape` requests between two of its answers, `error_share` of
    them failed (the fault a gate should see)."""
    history = 100_000 if scrape % 2 else 10_000_000
    new = requests_per_scrape * (scrape // 2 + 1)
    return vllm_exposition(history + new, history // 1000 + round(new * error_share))


class MetricsEndpoint:
    """`GET /metrics` answering `exposition(n)` for its n-th answer (0, 1, …)."""

    def __init__(
        self,
        exposition: Callable[[int], str | bytes],
        *,
        gzip: bool = False,
        encoded: bool = False,
    ) -> None:
        self.exposition, self.gzip, self.encoded = exposition, gzip, encoded
        self.answers = 0
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    def body(self) -> tuple[bytes, bool]:
        """The next answer's body and whether it is gzip-encoded."""
        with self._lock:
            count, self.answers = self.answers, self.answers + 1
        made = self.exposition(count)
        body = made.encode() if isinstance(made, str) else made
        if self.gzip and not self.encoded:
            return zlib.compress(body, 6, wbits=16 + zlib.MAX_WBITS), True
        return body, self.encoded

    def __enter__(self) -> MetricsEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-answer (a reader refusing it) is no error here."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler(endpoint: MetricsEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            """Quiet."""

        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            body, gzipped = endpoint.body()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            view = memoryview(body)  # slices without copies: a test measures the client
            try:
                for start in range(0, len(body), 1 << 20):
                    self.wfile.write(view[start : start + (1 << 20)])
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    return Handler
