"""A loopback vLLM: an OpenAI-compatible streaming server and its Prometheus /metrics.

`LoopbackArm` is a real HTTP/1.1 server (standard-library `ThreadingHTTPServer` in a
daemon thread) that streams `/v1/chat/completions` and `/v1/completions` as vLLM does:
server-sent events, a usage figure on every chunk when `continuous_usage_stats` asks for
it, a final usage chunk carrying `metrics.speculative_decoding` on a speculative arm (vLLM
with `--per-request-spec-decode-metrics`), `data: [DONE]`; or an HTTP 500 with vLLM's
error body. The first token comes after one token's delay (prefill); then one chunk per
decode step, a speculative arm's verify step streaming 1 + the drafts it kept. Every
token's delay is multiplied by the arm's stall, if one is open (`arms.StallSchedule`).

`/metrics` serves vLLM's series (`vllm:request_success_total` with `finished_reason`,
error included, the e2e, TTFT and inter-token latency histograms with vLLM's bucket
bounds, requests running and waiting, the spec-decode counters on a speculative arm,
`process_start_time_seconds`) over the pairs it served **and** production traffic at
`production_rps` requests a second, drawn from the same `ArmModel` and added at each
scrape for the time since the last: the load a serving engine carries beside canaryd's
pairs, which the telemetry gates judge, without the CPU cost of serving it.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from benchmarks.rollout_sim.arms import (
    NUM_SPECULATIVE_TOKENS,
    Answer,
    Arm,
    ArmBehaviour,
    ArmModel,
    StallSchedule,
    spec_decode_metrics,
    step_delay,
)

# vLLM's bucket bounds (vllm/v1/metrics/loggers.py, Apache-2.0).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
MODEL = "llama"
_LABELS = (MODEL, "0")


class _VLLMMetrics:
    """vLLM's series, in a registry of their own."""

    def __init__(self, speculative: bool) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        reg = self.registry
        self.success = Counter(
            "vllm:request_success", "Finished requests.", [*labels, "finished_reason"], registry=reg
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "e2e", labels, buckets=E2E_BUCKETS, registry=reg
        ).labels(*_LABELS)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "ttft", labels, buckets=TTFT_BUCKETS, registry=reg
        ).labels(*_LABELS)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "itl", labels, buckets=ITL_BUCKETS, registry=reg
        ).labels(*_LABELS)
        self.running = Gauge("vllm:num_requests_running", "running", labels, registry=reg).labels(
            *_LABELS
        )
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=reg).labels(
            *_LABELS
        )
        self.waiting.set(0)
        Gauge("process_start_time_seconds", "start", registry=reg).set(time.time())
        self.speculative = speculative
        if speculative:
            self.drafts = Counter(
                "vllm:spec_decode_num_drafts", "drafts", labels, registry=reg
            ).labels(*_LABELS)
            self.draft_tokens = Counter(
                "vllm:spec_decode_num_draft_tokens", "draft tokens", labels, registry=reg
            ).labels(*_LABELS)
            self.accepted = Counter(
                "vllm:spec_decode_num_accepted_tokens", "accepted", labels, registry=reg
            ).labels(*_LABELS)

    def finished(self, reason: str, e2e: float, ttft: float | None, gaps: list[float]) -> None:
        self.success.labels(*_LABELS, reason).inc()
        self.e2e.observe(e2e)
        if ttft is not None:
            self.ttft.observe(ttft)
        for gap in gaps:
            self.itl.observe(gap)

    def drafted(self, accepted: tuple[int, ...], num_speculative_tokens: int) -> None:
        if self.speculative and accepted:
            self.drafts.inc(len(accepted))
            self.draft_tokens.inc(len(accepted) * num_speculative_tokens)
            self.accepted.inc(sum(accepted))


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (a timeout, an idle keep-alive closed) are expected."""


class LoopbackArm:
    """One arm on 127.0.0.1 (`url`), answering as `behaviour` says."""

    def __init__(
        self,
        arm: Arm,
        behaviour: ArmBehaviour,
        stalls: StallSchedule,
        *,
        seed: int = 0,
        production_rps: float = 5.0,
    ) -> None:
        self.arm, self.behaviour, self.stalls = arm, behaviour, stalls
        self.model = ArmModel(behaviour, arm, seed)
        self.production_model = ArmModel(behaviour, arm, seed + 1_000_003)
        self.metrics = _VLLMMetrics(behaviour.speculative)
        self.production_rps = production_rps
        self._lock = threading.Lock()
        self._in_flight = 0
        self._production_since = time.monotonic()
        self._production_carry = 0.0
        self.served = 0
        self.errors = 0
        self._httpd = _QuietServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.arm = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> LoopbackArm:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # -- state shared by the handler threads ------------------------------------------

    def enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self.served += 1

    def leave(self, error: bool) -> None:
        with self._lock:
            self._in_flight -= 1
            self.errors += error

    def exposition(self) -> bytes:
        """The /metrics page, production traffic since the last scrape added first."""
        with self._lock:
            now = time.monotonic()
            due = self.production_rps * (now - self._production_since) + self._production_carry
            self._production_since = now
            requests = int(due)
            self._production_carry = due - requests
            in_flight = self._in_flight
        answers = self.production_model.production(requests)
        for answer in answers:
            self._observe_production(answer)
        mean_e2e = self._mean_duration(answers)
        # Little's law: production keeps rate × duration requests running beside the pairs.
        self.metrics.running.set(in_flight + self.production_rps * mean_e2e)
        return generate_latest(self.metrics.registry)

    def _mean_duration(self, answers: list[Answer]) -> float:
        if not answers:
            return 0.0
        length = self.behaviour.mean_acceptance_length
        return sum(a.pace * (1 + len(a.steps) * length) for a in answers) / len(answers)

    def _observe_production(self, answer: Answer) -> None:
        if answer.error:
            self.metrics.finished("error", answer.pace, None, [])
            return
        step = step_delay(self.behaviour, answer.pace)
        gaps = [step] * len(answer.steps)
        self.metrics.finished("length", answer.pace + sum(gaps), answer.pace, gaps)
        self.metrics.drafted(answer.accepted, NUM_SPECULATIVE_TOKENS)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def arm(self) -> LoopbackArm:
        return cast(LoopbackArm, self.server.arm)  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: canaryd logs what it saw."""

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, payload: dict[str, Any] | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        data = f"data: {text}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._send(200, self.arm.exposition(), "text/plain; version=0.0.4; charset=utf-8")
        elif self.path == "/v1/models":
            models = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
            self._send(200, json.dumps(models).encode(), "application/json")
        else:
            self._send(404, b'{"error": "not found"}', "application/json")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self._send(404, b'{"error": "not found"}', "application/json")
            return
        chat = "messages" in body
        prompt = (
            "\n".join(str(m.get("content", "")) for m in body.get("messages", ()))
            if chat
            else str(body.get("prompt", ""))
        )
        arm = self.arm
        answer = arm.model.draw(prompt, int(body.get("max_tokens") or 16))
        arm.enter()
        request = arm.stalls.begin(arm.arm)
        slowed = False
        started = time.monotonic()
        try:
            if answer.error:
                time.sleep(answer.pace)
                error = {
                    "object": "error",
                    "message": "injected",
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
                self._send(500, json.dumps(error).encode(), "application/json")
                arm.metrics.finished("error", time.monotonic() - started, None, [])
                return
            if body.get("stream"):
                slowed = self._stream(body, answer, chat, started)
            else:
                slowed = self._whole(body, answer, chat, started)
        except OSError:  # the client hung up (its timeout): what a bounded client does
            pass
        finally:
            arm.stalls.end(arm.arm, request, slowed)
            arm.leave(answer.error)

    def _whole(self, body: dict[str, Any], answer: Answer, chat: bool, started: float) -> bool:
        """Answer `answer` as one JSON body (`stream` false, as the capability probe asks),
        `n` identical choices; True when a stall lengthened it."""
        arm = self.arm
        step = step_delay(arm.behaviour, answer.pace)
        slowed = False
        for delay in (answer.pace, *(step for _ in answer.steps)):
            factor = arm.stalls.factor(arm.arm)
            slowed |= factor > 1.0
            time.sleep(delay * factor)
        text = "".join(f" {w}" for w in answer.words)
        finish = "length" if len(answer.words) >= int(body.get("max_tokens") or 16) else "stop"
        if chat:
            choice: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
        else:
            choice = {"text": text}
        choices = [
            {"index": i, **choice, "finish_reason": finish} for i in range(int(body.get("n") or 1))
        ]
        tokens = len(answer.words) * len(choices)
        reply = {
            "id": "cmpl-loopback",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": choices,
            "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens},
        }
        self._send(200, json.dumps(reply).encode(), "application/json")
        arm.metrics.finished(finish, time.monotonic() - started, answer.pace, [])
        arm.metrics.drafted(answer.accepted, NUM_SPECULATIVE_TOKENS)
        return slowed

    def _stream(self, body: dict[str, Any], answer: Answer, chat: bool, started: float) -> bool:
        """Stream `answer`; True when a stall lengthened it."""
        arm = self.arm
        options = body.get("stream_options") or {}
        continuous = bool(options.get("continuous_usage_stats"))
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        sent = 0
        slowed = False

        def piece(text: str | None, finish: str | None = None) -> dict[str, Any]:
            if chat:
                delta = {} if text is None else {"content": text}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish}
            out: dict[str, Any] = {
                "id": "cmpl-loopback",
                "object": kind,
                "created": created,
                "model": MODEL,
                "choices": [choice],
            }
            if continuous:
                out["usage"] = {
                    "prompt_tokens": 5,
                    "completion_tokens": sent,
                    "total_tokens": 5 + sent,
                }
            return out

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if chat:
            self._chunk(
                {
                    "id": "cmpl-loopback",
                    "object": kind,
                    "created": created,
                    "model": MODEL,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "finish_reason": None,
                        }
                    ],
                }
            )
        step = step_delay(arm.behaviour, answer.pace)
        arrivals: list[float] = []
        words = list(answer.words)
        for count, delay in itertools.chain([(1, answer.pace)], ((n, step) for n in answer.steps)):
            factor = arm.stalls.factor(arm.arm)
            slowed |= factor > 1.0
            time.sleep(delay * factor)
            text = "".join(f" {w}" for w in words[sent : sent + count])
            sent += count
            self._chunk(piece(text))
            arrivals.append(time.monotonic())
        max_tokens = int(body.get("max_tokens") or 16)
        finish = "length" if sent >= max_tokens else "stop"
        self._chunk(piece(None, finish))
        final: dict[str, Any] = {
            "id": "cmpl-loopback",
            "object": kind,
            "created": created,
            "model": MODEL,
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": sent, "total_tokens": 5 + sent},
        }
        if arm.behaviour.speculative:
            final["metrics"] = {"speculative_decoding": spec_decode_metrics(answer.accepted)}
        if options.get("include_usage"):
            self._chunk(final)
        self._chunk("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        arm.metrics.finished(finish, time.monotonic() - started, arrivals[0] - started, gaps)
        arm.metrics.drafted(answer.accepted, NUM_SPECULATIVE_TOKENS)
        return slowed
