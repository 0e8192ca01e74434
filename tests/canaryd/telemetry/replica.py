"""A serving replica's /metrics on loopback, for the telemetry tests.

`VllmReplica` keeps its own prometheus-client registry with the series vLLM exports, under
vLLM's names, labels and bucket bounds (vllm/v1/metrics/loggers.py and
vllm/v1/spec_decode/metrics.py, Apache-2.0), and serves `generate_latest` of it over a
real HTTP server; `restart` swaps in a fresh registry, as a restarted process would show.
`TextReplica` serves a fixed text (a gateway's exposition, a broken one). Either can be
told to answer with another status, too much, or too slowly. `threaded=False` answers on
the server's own thread, one request at a time: a server scraped in the background (by
Prometheus) then starts no thread during a test.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

MODEL = "llama"
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class _Server:
    """A ThreadingHTTPServer on 127.0.0.1 answering GET /metrics with `body()`."""

    status = 200
    padding_bytes = 0
    delay_s = 0.0

    def __init__(self, *, threaded: bool = True) -> None:
        self._stop = threading.Event()
        server = ThreadingHTTPServer if threaded else HTTPServer
        self._httpd = server(("127.0.0.1", 0), _handler(self))
        if isinstance(self._httpd, ThreadingHTTPServer):
            self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def body(self) -> bytes:
        raise NotImplementedError

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def wait(self, seconds: float) -> None:
        self._stop.wait(seconds)


def _handler(server: _Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            """Quiet."""

        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            # padding: comment lines of 1 KiB, which a parser skips but still reads
            body = server.body() + (b"#" * 1023 + b"\n") * (server.padding_bytes // 1024)
            self.send_response(server.status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            half = len(body) // 2
            try:
                self.wfile.write(body[:half])
                self.wfile.flush()
                server.wait(server.delay_s)
                self.wfile.write(body[half:])
            except (BrokenPipeError, ConnectionResetError):
                return

    return Handler


class VllmReplica(_Server):
    """One vLLM replica's counters, histograms and gauges, named as vLLM names them."""

    def __init__(self, started_at: float = 1_700_000_000.0, *, threaded: bool = True) -> None:
        super().__init__(threaded=threaded)
        self._lock = threading.Lock()
        self._build(started_at)

    def _build(self, started_at: float) -> None:
        registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=registry,
        )
        for reason in FINISH_REASONS:  # vLLM creates every reason's series at start
            self.success.labels(MODEL, "0", reason)

        def histogram(name: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, name, labels, buckets=buckets, registry=registry).labels(
                MODEL, "0"
            )

        def counter(name: str) -> Any:
            return Counter(name, name, labels, registry=registry).labels(MODEL, "0")

        def gauge(name: str) -> Any:
            return Gauge(name, name, labels, registry=registry).labels(MODEL, "0")

        self.e2e = histogram("vllm:e2e_request_latency_seconds", E2E_BUCKETS)
        self.ttft = histogram("vllm:time_to_first_token_seconds", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", ITL_BUCKETS)
        self.running = gauge("vllm:num_requests_running")
        self.waiting = gauge("vllm:num_requests_waiting")
        self.drafts = counter("vllm:spec_decode_num_drafts")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens")
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens")
        Gauge("process_start_time_seconds", "Start time.", registry=registry).set(started_at)
        self.registry = registry

    def restart(self, started_at: float) -> None:
        """A new process: every counter from zero, a new start time."""
        with self._lock:
            self._build(started_at)

    def finish(
        self,
        requests: int,
        *,
        reason: str = "stop",
        e2e: float = 1.2,
        ttft: float = 0.07,
        itl: float = 0.03,
    ) -> None:
        """`requests` requests finished with `reason`, each with these latencies."""
        with self._lock:
            self.success.labels(MODEL, "0", reason).inc(requests)
            for _ in range(requests):
                self.e2e.observe(e2e)
                self.ttft.observe(ttft)
                self.itl.observe(itl)

    def draft(self, drafts: int, draft_tokens: int, accepted: int) -> None:
        with self._lock:
            self.drafts.inc(drafts)
            self.draft_tokens.inc(draft_tokens)
            self.accepted.inc(accepted)

    def load(self, running: int, waiting: int) -> None:
        with self._lock:
            self.running.set(running)
            self.waiting.set(waiting)

    def body(self) -> bytes:
        with self._lock:
            return generate_latest(self.registry)

    def total(self, name: str) -> float:
        """The sum of every sample named `name` (e.g. `vllm:request_success_total`)."""
        with self._lock:
            return sum(
                sample.value
                for family in self.registry.collect()
                for sample in family.samples
                if sample.name == name
            )


class TextReplica(_Server):
    """A replica serving a fixed exposition text (changed by assigning `text`)."""

    def __init__(self, text: str = "", *, threaded: bool = True) -> None:
        super().__init__(threaded=threaded)
        self.text = text

    def body(self) -> bytes:
        return self.text.encode()
