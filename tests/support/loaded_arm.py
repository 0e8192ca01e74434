"""A serving arm whose speed depends on its load, and an HTTP fault proxy, on loopback.

`LoadedArm` is a real HTTP/1.1 server (standard-library `ThreadingHTTPServer`) that streams
`/v1/chat/completions` as vLLM does (server-sent events, a usage chunk, `data: [DONE]`)
and serves `/metrics` under vLLM's names and bucket bounds from its own prometheus-client
registry: `vllm:request_success_total`, the e2e, TTFT and inter-token latency histograms
(each observed from what the request really took), `vllm:num_requests_running`, and, for a
speculative arm, the spec-decode counters. Each token takes `token_delay_s × (1 +
slowdown × (requests in flight − 1))`: with `slowdown = 0` the arm's speed does not depend
on load, with `slowdown > 0` it is as fast as configured alone and slower under
concurrency — the way speculative decoding loses at large batch sizes.

`FaultProxy` forwards every request to a target (the stream relayed chunk by chunk) and
answers 500 instead for every `every`-th one (deterministic), counting each answer as Istio's
sidecar does, under `istio_requests_total{reporter="destination", response_code}` and
`istio_request_duration_milliseconds`: a gateway that sees every status.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["FaultProxy", "LoadedArm"]

# vLLM's bucket bounds (vllm/v1/metrics/loggers.py, Apache-2.0).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ISTIO_MS_BUCKETS = (0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
                    60000, 300000, 600000, 1800000, 3600000)  # fmt: skip


class _Server:
    """A ThreadingHTTPServer on 127.0.0.1 in a daemon thread, with a prometheus registry."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._httpd.owner = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def metrics(self) -> bytes:
        return generate_latest(self.registry)

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def owner(self) -> Any:
        return self.server.owner  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self.send(200, self.owner.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        elif self.path == "/v1/models":
            self.send(200, b'{"object": "list", "data": [{"id": "llama"}]}', "application/json")
        else:
            self.send(404, b'{"error": "not found"}', "application/json")

    def chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class LoadedArm(_Server):
    def __init__(
        self,
        token_delay_s: float,
        *,
        slowdown: float = 0.0,
        tokens: int = 8,
        speculative: bool = False,
    ) -> None:
        super().__init__(_ArmHandler)
        self.token_delay_s, self.slowdown, self.tokens = token_delay_s, slowdown, tokens
        self.speculative = speculative
        self.in_flight = 0
        self.most_in_flight = 0
        labels = ["model_name", "engine"]

        def histogram(name: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, name, labels, buckets=buckets, registry=self.registry).labels(
                "llama", "0"
            )

        def counter(name: str) -> Any:
            return Counter(name, name, labels, registry=self.registry).labels("llama", "0")

        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.e2e = histogram("vllm:e2e_request_latency_seconds", E2E_BUCKETS)
        self.ttft = histogram("vllm:time_to_first_token_seconds", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", ITL_BUCKETS)
        self.running = Gauge(
            "vllm:num_requests_running", "running", labels, registry=self.registry
        ).labels("llama", "0")
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "waiting", labels, registry=self.registry
        ).labels("llama", "0")
        self.drafts = counter("vllm:spec_decode_num_drafts")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens")
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens")

    def enter(self) -> float:
        """One more request in flight; the delay of each of its tokens."""
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.running.set(self.in_flight)
            return self.token_delay_s * (1.0 + self.slowdown * (self.in_flight - 1))

    def leave(self, e2e: float, ttft: float, gaps: list[float]) -> None:
        with self._lock:
            self.in_flight -= 1
            self.running.set(self.in_flight)
            self.success.labels("llama", "0", "length").inc()
            self.e2e.observe(e2e)
            self.ttft.observe(ttft)
            for gap in gaps:
                self.itl.observe(gap)
            if self.speculative:  # a draft of 3 per two tokens, two of them accepted
                steps = self.tokens // 2
                self.drafts.inc(steps)
                self.draft_tokens.inc(3 * steps)
                self.accepted.inc(steps)


class _ArmHandler(_Handler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        arm: LoadedArm = self.owner
        started = time.monotonic()
        delay = arm.enter()
        n = min(arm.tokens, int(body.get("max_tokens", arm.tokens)))
        arrivals: list[float] = []
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(n):
                time.sleep(delay)
                piece = {"choices": [{"index": 0, "delta": {"content": f" tok{i}"}}]}
                self.chunk(f"data: {json.dumps(piece)}\n\n".encode())
                arrivals.append(time.monotonic())
            usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
            last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
            self.chunk(f"data: {json.dumps(last)}\n\n".encode())
            if (body.get("stream_options") or {}).get("include_usage"):
                self.chunk(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            self.chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        finally:
            ttft = (arrivals[0] if arrivals else time.monotonic()) - started
            gaps = [b - a for a, b in itertools.pairwise(arrivals)]
            arm.leave(time.monotonic() - started, ttft, gaps)


class FaultProxy(_Server):
    def __init__(self, target: str, *, every: int = 0) -> None:
        super().__init__(_ProxyHandler)
        self.target, self.every = target, every
        self.seen = 0
        self.requests = Counter(
            "istio_requests",
            "Requests, by response code.",
            ["reporter", "response_code"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "istio_request_duration_milliseconds",
            "Duration.",
            ["reporter", "response_code"],
            buckets=ISTIO_MS_BUCKETS,
            registry=self.registry,
        )

    def fails_next(self) -> bool:
        with self._lock:
            self.seen += 1
            return self.every > 0 and self.seen % self.every == 0

    def count(self, code: int, started: float) -> None:
        self.requests.labels("destination", str(code)).inc()
        self.duration.labels("destination", str(code)).observe(
            (time.monotonic() - started) * 1000.0
        )


class _ProxyHandler(_Handler):
    def do_POST(self) -> None:
        proxy: FaultProxy = self.owner
        started = time.monotonic()
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if proxy.fails_next():
            self.send(500, b'{"error": {"message": "injected by the proxy"}}', "application/json")
            proxy.count(500, started)
            return
        headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
        with (
            httpx.Client(timeout=60.0) as client,
            client.stream("POST", proxy.target + self.path, content=raw, headers=headers) as up,
        ):
            self.send_response(up.status_code)
            self.send_header("Content-Type", up.headers.get("content-type", "text/event-stream"))
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for data in up.iter_raw():
                self.chunk(data)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            proxy.count(up.status_code, started)
