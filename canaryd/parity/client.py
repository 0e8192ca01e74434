"""HTTP to one arm's OpenAI-compatible server, for the capability probe.

The probe sends what the `Engine` protocol has no words for — `n > 1`, `logprobs`,
`response_format`, `stop`, non-streamed answers, a stream dropped mid-flight, sixteen
requests at once — so it speaks HTTP itself, with the arm's own configuration (base URL,
API, model, key, TLS, timeouts, `extra_body`). Nothing here raises for a failed request:
every call returns an `Answer` whose `error` says what went wrong, as engines do.

Every answer is read within bounds: at most `ANSWER_BYTES` bytes (past them the answer
fails with the cap as its reason and the connection is closed), and by a deadline for the
whole answer, body included — the arm's `timeouts.total`, never past the deadline of the
probe run the client serves. A dripping server is cut at that deadline (checked at every
chunk, and no read waits past it); a server that goes silent is cut by the read timeout,
which never exceeds the time the answer has left. `read_caps` counts the answers cut.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from engine.config import OpenAIEngineConfig
from engine.http import OpenAIEngine
from engine.sse import LineSplitter

__all__ = [
    "ANSWER_BYTES",
    "RUNNING_GAUGES",
    "Answer",
    "ArmClient",
    "ReadCap",
    "running_requests",
]

_DETAIL_CHARS = 200
# The most bytes one answer may carry. The probe's largest honest answers (16 streamed
# answers of 8 tokens, n = 2 choices of 32 tokens, 8 tokens with their log-probs, a
# server's /metrics page) are kilobytes; 2 MiB keeps a burst of 16 on two arms under
# 64 MiB even when every one of them is endless.
ANSWER_BYTES = 2 * 1024 * 1024
# What cut an answer short: its bytes, or its deadline (canaryd_read_caps_total's `what`).
ReadCap = Literal["probe_answer_bytes", "probe_deadline"]
# Each server's gauge of requests being generated now (summed over its label sets).
RUNNING_GAUGES = (
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
    "tgi_batch_current_size",
    "llamacpp:requests_processing",
)


@dataclass(frozen=True, slots=True)
class Answer:
    """What one request got back: the HTTP status (None when no answer came), an error
    ("" when the answer is well-formed), and per choice index its text and finish reason."""

    status: int | None
    error: str = ""
    texts: dict[int, str] = field(default_factory=dict)
    finish: dict[int, str | None] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)  # a non-streamed answer's JSON

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    @property
    def text(self) -> str:
        return self.texts.get(0, "")

    @property
    def completion_tokens(self) -> int | None:
        value = self.usage.get("completion_tokens")
        return value if isinstance(value, int) else None

    def describe(self) -> str:
        """The failure in a few words: `HTTP 400: …`, the error, or (a well-formed answer
        judged a failure by its content) what it held."""
        if self.status is not None and self.status != 200:
            return f"HTTP {self.status}: {self.error}"
        if self.error:
            return self.error
        return "HTTP 200 with no text" if not self.text.strip() else "HTTP 200"


def running_requests(metrics_text: str) -> float | None:
    """The server's running-requests gauge in a Prometheus text page (None: not there)."""
    total: float | None = None
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in RUNNING_GAUGES:
            try:
                total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return total


class _Cut(Exception):  # noqa: N818  (an answer cut short, reported as an Answer)
    """An answer a read cap cut short (`what`), or a request not sent (`what` None)."""

    def __init__(self, what: ReadCap | None, reason: str) -> None:
        super().__init__(reason)
        self.what, self.reason = what, reason


@dataclass(frozen=True, slots=True)
class _Budget:
    """One answer's deadline: `seconds` from its start, set by the probe run's deadline
    (`by_run`) or by the arm's `timeouts.total`."""

    ends_at: float
    seconds: float
    by_run: bool

    def missed(self, received: int) -> str:
        bound = "the probe's deadline" if self.by_run else "the arm's timeouts.total"
        return (
            f"no whole answer within {self.seconds:.3g} s ({bound}; {received} bytes read): "
            "connection closed"
        )


class ArmClient:
    """One arm's server, as the probe talks to it (a context manager: closes its client).
    `deadline` (a `time.monotonic()` instant) ends every answer of this client."""

    def __init__(self, name: str, config: OpenAIEngineConfig, deadline: float = math.inf) -> None:
        self.name, self.config, self.deadline = name, config, deadline
        headers, verify = OpenAIEngine(config).connection()
        timeouts = config.timeouts
        self._client = httpx.Client(
            base_url=config.base_url.rstrip("/"),
            headers=headers,
            verify=verify,
            timeout=httpx.Timeout(
                connect=timeouts.connect, read=timeouts.read, write=timeouts.read, pool=None
            ),
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
        )
        self._greedy: Answer | None = None
        self.read_caps: Counter[ReadCap] = Counter()
        self._caps_lock = threading.Lock()

    def __enter__(self) -> ArmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.config.api == "chat" else "/v1/completions"

    def body(self, content: str, **params: Any) -> dict[str, Any]:
        """A request for one user message `content` (chat) or prompt (completions): the
        model, the arm's `extra_body`, then `params`."""
        body: dict[str, Any] = {"model": self.config.model, "stream": False}
        if self.config.api == "chat":
            body["messages"] = [{"role": "user", "content": content}]
        else:
            body["prompt"] = content
        body.update(self.config.extra_body)
        body.update(params)
        return body

    # -- bounded reads ----------------------------------------------------------------

    def _cut(self, what: ReadCap, reason: str) -> _Cut:
        with self._caps_lock:
            self.read_caps[what] += 1
        return _Cut(what, reason)

    def _budget(self) -> tuple[_Budget, httpx.Timeout]:
        """The next answer's deadline, and timeouts no longer than it (`_Cut` when the
        probe's deadline has passed: nothing is sent)."""
        now = time.monotonic()
        run_left = self.deadline - now
        if run_left <= 0:
            raise _Cut(None, "not sent: the probe's deadline had passed")
        timeouts = self.config.timeouts
        seconds = min(timeouts.total, run_left)
        read = min(timeouts.read, seconds)
        timeout = httpx.Timeout(
            connect=min(timeouts.connect, seconds), read=read, write=read, pool=seconds
        )
        return _Budget(now + seconds, seconds, run_left < timeouts.total), timeout

    def _late(self, budget: _Budget, received: int) -> _Cut | None:
        """The cut for a read timeout at or past the answer's deadline (None: before it,
        an ordinary timeout)."""
        if time.monotonic() < budget.ends_at:
            return None
        return self._cut("probe_deadline", budget.missed(received))

    @contextlib.contextmanager
    def _open(
        self, method: str, url: str, **kwargs: Any
    ) -> Iterator[tuple[httpx.Response, Iterator[bytes]]]:
        """A request within its budget: its response (headers read) and its body's
        chunks, which raise `_Cut` past `ANSWER_BYTES` or the deadline."""
        budget, timeout = self._budget()
        try:
            with self._client.stream(method, url, timeout=timeout, **kwargs) as response:
                yield response, self._chunks(response, budget)
        except httpx.TimeoutException as exc:
            cut = self._late(budget, 0)
            if cut is None:
                raise
            raise cut from exc

    def _chunks(self, response: httpx.Response, budget: _Budget) -> Iterator[bytes]:
        received = 0
        chunks = response.iter_bytes()
        while True:
            try:
                data = next(chunks, None)
            except httpx.TimeoutException as exc:
                cut = self._late(budget, received)
                if cut is None:
                    raise
                raise cut from exc
            if data is None:
                return
            received += len(data)
            if received > ANSWER_BYTES:
                raise self._cut(
                    "probe_answer_bytes",
                    f"answer over the {ANSWER_BYTES}-byte cap ({received} bytes read): "
                    "connection closed",
                )
            if time.monotonic() > budget.ends_at:
                raise self._cut("probe_deadline", budget.missed(received))
            yield data

    def _fetch(self, method: str, url: str, **kwargs: Any) -> tuple[int, bytes]:
        """The status and the whole body of one request, read within its bounds."""
        with self._open(method, url, **kwargs) as (response, chunks):
            return response.status_code, b"".join(chunks)

    # -- requests -------------------------------------------------------------------

    def complete(self, body: dict[str, Any]) -> Answer:
        """A non-streamed request."""
        body = {**body, "stream": False}
        body.pop("stream_options", None)
        try:
            status, content = self._fetch("POST", self.path, json=body)
        except _Cut as cut:
            return Answer(None, cut.reason)
        except httpx.HTTPError as exc:
            return Answer(None, f"no answer: {type(exc).__name__}: {exc}"[:_DETAIL_CHARS])
        if status != 200:
            return Answer(status, _error_message(_text(content)))
        try:
            data = json.loads(content)
        except ValueError:
            return Answer(200, f"answer is not JSON: {_text(content)[:80]!r}")
        return self._read_body(data)

    def _read_body(self, data: Any) -> Answer:
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            return Answer(
                200, "answer without choices", body=data if isinstance(data, dict) else {}
            )
        texts: dict[int, str] = {}
        finish: dict[int, str | None] = {}
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict):
                return Answer(200, "a choice is not an object", body=data)
            index = choice.get("index", position)
            if self.config.api == "chat":
                message = choice.get("message")
                text = message.get("content") if isinstance(message, dict) else None
            else:
                text = choice.get("text")
            if not isinstance(index, int) or not isinstance(text, str | None):
                return Answer(200, f"choice {position} is malformed", body=data)
            texts[index] = text or ""
            reason = choice.get("finish_reason")
            finish[index] = reason if isinstance(reason, str) else None
        usage = data.get("usage")
        return Answer(
            200,
            texts=texts,
            finish=finish,
            usage=usage if isinstance(usage, dict) else {},
            body=data,
        )

    def stream(self, body: dict[str, Any]) -> Answer:
        """A streamed request read to its end (`[DONE]`, or a finish reason)."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        try:
            with self._open("POST", self.path, json=body) as (response, chunks):
                if response.status_code != 200:
                    return Answer(response.status_code, _error_message(_text(b"".join(chunks))))
                return self._read_stream(_lines(chunks))
        except _Cut as cut:
            return Answer(None, cut.reason)
        except httpx.HTTPError as exc:
            return Answer(None, f"stream broke: {type(exc).__name__}: {exc}"[:_DETAIL_CHARS])

    def _read_stream(self, lines: Iterator[str]) -> Answer:
        parts: dict[int, list[str]] = {}
        finish: dict[int, str | None] = {}
        usage: dict[str, Any] = {}
        done = False
        for line in lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                return Answer(200, f"malformed chunk: {data[:80]!r}")
            if not isinstance(chunk, dict):
                return Answer(200, f"chunk is not an object: {data[:80]!r}")
            if "error" in chunk:
                return Answer(200, f"error event: {json.dumps(chunk['error'])[:_DETAIL_CHARS]}")
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict):
                    return Answer(200, "a streamed choice is not an object")
                index = choice.get("index", 0)
                if self.config.api == "chat":
                    delta = choice.get("delta") or {}
                    piece = delta.get("content") if isinstance(delta, dict) else None
                else:
                    piece = choice.get("text")
                if isinstance(piece, str):
                    parts.setdefault(index, []).append(piece)
                if isinstance(choice.get("finish_reason"), str):
                    finish[index] = choice["finish_reason"]
        if not done and not finish:
            return Answer(200, "stream ended before [DONE]")
        texts = {index: "".join(pieces) for index, pieces in parts.items()}
        return Answer(200, texts=texts or {0: ""}, finish=finish, usage=usage)

    def greedy(self, content: str, max_tokens: int) -> Answer:
        """The plain greedy answer every check compares with, asked once per arm."""
        if self._greedy is None:
            self._greedy = self.complete(
                self.body(content, max_tokens=max_tokens, temperature=0.0, seed=0)
            )
        return self._greedy

    def cancel_streams(self, body: dict[str, Any], count: int) -> str:
        """Open `count` streams, read each up to its first content, then drop them all;
        "" when every stream got that far, else what went wrong."""
        body = {**body, "stream": True}
        with contextlib.ExitStack() as streams:
            for index in range(count):
                try:
                    response, chunks = streams.enter_context(
                        self._open("POST", self.path, json=body)
                    )
                    if response.status_code != 200:
                        return f"stream {index + 1}: HTTP {response.status_code}"
                    for line in _lines(chunks):
                        if line.startswith("data:") and ('"content"' in line or '"text"' in line):
                            break
                    else:
                        return f"stream {index + 1} ended before its first token"
                except _Cut as cut:
                    return f"stream {index + 1}: {cut.reason}"
                except httpx.HTTPError as exc:
                    return f"stream {index + 1}: {type(exc).__name__}: {exc}"[:_DETAIL_CHARS]
        return ""

    # -- what the server says about itself -----------------------------------------

    def reachable(self) -> str:
        """ "" when the server answers HTTP at all, else why not."""
        try:
            with self._open("GET", "/v1/models"):
                pass  # the status line is the answer: the body is not read
        except _Cut as cut:
            return f"{self.config.base_url} does not answer: {cut.reason}"
        except httpx.HTTPError as exc:
            return f"{self.config.base_url} does not answer: {type(exc).__name__}: {exc}"
        return ""

    def max_model_len(self) -> int | None:
        """The context limit the server reports for its model (`/v1/models`, vLLM and
        SGLang: `max_model_len`), None where it reports none."""
        try:
            data = json.loads(self._fetch("GET", "/v1/models")[1])
        except (_Cut, httpx.HTTPError, ValueError):
            return None
        models = data.get("data") if isinstance(data, dict) else None
        limits: dict[str, int] = {
            str(m.get("id")): int(m["max_model_len"])
            for m in models or ()
            if isinstance(m, dict) and isinstance(m.get("max_model_len"), int)
        }
        if self.config.model in limits:
            return limits[self.config.model]
        return next(iter(limits.values())) if len(limits) == 1 else None

    def count_tokens(self, text: str) -> int | None:
        """Tokens of `text` by the server's own `/tokenize` (vLLM, SGLang), None without it."""
        body = {"model": self.config.model, "prompt": text, "add_special_tokens": False}
        try:
            status, content = self._fetch("POST", "/tokenize", json=body)
            tokens = json.loads(content).get("tokens") if status == 200 else None
        except (_Cut, httpx.HTTPError, ValueError, AttributeError):
            return None
        return len(tokens) if isinstance(tokens, list) else None

    @property
    def metrics_url(self) -> str:
        url = self.config.metrics_url
        if url and url.rstrip("/").endswith("/metrics"):
            return url
        return f"{self.config.base_url.rstrip('/')}/metrics"

    def running(self) -> float | None:
        """The running-requests gauge now (None: the server reports none)."""
        try:
            status, content = self._fetch("GET", self.metrics_url, headers={"Accept": "text/plain"})
        except (_Cut, httpx.HTTPError):
            return None
        return running_requests(_text(content)) if status == 200 else None

    def settled(self, level: float, within_s: float) -> float | None:
        """Poll the running gauge until it is at most `level` or `within_s` ends; its
        last value."""
        deadline = min(time.monotonic() + within_s, self.deadline)
        while True:
            value = self.running()
            if value is None or value <= level or time.monotonic() > deadline:
                return value
            time.sleep(0.25)


def _text(content: bytes) -> str:
    return content.decode("utf-8", errors="replace")


def _lines(chunks: Iterator[bytes]) -> Iterator[str]:
    splitter = LineSplitter()
    for data in chunks:
        yield from splitter.feed(data)
    yield from splitter.flush()


def _error_message(text: str) -> str:
    """The message of an OpenAI-style error body, else the body's start."""
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:_DETAIL_CHARS] or "(empty body)"
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str):
        return message[:_DETAIL_CHARS]
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])[:_DETAIL_CHARS]
    return text.strip()[:_DETAIL_CHARS]
