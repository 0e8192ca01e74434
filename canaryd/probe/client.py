"""HTTP to one arm's OpenAI-compatible server, for the capability probe.

The probe sends what the `Engine` protocol has no words for — `n > 1`, `logprobs`,
`response_format`, `stop`, non-streamed answers, a stream dropped mid-flight, sixteen
requests at once — so it speaks HTTP itself, with the arm's own configuration (base URL,
API, model, key, TLS, timeouts, `extra_body`). Nothing here raises for a failed request:
every call returns an `Answer` whose `error` says what went wrong, as engines do.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from engine.config import OpenAIEngineConfig
from engine.http import OpenAIEngine

__all__ = ["RUNNING_GAUGES", "Answer", "ArmClient", "running_requests"]

_DETAIL_CHARS = 200
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
        """The failure in a few words: `HTTP 400: …`, or the error."""
        if self.status is not None and self.status != 200:
            return f"HTTP {self.status}: {self.error}"
        return self.error or "ok"


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


class ArmClient:
    """One arm's server, as the probe talks to it (a context manager: closes its client)."""

    def __init__(self, name: str, config: OpenAIEngineConfig) -> None:
        self.name, self.config = name, config
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

    # -- requests -------------------------------------------------------------------

    def complete(self, body: dict[str, Any]) -> Answer:
        """A non-streamed request."""
        body = {**body, "stream": False}
        body.pop("stream_options", None)
        try:
            response = self._client.post(self.path, json=body)
        except httpx.HTTPError as exc:
            return Answer(None, f"no answer: {type(exc).__name__}: {exc}"[:_DETAIL_CHARS])
        if response.status_code != 200:
            return Answer(response.status_code, _error_message(response.text))
        try:
            data = response.json()
        except ValueError:
            return Answer(200, f"answer is not JSON: {response.text[:80]!r}")
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
            with self._client.stream("POST", self.path, json=body) as response:
                if response.status_code != 200:
                    return Answer(response.status_code, _error_message(response.read().decode()))
                return self._read_stream(response.iter_lines())
        except httpx.HTTPError as exc:
            return Answer(None, f"stream broke: {type(exc).__name__}: {exc}"[:_DETAIL_CHARS])

    def _read_stream(self, lines: Any) -> Answer:
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
                    response = streams.enter_context(
                        self._client.stream("POST", self.path, json=body)
                    )
                    if response.status_code != 200:
                        return f"stream {index + 1}: HTTP {response.status_code}"
                    for line in response.iter_lines():
                        if line.startswith("data:") and ('"content"' in line or '"text"' in line):
                            break
                    else:
                        return f"stream {index + 1} ended before its first token"
                except httpx.HTTPError as exc:
                    return f"stream {index + 1}: {type(exc).__name__}: {exc}"[:_DETAIL_CHARS]
        return ""

    # -- what the server says about itself -----------------------------------------

    def reachable(self) -> str:
        """ "" when the server answers HTTP at all, else why not."""
        try:
            self._client.get("/v1/models")
        except httpx.HTTPError as exc:
            return f"{self.config.base_url} does not answer: {type(exc).__name__}: {exc}"
        return ""

    def max_model_len(self) -> int | None:
        """The context limit the server reports for its model (`/v1/models`, vLLM and
        SGLang: `max_model_len`), None where it reports none."""
        try:
            data = self._client.get("/v1/models").json()
        except (httpx.HTTPError, ValueError):
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
            response = self._client.post("/tokenize", json=body)
            tokens = response.json().get("tokens") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
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
            response = self._client.get(self.metrics_url, headers={"Accept": "text/plain"})
        except httpx.HTTPError:
            return None
        return running_requests(response.text) if response.status_code == 200 else None

    def settled(self, level: float, within_s: float) -> float | None:
        """Poll the running gauge until it is at most `level` or `within_s` ends; its
        last value."""
        deadline = time.monotonic() + within_s
        while True:
            value = self.running()
            if value is None or value <= level or time.monotonic() > deadline:
                return value
            time.sleep(0.25)


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
