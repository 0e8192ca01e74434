"""A loopback OpenAI-compatible server whose capabilities can be broken one by one, for
the capability probe's tests.

`CapabilityServer` is a real HTTP/1.1 server (standard-library `ThreadingHTTPServer` in
a daemon thread) that answers `/v1/chat/completions` and `/v1/completions`, streamed and
not, like vLLM: `n` choices, `stop`, `logprobs`/`top_logprobs`, `seed`, a
`response_format` JSON schema, a context limit (`/v1/models` reports `max_model_len`,
a longer prompt gets 400), `/tokenize`, vLLM's `prompt_logprobs` scoring (words in
`GARBAGE` score 15 nats, every other word 1), and a `vllm:num_requests_running` gauge on
`/metrics`. Its "model" answers with words of a small vocabulary, greedy by the prompt,
sampled by the seed. Healthy unless `broken` names capabilities (the probe's names),
each broken the way a speculative deployment breaks it:

- `streaming_equals_plain`: a stream carries one word more than the plain answer;
- `stop`: stop strings ignored;
- `max_tokens_1`: three tokens for `max_tokens = 1` (drafts accepted past the limit);
- `logprobs`: none in the answer;
- `n_gt_1`: the second choice has garbage words in it;
- `seed_reproducible`: the seed ignored under sampling;
- `json_schema`: the JSON cut short;
- `long_context`: 500 for a prompt past half the limit;
- `over_limit_4xx`: an over-limit prompt answered 200 (silently cut);
- `odd_input`: 500 for empty or whitespace-only input;
- `burst_16`: 503 past 8 requests at once (a request that arrives while others run
  holds its slot until one is refused, at most 0.3 s);
- `cancel_mid_stream`: a dropped stream stays counted as running.

`unsupported` names request features the server refuses with 400 (`logprobs`, `n`,
`response_format`).
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
import zlib
from collections.abc import Collection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.servers import word_id

__all__ = ["GARBAGE", "MAX_MODEL_LEN", "CapabilityServer"]

MAX_MODEL_LEN = 600
VOCABULARY = [
    "mars",
    "is",
    "the",
    "fourth",
    "planet",
    "from",
    "sun",
    "its",
    "red",
    "colour",
    "comes",
    "from",
    "iron",
    "oxide",
    "dust",
    "and",
    "it",
    "has",
    "two",
    "small",
    "moons",
    "named",
    "phobos",
    "deimos",
    "thin",
    "air",
    "cold",
    "deserts",
    "tall",
    "volcanoes",
]
GARBAGE = ("numbersexecuted", "Hr", "feministsox", "ofIntf")
JSON_ANSWER = '{"name": "Ada Lovelace", "year": 1815}'
TOKEN_DELAY_S = 0.004
BURST_HOLD_S = 0.3  # the broken burst: the longest a request waits for others to overflow
_GARBAGE_IDS = frozenset(word_id(w) for w in GARBAGE)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (cancelled streams) are expected here, not errors."""


class CapabilityServer:
    def __init__(
        self,
        broken: Collection[str] = (),
        unsupported: Collection[str] = (),
        model: str = "probe-model",
    ) -> None:
        self.broken, self.unsupported, self.model = set(broken), set(unsupported), model
        self.running = 0  # requests being generated now (the gauge)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._crowd = threading.Condition(self._lock)
        self._refused = 0  # requests the broken burst refused
        self._unseeded = itertools.count(random.Random().randrange(10_000))
        self._httpd = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> CapabilityServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def add_running(self, change: int) -> int:
        with self._lock:
            self.running += change
            return self.running

    def crowded(self) -> bool:
        """The broken burst: count this request as running and say whether it is one past
        8 at once (then it is not counted). One that arrives while others run holds its
        slot until a request is refused, at most `BURST_HOLD_S`: a burst overlaps whatever
        the length of its answers or the machine's load, and a lone request never waits."""
        with self._crowd:
            self.running += 1
            if self.running > 8:
                self.running -= 1
                self._refused += 1
                self._crowd.notify_all()
                return True
            refused = self._refused
            if self.running > 1:
                self._crowd.wait_for(lambda: self._refused > refused, timeout=BURST_HOLD_S)
            return False

    # -- the "model" ----------------------------------------------------------------

    def answers(self, body: dict[str, Any], content: str) -> list[tuple[list[str], str]]:
        """Each choice's tokens (text pieces) and finish reason."""
        max_tokens = int(body.get("max_tokens") or 16)
        temperature = float(body.get("temperature") or 0.0)
        n = int(body.get("n") or 1)
        choices = []
        for index in range(n):
            if body.get("response_format"):
                pieces = [JSON_ANSWER[i : i + 6] for i in range(0, len(JSON_ANSWER), 6)]
                if "json_schema" in self.broken:
                    pieces = pieces[:3]
                choices.append((pieces, "stop"))
                continue
            start = zlib.crc32(content.encode())
            if temperature > 0:
                seed = body.get("seed")
                if seed is not None and "seed_reproducible" not in self.broken:
                    start = random.Random(f"{seed}/{index}").randrange(10_000)
                else:
                    # The seed ignored: each request starts one word further on, so two
                    # requests never answer alike (random starts coincided 1 time in 30).
                    start = next(self._unseeded)
            words = [VOCABULARY[(start + 7 * i) % len(VOCABULARY)] for i in range(max_tokens)]
            if index == 1 and "n_gt_1" in self.broken:
                words = [
                    GARBAGE[i // 5 % len(GARBAGE)] if i % 5 == 3 else w for i, w in enumerate(words)
                ]
            if max_tokens == 1 and "max_tokens_1" in self.broken:
                words = words[:1] * 3
            pieces = [f" {w}" if i else w for i, w in enumerate(words)]
            finish = "length"
            stops = body.get("stop") or []
            if isinstance(stops, str):
                stops = [stops]
            text = "".join(pieces)
            hits = [text.index(s) for s in stops if s and s in text]
            if hits and "stop" not in self.broken:
                cut, kept, length = min(hits), [], 0
                for piece in pieces:
                    if length + len(piece) > cut:
                        kept += [piece[: cut - length]] if cut > length else []
                        break
                    kept.append(piece)
                    length += len(piece)
                pieces, finish = kept, "stop"
            choices.append((pieces, finish))
        return choices


def _prompt_of(body: dict[str, Any]) -> str:
    if "messages" in body:
        return "\n".join(str(m.get("content", "")) for m in body["messages"])
    return str(body.get("prompt", ""))


def _prompt_tokens(body: dict[str, Any]) -> int:
    return len(_prompt_of(body).split()) + (3 if "messages" in body else 1)


def _handler_for(server: CapabilityServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
            body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "code": status}})

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                model = {"id": server.model, "object": "model", "max_model_len": MAX_MODEL_LEN}
                self._send(200, {"object": "list", "data": [model]})
            elif self.path == "/metrics":
                text = (
                    "# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{model_name="{server.model}"}} '
                    f"{float(server.running)}\n"
                )
                self._send(200, text.encode(), "text/plain; version=0.0.4")
            else:
                self._error(404, "not found")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            server.requests.append(body)
            if self.path == "/tokenize":
                self._send(200, {"tokens": _tokenize(body), "max_model_len": MAX_MODEL_LEN})
                return
            if isinstance(body.get("prompt"), list):  # vLLM scoring a prompt of token ids
                self._send(200, _scored(body))
                return
            refusal = self._refusal(body)
            if refusal is not None:
                self._error(*refusal)
                return
            if "burst_16" not in server.broken:
                server.add_running(1)
            elif server.crowded():
                self._error(503, "overloaded")
                return
            leaked = False
            try:
                choices = server.answers(body, _prompt_of(body))
                if body.get("stream"):
                    leaked = not self._stream(body, choices)
                else:
                    self._complete(body, choices)
            finally:
                if not leaked:
                    server.add_running(-1)

        def _refusal(self, body: dict[str, Any]) -> tuple[int, str] | None:
            for feature in ("logprobs", "n", "response_format"):
                value = body.get(feature)
                asked = (
                    value is not None and value is not False and not (feature == "n" and value == 1)
                )
                if feature in server.unsupported and asked:
                    return 400, f"{feature} is not supported with speculative decoding"
            content = _prompt_of(body)
            if not content.strip() and "odd_input" in server.broken:
                return 500, "internal error: empty input"
            prompt = _prompt_tokens(body)
            if prompt + int(body.get("max_tokens") or 16) > MAX_MODEL_LEN:
                if "over_limit_4xx" in server.broken:
                    return None  # answered, the prompt silently cut
                return 400, f"This model's maximum context length is {MAX_MODEL_LEN} tokens"
            if prompt > MAX_MODEL_LEN // 2 and "long_context" in server.broken:
                return 500, "internal error: out of KV cache"
            return None

        def _usage(self, body: dict[str, Any], tokens: int) -> dict[str, int]:
            prompt = _prompt_tokens(body)
            return {
                "prompt_tokens": prompt,
                "completion_tokens": tokens,
                "total_tokens": prompt + tokens,
            }

        def _logprobs(self, body: dict[str, Any], pieces: list[str]) -> dict[str, Any] | None:
            if not body.get("logprobs") or "logprobs" in server.broken:
                return None
            if "messages" in body:
                top = int(body.get("top_logprobs") or 0)
                return {
                    "content": [
                        {
                            "token": p,
                            "logprob": -0.5,
                            "top_logprobs": [
                                {"token": p if k == 0 else f"alt{k}", "logprob": -0.5 - k}
                                for k in range(top)
                            ],
                        }
                        for p in pieces
                    ]
                }
            top = int(body["logprobs"])
            return {
                "tokens": pieces,
                "token_logprobs": [-0.5] * len(pieces),
                "top_logprobs": [
                    {p: -0.5, **{f"alt{k}": -0.5 - k for k in range(1, top)}} for p in pieces
                ],
            }

        def _complete(self, body: dict[str, Any], choices: list[tuple[list[str], str]]) -> None:
            chat = "messages" in body
            out = []
            for index, (pieces, finish) in enumerate(choices):
                text = "".join(pieces)
                choice: dict[str, Any] = {"index": index, "finish_reason": finish}
                if chat:
                    choice["message"] = {"role": "assistant", "content": text}
                else:
                    choice["text"] = text
                choice["logprobs"] = self._logprobs(body, pieces)
                out.append(choice)
            tokens = sum(len(pieces) for pieces, _ in choices)
            self._send(
                200,
                {
                    "id": "cmpl-probe",
                    "object": "chat.completion" if chat else "text_completion",
                    "model": server.model,
                    "choices": out,
                    "usage": self._usage(body, tokens),
                },
            )

        def _event(self, payload: str) -> None:
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _stream(self, body: dict[str, Any], choices: list[tuple[list[str], str]]) -> bool:
            """Stream the choices; False when the client went away mid-stream and the
            request was left counted as running (the broken cancellation)."""
            chat = "messages" in body
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def chunk(index: int, piece: str | None, finish: str | None = None) -> str:
                if chat:
                    choice: dict[str, Any] = {
                        "index": index,
                        "delta": {} if piece is None else {"content": piece},
                    }
                else:
                    choice = {"index": index, "text": piece or ""}
                choice["finish_reason"] = finish
                kind = "chat.completion.chunk" if chat else "text_completion"
                return json.dumps(
                    {"id": "cmpl-probe", "object": kind, "model": server.model, "choices": [choice]}
                )

            try:
                for index, (pieces, finish) in enumerate(choices):
                    if "streaming_equals_plain" in server.broken:
                        pieces = [*pieces, " extra"]
                    for piece in pieces:
                        time.sleep(TOKEN_DELAY_S)
                        self._event(chunk(index, piece))
                    self._event(chunk(index, None, finish))
                tokens = sum(len(pieces) for pieces, _ in choices)
                if (body.get("stream_options") or {}).get("include_usage"):
                    self._event(
                        json.dumps(
                            {"id": "cmpl-probe", "choices": [], "usage": self._usage(body, tokens)}
                        )
                    )
                self._event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:  # the client dropped the stream
                self.close_connection = True
                return "cancel_mid_stream" not in server.broken
            return True

    return Handler


def _tokenize(body: dict[str, Any]) -> list[int]:
    if "messages" in body:
        ids = []
        for message in body["messages"]:
            ids += [1, *(word_id(w) for w in str(message["content"]).split()), 2]
        return [*ids, 3]
    words = [word_id(w) for w in str(body.get("prompt", "")).split()]
    return [0, *words] if body.get("add_special_tokens", True) else words


def _scored(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's prompt_logprobs of a prompt of token ids: garbage words 15 nats, others 1."""
    prompt = body["prompt"]
    positions: list[dict[str, Any] | None] = [None]
    for token in prompt[1:]:
        logprob = -15.0 if token in _GARBAGE_IDS else -1.0
        rank = 1 if logprob > -2 else 5000
        entries = {str(token): {"logprob": logprob, "rank": rank, "decoded_token": "w"}}
        if rank != 1:
            entries["0"] = {"logprob": -0.2, "rank": 1, "decoded_token": "top"}
        positions.append(entries)
    choice = {"index": 0, "text": " x", "finish_reason": "length", "prompt_logprobs": positions}
    usage = {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1}
    return {"id": "cmpl-score", "object": "text_completion", "choices": [choice], "usage": usage}
