"""The server-sent events of one streamed generation, read within a byte budget.

`read_events` reads an OpenAI-compatible event stream (`data:` lines, `[DONE]`) into a
`StreamedAnswer`: the text pieces, the finish reason, usage and the servers' own figures
(llama.cpp `timings`, SGLang `meta_info`, vLLM `metrics`) and when each content chunk
arrived with how many tokens it carried (`arrivals`: from the chunk's own usage when the
server streams it, as vLLM does with `continuous_usage_stats`, else from its log-probs,
else one token a chunk). It counts every byte the
server sends against `output_byte_cap(max_tokens)`: past it the generation fails as
`invalid_output` with `OUTPUT_CAP_DETAIL`, and the stream is closed, so an endless or
runaway stream costs a bounded amount of memory. The time bound is the caller's (the
engine's whole-generation deadline). `LineSplitter` cuts bytes into lines as httpx
does, for any client that must count bytes itself; `read_at_most` and `read_capped`
read a non-streamed body up to a limit (truncating it, or failing past it).
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import httpx

from engine import logprobs
from engine.types import ErrorKind, GenerationResult, TokenLogprobs

__all__ = [
    "OUTPUT_BYTES_PER_TOKEN",
    "OUTPUT_CAP_DETAIL",
    "OUTPUT_FRAMING_BYTES",
    "LineSplitter",
    "StreamFailure",
    "StreamedAnswer",
    "output_byte_cap",
    "over_output_cap",
    "read_at_most",
    "read_capped",
    "read_events",
]

# Bytes a server may send per requested token. Each event carries at least one token and
# its framing: a vLLM chat chunk is about 230 bytes (id, model name, created, logprobs
# null), llama.cpp with per-token timings about 600; a token's own text is a few bytes
# (up to ~50 as JSON escapes). 1 KiB is twice the largest real event.
OUTPUT_BYTES_PER_TOKEN = 1024
# Events that carry no token: the role chunk, usage, a final metrics chunk, keep-alive
# comments over a long generation.
OUTPUT_FRAMING_BYTES = 64 * 1024
OUTPUT_CAP_DETAIL = "output over its byte cap"
_DETAIL_CHARS = 300
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # str.splitlines' breaks


class StreamFailure(Exception):  # noqa: N818  (a result in flight, not an error condition)
    """Carries a failed result out of the streaming code to the engine."""

    def __init__(self, error: ErrorKind, detail: str, http_status: int | None = None) -> None:
        super().__init__(detail)
        self.error, self.detail, self.http_status = error, detail, http_status


def output_byte_cap(max_tokens: int) -> int:
    """The most bytes one generation of `max_tokens` may stream."""
    return OUTPUT_BYTES_PER_TOKEN * max(max_tokens, 1) + OUTPUT_FRAMING_BYTES


def over_output_cap(result: GenerationResult) -> bool:
    """Whether `result` failed because its stream passed `output_byte_cap`."""
    return result.error is ErrorKind.INVALID_OUTPUT and result.error_detail.startswith(
        OUTPUT_CAP_DETAIL
    )


class LineSplitter:
    """Bytes in, complete lines out: UTF-8 with undecodable bytes replaced, split at any
    line break `str.splitlines` knows (a `\\r\\n` split across two reads stays one
    break), as httpx's `iter_lines` splits them. An unfinished line waits for more."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._unfinished: list[str] = []
        self._trailing_cr = False

    def feed(self, data: bytes) -> list[str]:
        return self._lines(self._decoder.decode(data))

    def flush(self) -> list[str]:
        """The last line, when the body ends without a line break."""
        lines = self._lines(self._decoder.decode(b"", final=True))
        if self._unfinished or self._trailing_cr:
            lines.append("".join(self._unfinished))
        self._unfinished, self._trailing_cr = [], False
        return lines

    def _lines(self, text: str) -> list[str]:
        if self._trailing_cr:
            text, self._trailing_cr = "\r" + text, False
        if text.endswith("\r"):  # a `\n` may follow in the next read
            text, self._trailing_cr = text[:-1], True
        if not text:
            return []
        finished = text[-1] in _LINE_BREAKS
        lines = text.splitlines()
        if len(lines) == 1 and not finished:
            self._unfinished.append(lines[0])
            return []
        if self._unfinished:
            lines[0] = "".join(self._unfinished) + lines[0]
            self._unfinished = []
        if not finished:
            self._unfinished = [lines.pop()]
        return lines


@dataclass(slots=True)
class StreamedAnswer:
    """What one streamed response carried, filled chunk by chunk."""

    parts: list[str] = field(default_factory=list)
    ttft_s: float | None = None
    content_chunks: int = 0
    data_lines: int = 0
    finish_reason: str | None = None
    done: bool = False
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None  # llama.cpp
    meta_info: dict[str, Any] | None = None  # SGLang
    metrics: dict[str, Any] | None = None  # vLLM --per-request-spec-decode-metrics
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # engine.logprobs
    logprobs_broken: bool = False  # a chunk's log-probs did not read: all are dropped
    # (seconds since the request started, tokens) of each chunk that carried output
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    completion_seen: int = 0  # completion_tokens of the last chunk that reported usage


async def _lines(response: httpx.Response, cap: int) -> AsyncGenerator[str]:
    splitter = LineSplitter()
    received = 0
    async for data in response.aiter_bytes():
        received += len(data)
        if received > cap:
            raise StreamFailure(
                ErrorKind.INVALID_OUTPUT,
                f"{OUTPUT_CAP_DETAIL}: {received} bytes streamed, the cap is {cap} "
                f"({OUTPUT_BYTES_PER_TOKEN} per max_tokens + {OUTPUT_FRAMING_BYTES} of "
                "framing); the stream was closed",
            )
        for line in splitter.feed(data):
            yield line
    for line in splitter.flush():
        yield line


async def read_events(
    response: httpx.Response, *, chat: bool, started: float, cap: int
) -> StreamedAnswer:
    """Read the event stream to `[DONE]` within `cap` bytes; raise `StreamFailure` on
    anything malformed or too long."""
    stream = StreamedAnswer()
    lines = _lines(response, cap)
    try:
        async for line in lines:
            if not line.startswith("data:"):
                continue  # blank separators, `event:`/`id:` fields, `:` keep-alive comments
            data = line[5:].strip()
            stream.data_lines += 1
            if data == "[DONE]":
                stream.done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError as exc:
                raise StreamFailure(ErrorKind.INVALID, f"malformed chunk: {data[:120]!r}") from exc
            if not isinstance(chunk, dict):
                raise StreamFailure(ErrorKind.INVALID, f"chunk is not an object: {data[:120]!r}")
            _read_chunk(chunk, stream, chat, started)
    finally:
        await lines.aclose()
    if stream.data_lines == 0:
        raise StreamFailure(
            ErrorKind.INVALID,
            "no server-sent events in the response "
            f"(content-type {response.headers.get('content-type')!r})",
        )
    if not stream.done and stream.finish_reason is None:
        raise StreamFailure(
            ErrorKind.CONNECTION,
            f"stream ended before [DONE] after {stream.data_lines} events",
        )
    return stream


def _read_chunk(chunk: dict[str, Any], stream: StreamedAnswer, chat: bool, started: float) -> None:
    if "error" in chunk:  # vLLM and others report failures inside a 200 stream
        error = chunk["error"]
        code = error.get("code") if isinstance(error, dict) else None
        status = code if isinstance(code, int) else 500
        raise StreamFailure(
            ErrorKind.HTTP, f"error event: {json.dumps(error)[:_DETAIL_CHARS]}", status
        )
    arrived = time.perf_counter()
    for key in ("usage", "timings", "meta_info", "metrics"):
        value = chunk.get(key)
        if isinstance(value, dict):
            setattr(stream, key, value)
    choices = chunk.get("choices")
    if choices is None and stream.usage is None and stream.timings is None:
        raise StreamFailure(ErrorKind.INVALID, f"chunk without choices: {json.dumps(chunk)[:120]}")
    if not isinstance(choices, list | None):
        raise StreamFailure(ErrorKind.INVALID, "choices is not a list")
    for choice in choices or ():
        if not isinstance(choice, dict):
            raise StreamFailure(ErrorKind.INVALID, "choice is not an object")
        if choice.get("index", 0) != 0:
            continue
        if chat:
            delta = choice.get("delta") or {}
            piece = delta.get("content") if isinstance(delta, dict) else None
        else:
            piece = choice.get("text")
        if piece is not None and not isinstance(piece, str):
            raise StreamFailure(ErrorKind.INVALID, f"content is {type(piece).__name__}, not text")
        if piece:
            if stream.ttft_s is None:
                stream.ttft_s = arrived - started
            stream.parts.append(piece)
            stream.content_chunks += 1
        tokens = _chunk_tokens(chunk, choice, stream, bool(piece))
        if tokens:
            stream.arrivals.append((arrived - started, tokens))
        if not logprobs.read_chunk(choice, chat, stream.logprobs):
            stream.logprobs_broken = True
        if isinstance(choice.get("meta_info"), dict):
            stream.meta_info = choice["meta_info"]
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            stream.finish_reason = reason


def _chunk_tokens(
    chunk: dict[str, Any], choice: dict[str, Any], stream: StreamedAnswer, content: bool
) -> int:
    """How many output tokens a chunk's choice carried: the growth of its own usage's
    completion_tokens, else its log-probs' length, else one when it carried text."""
    usage = chunk.get("usage")
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(completion, int):
        grown, stream.completion_seen = completion - stream.completion_seen, completion
        return max(grown, 0)
    listed_logprobs = choice.get("logprobs")
    if isinstance(listed_logprobs, dict):
        listed = listed_logprobs.get("content", listed_logprobs.get("tokens"))
        if isinstance(listed, list) and listed:
            return len(listed)
    return 1 if content else 0


async def read_at_most(response: httpx.Response, limit: int) -> bytes:
    """The body's first `limit` bytes; the rest is left unread (an error message)."""
    kept = bytearray()
    async for data in response.aiter_bytes():
        kept += data[: limit - len(kept)]
        if len(kept) >= limit:
            break
    return bytes(kept)


async def read_capped(response: httpx.Response, limit: int) -> bytes:
    """The whole body, or `ValueError` once it passes `limit` bytes."""
    kept = bytearray()
    async for data in response.aiter_bytes():
        kept += data
        if len(kept) > limit:
            raise ValueError(f"answer over {limit} bytes")
    return bytes(kept)
