"""A small, misbehaving OpenAI-compatible server on loopback, for tests and benchmarks.

`MisbehavingServer` is a real HTTP/1.1 server (standard-library `ThreadingHTTPServer` in a
daemon thread) that streams `/v1/chat/completions` and `/v1/completions` the way vLLM
and llama.cpp do (chunked server-sent events, a usage chunk, `data: [DONE]`) — or fails
the way real servers fail. Each request takes the next `Behaviour` from a script
(`default`, healthy unless set, once the script is empty): an HTTP status (429/5xx, with
Retry-After), a stall before or during the stream, a stream cut mid-way (connection
dropped without the final chunk), a malformed chunk, text and counts that cannot be true
(`piece`, `final_extra`), or a hostile stream that never ends: `endless` (well-formed
content chunks of `chunk_bytes` each, every `token_delay_s`, for as long as the client
reads) and `drip` (one byte every `drip_s` seconds, for ever). It also serves `/metrics`
and `/server_info` bodies set by the test, and records every request body it received.

Like vLLM it tokenises (`POST /tokenize`: words to ids, a chat template of one id before
and after each message) and scores prompts: a non-streamed `/v1/completions` with
`prompt_logprobs` answers, per prompt position, the token's log-prob and rank from
`teacher_logprob` (plus the top token where the token is not it); with
`prompt_logprobs = False` it answers like a server without that extension.

`refused_url()` names a loopback port with nothing listening: a refused connection.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

__all__ = ["Behaviour", "MisbehavingServer", "refused_url", "teacher_logprob", "word_id"]

Fault = Literal[
    "ok", "status", "stall_headers", "stall_stream", "cut", "malformed", "json", "endless", "drip"
]


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How the server answers one request."""

    fault: Fault = "ok"
    status: int = 200  # fault "status": the HTTP status to answer with
    retry_after: str | None = None
    stall_s: float = 0.0  # faults "stall_*": how long to go silent
    tokens: int = 8  # content chunks in a healthy stream (cut: chunks before the cut)
    token_delay_s: float = 0.0
    final_extra: dict[str, Any] = field(default_factory=dict)  # merged into the usage chunk
    piece: str | None = None  # each content chunk's text (default " tok<i>")
    chunk_bytes: int = 64 * 1024  # fault "endless": the text of each content chunk
    drip_s: float = 2.0  # fault "drip": seconds between two bytes
    chunk_tokens: int = 1  # tokens each content chunk carries (its usage says so when asked)


def word_id(word: str) -> int:
    """The loopback server's token id of a word (ids 0-9 are its template markers)."""
    return 10 + zlib.crc32(word.encode()) % 1000


def teacher_logprob(token: int) -> tuple[float, int]:
    """The loopback server's (log-prob, rank) of `token` at any prompt position: even ids
    are the most likely token there (rank 1)."""
    return -(0.5 + 0.5 * (token % 5)), 1 if token % 2 == 0 else 3


def refused_url() -> str:
    """http://127.0.0.1:PORT where PORT was just free and nothing listens on it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (timeouts, cancellations) are expected here, not errors."""


class MisbehavingServer:
    def __init__(self) -> None:
        self.script: deque[Behaviour] = deque()
        self.default = Behaviour()
        self.requests: list[dict[str, Any]] = []
        self.metrics_text = ""
        self.server_info: dict[str, Any] = {}
        self.prompt_logprobs = True  # answer vLLM's prompt_logprobs extension
        self._stop = threading.Event()
        self._httpd = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval, once per test.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def queue(self, *behaviours: Behaviour) -> None:
        self.script.extend(behaviours)

    def next_behaviour(self) -> Behaviour:
        return self.script.popleft() if self.script else self.default

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def sleep(self, seconds: float) -> None:
        """Stall, but wake at shutdown so a stalled handler never outlives the test."""
        self._stop.wait(seconds)

    def __enter__(self) -> MisbehavingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def _handler_for(server: MisbehavingServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, server.metrics_text.encode(), "text/plain; version=0.0.4")
            elif self.path in ("/server_info", "/get_server_info"):
                self._send(200, json.dumps(server.server_info).encode(), "application/json")
            else:
                self._send(404, b'{"error": "not found"}', "application/json")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            server.requests.append(body)
            behaviour = server.next_behaviour()
            if behaviour.fault == "status":
                error = {"error": {"message": "injected", "code": behaviour.status}}
                headers = {"Retry_After": behaviour.retry_after} if behaviour.retry_after else {}
                self._send(
                    behaviour.status, json.dumps(error).encode(), "application/json", **headers
                )
                return
            if behaviour.fault == "stall_headers":
                server.sleep(behaviour.stall_s)
            if behaviour.fault in ("endless", "drip"):  # whatever was asked, streamed or not
                self._hostile(body, behaviour)
                return
            if behaviour.fault == "json":  # ignores stream=true: one JSON body
                self._send(200, b'{"choices": []}', "application/json")
                return
            if self.path == "/tokenize":
                self._json({"count": 0, "max_model_len": 2048, "tokens": _tokenize(body)})
                return
            if body.get("stream") is False:
                self._json(_scored(body, server.prompt_logprobs))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._stream(body, behaviour)

        def _hostile(self, body: dict[str, Any], behaviour: Behaviour) -> None:
            """An answer that never ends, until the client hangs up or the server stops."""
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            text = "x" * behaviour.chunk_bytes
            choice = {
                "index": 0,
                **({"delta": {"content": text}} if "messages" in body else {"text": text}),
            }
            event = f"data: {json.dumps({'choices': [choice]})}\n\n".encode()
            try:
                if behaviour.fault == "endless":
                    while not server.stopped:
                        self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                        self.wfile.flush()
                        if behaviour.token_delay_s:
                            server.sleep(behaviour.token_delay_s)
                    return
                for byte in itertools.cycle(event):
                    if server.stopped:
                        return
                    self.wfile.write(b"1\r\n" + bytes((byte,)) + b"\r\n")
                    self.wfile.flush()
                    server.sleep(behaviour.drip_s)
            except OSError:  # the client hung up: what a bounded client does
                return

        def _json(self, answer: dict[str, Any]) -> None:
            self._send(200, json.dumps(answer).encode(), "application/json")

        def _event(self, payload: str) -> None:
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _stream(self, body: dict[str, Any], behaviour: Behaviour) -> None:
            chat = "messages" in body
            created = int(time.time())

            continuous = (body.get("stream_options") or {}).get("continuous_usage_stats")
            sent = [0]

            def chunk(piece: str | None, finish: str | None = None) -> str:
                extra: dict[str, Any] = {}
                if continuous:
                    sent[0] += behaviour.chunk_tokens if piece else 0
                    extra["usage"] = {"prompt_tokens": 5, "completion_tokens": sent[0]}
                if chat:
                    delta = {} if piece is None else {"content": piece}
                    choice: dict[str, Any] = {"index": 0, "delta": delta}
                    kind = "chat.completion.chunk"
                else:
                    choice = {"index": 0, "text": piece or ""}
                    kind = "text_completion"
                choice["finish_reason"] = finish
                return json.dumps(
                    {"id": "cmpl-test", "object": kind, "created": created,
                     "model": body.get("model", ""), "choices": [choice], **extra}
                )  # fmt: skip

            if chat:
                self._event(chunk(None).replace('"delta": {}', '"delta": {"role": "assistant"}'))
            n = behaviour.tokens
            for i in range(n):
                if behaviour.fault == "stall_stream" and i == 1:
                    server.sleep(behaviour.stall_s)
                if behaviour.fault == "malformed" and i == 2:
                    self._event('{"choices": [{"index": 0, "delta": {"content": "x"')
                    continue
                if behaviour.token_delay_s:
                    time.sleep(behaviour.token_delay_s)
                self._event(chunk(f" tok{i}" if behaviour.piece is None else behaviour.piece))
            if behaviour.fault == "cut":  # drop the connection without the last chunk
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            max_tokens = int(body.get("max_tokens", n))
            self._event(chunk(None, "length" if n >= max_tokens else "stop"))
            if (body.get("stream_options") or {}).get("include_usage"):
                produced = n * behaviour.chunk_tokens
                usage = {"prompt_tokens": 5, "completion_tokens": produced,
                         "total_tokens": 5 + produced}  # fmt: skip
                final = {"id": "cmpl-test", "object": "chat.completion.chunk", "created": created,
                         "model": body.get("model", ""), "choices": [], "usage": usage}  # fmt: skip
                final.update(behaviour.final_extra)
                self._event(json.dumps(final))
            self._event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


def _tokenize(body: dict[str, Any]) -> list[int]:
    if "messages" in body:
        ids = []
        for message in body["messages"]:
            ids += [1, *(word_id(w) for w in str(message["content"]).split()), 2]
        return [*ids, 3] if body.get("add_generation_prompt", True) else ids
    words = [word_id(w) for w in str(body.get("prompt", "")).split()]
    return [0, *words] if body.get("add_special_tokens", True) else words


def _scored(body: dict[str, Any], prompt_logprobs: bool) -> dict[str, Any]:
    """A non-streamed completion; with prompt_logprobs, vLLM's per-position entries."""
    prompt = body.get("prompt")
    choice: dict[str, Any] = {"index": 0, "text": " x", "finish_reason": "length"}
    if prompt_logprobs and body.get("prompt_logprobs") and isinstance(prompt, list):
        positions: list[dict[str, Any] | None] = [None]
        for token in prompt[1:]:
            logprob, rank = teacher_logprob(token)
            entries = {str(token): {"logprob": logprob, "rank": rank, "decoded_token": "w"}}
            if rank != 1:
                entries["0"] = {"logprob": -0.1, "rank": 1, "decoded_token": "top"}
            positions.append(entries)
        choice["prompt_logprobs"] = positions
    n = len(prompt) if isinstance(prompt, list) else 1
    return {
        "id": "cmpl-test",
        "object": "text_completion",
        "model": body.get("model", ""),
        "choices": [choice],
        "usage": {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1},
    }
