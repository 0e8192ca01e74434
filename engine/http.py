"""The HTTP engine: one arm served by a remote OpenAI-compatible server.

`OpenAIEngine` streams `/v1/chat/completions` or `/v1/completions` (server-sent events,
`stream_options.include_usage`) and measures TTFT at the first content chunk, TPOT over
the rest, the gaps between tokens from each chunk's arrival and token count
(`InterTokenLatency`), and end-to-end around the whole call, retries included. Every
failure becomes a `GenerationResult` with its `ErrorKind` — refused or cut connections
`connection`, connect/read/total timeouts `timeout`, HTTP errors `http` with the status,
malformed chunks `invalid`, a stream past its byte cap `invalid_output` — and nothing is
raised.

Every read is bounded: the whole generation (queueing, scrapes, retries and every byte of
the stream) by one deadline (`timeouts.total`, lowered by the request's `timeout_s`), the
stream by `engine.sse.output_byte_cap(max_tokens)` bytes (past it the stream is closed),
error bodies, metrics pages and scoring answers by fixed byte limits.

Why async under a sync facade: the Engine protocol is synchronous (the pair runner calls
arms one after the other), but shutdown must cancel requests that are in flight and a
per-arm concurrency limit must hold across the daemon's threads. An asyncio loop on one
background thread owns an `httpx.AsyncClient` and an `asyncio.Semaphore`; `generate`
submits a coroutine and waits for it; `close` cancels every pending task (their callers
get a `connection` result saying the engine closed) and closes the client.

Retries (`max_retries`) happen only where the server cannot have started the request:
a refused connection or connect timeout (nothing was sent), and 429/503 answered before
any token was streamed (the server said it did not take the work; Retry-After honoured).
A request that streamed anything, or failed with any other status, is never retried:
it may have run, and a retried latency would not be the latency of one request.

Acceptance (speculative arms only) is read per `server_kind` by `engine.acceptance`:
exact figures the response carries win over a window scraped around it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import os
import ssl
import threading
import time
import zlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx
import structlog

from engine import acceptance, logprobs, prompt_logprobs
from engine.config import OpenAIEngineConfig
from engine.errors import EngineConfigError
from engine.sse import (
    StreamedAnswer,
    StreamFailure,
    output_byte_cap,
    read_at_most,
    read_capped,
    read_events,
)
from engine.timing import inter_token_latency
from engine.types import (
    AcceptanceSource,
    ErrorKind,
    GenerationRequest,
    GenerationResult,
    Message,
    SpeculativeStats,
    TeacherScore,
)

__all__ = ["OpenAIEngine"]

log = structlog.get_logger(__name__)

_RETRY_STATUSES = frozenset({429, 503})
_BACKOFF_S = 0.2  # first retry delay; doubles each attempt
_MAX_RETRY_AFTER_S = 10.0
_DETAIL_CHARS = 300
_PROMPT_IDS_CACHED = 16
_ERROR_BODY_BYTES = 64 * 1024  # of an error answer: its message, never a whole stream
_METRICS_PAGE_BYTES = 8 * 1024 * 1024  # a vLLM page is ~0.1-1 MB
_JSON_ANSWER_BYTES = 64 * 1024 * 1024  # prompt log-probs: ~150 bytes a token of a long context
_T = TypeVar("_T")


class OpenAIEngine:
    def __init__(self, config: OpenAIEngineConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # The prompt token ids of recent prompts: both arms of a pair are scored on one.
        self._prompt_ids: dict[tuple[Message, ...], list[int]] = {}
        self._closed = False
        self._logprobs_refused = False  # the server answered 400/422 to a log-probs request

    @property
    def speculative(self) -> bool:
        return self.config.speculative

    @property
    def identity(self) -> dict[str, str]:
        return {
            "kind": "openai",
            "mode": "speculative" if self.speculative else "baseline",
            "server_kind": self.config.server_kind,
            "api": self.config.api,
            "model": self.config.model,
            "base_url": self.config.base_url,
        }

    # -- lifecycle -----------------------------------------------------------------

    def _api_key(self) -> str | None:
        cfg = self.config
        if cfg.api_key is not None:
            return cfg.api_key.get_secret_value()
        if cfg.api_key_env:
            value = os.environ.get(cfg.api_key_env)
            if not value:
                raise EngineConfigError("api_key_env", f"{cfg.api_key_env!r} is not set")
            return value.strip()
        if cfg.api_key_file is not None:
            try:
                return cfg.api_key_file.read_text().strip()
            except OSError as exc:
                raise EngineConfigError("api_key_file", f"cannot read: {exc}") from exc
        return None

    def _tls(self) -> ssl.SSLContext | bool:
        cfg = self.config
        if not cfg.tls_verify:
            return False
        try:
            context = ssl.create_default_context(
                cafile=str(cfg.ca_bundle) if cfg.ca_bundle else None
            )
            if cfg.client_cert is not None:
                context.load_cert_chain(
                    str(cfg.client_cert), str(cfg.client_key) if cfg.client_key else None
                )
        except (OSError, ssl.SSLError) as exc:
            raise EngineConfigError("tls", f"cannot load certificates: {exc}") from exc
        return context

    def connection(self) -> tuple[dict[str, str], ssl.SSLContext | bool]:
        """The headers (authorization) and the TLS verification every request to this
        arm's server carries: for clients other than this engine's own (the probe)."""
        key = self._api_key()
        return ({"Authorization": f"Bearer {key}"} if key else {}), self._tls()

    def load(self) -> None:
        """Start the event loop thread and the HTTP client. Idempotent; sends nothing."""
        with self._lock:
            if self._closed:
                raise EngineConfigError("lifecycle", "engine is closed")
            if self._loop is not None:
                return
            cfg = self.config
            auth, verify = self.connection()
            headers = {"Accept": "text/event-stream", **auth}
            timeout = httpx.Timeout(
                connect=cfg.timeouts.connect,
                read=cfg.timeouts.read,
                write=cfg.timeouts.read,
                pool=cfg.timeouts.total,
            )
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=run, name="canaryd-openai-engine", daemon=True)
            thread.start()
            ready.wait()

            async def make() -> None:
                self._client = httpx.AsyncClient(
                    base_url=cfg.base_url.rstrip("/"),
                    headers=headers,
                    timeout=timeout,
                    verify=verify,
                    limits=httpx.Limits(max_connections=cfg.max_concurrency + 1),
                )
                self._slots = asyncio.Semaphore(cfg.max_concurrency)

            asyncio.run_coroutine_threadsafe(make(), loop).result()
            self._loop, self._thread = loop, thread

    def close(self) -> None:
        """Cancel requests in flight (their callers get a `connection` result), close the
        client and stop the loop thread. Idempotent."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return

        async def shutdown() -> None:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._client is not None:
                await self._client.aclose()
            await asyncio.get_running_loop().shutdown_asyncgens()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()

    def count_tokens(self, text: str) -> list[int]:
        """A remote arm has no local tokenizer: word ids (the unit scoring falls back to
        when results carry no token ids, as HTTP results do not)."""
        return [zlib.crc32(word.encode()) for word in text.split()]

    # -- teacher scoring ------------------------------------------------------------

    def score(self, messages: tuple[Message, ...], output: GenerationResult) -> TeacherScore | None:
        """vLLM only: the server's prompt log-probs of prompt + output (engine.prompt_logprobs).
        None for other servers (no such extension), an empty output, or any failure."""
        if self.config.server_kind != "vllm" or not messages:
            return None
        if not (output.token_ids or output.text):
            return None
        try:
            self.load()
        except EngineConfigError:
            return None
        loop = self._loop
        if loop is None:
            return None
        try:
            return self._submit(loop, self._score(messages, output)).result()
        except concurrent.futures.CancelledError:
            return None

    async def _score(
        self, messages: tuple[Message, ...], output: GenerationResult
    ) -> TeacherScore | None:
        assert self._slots is not None
        cfg = self.config
        try:
            async with asyncio.timeout(cfg.timeouts.total), self._slots:
                prompt_ids = self._prompt_ids.get(messages)
                if prompt_ids is None:
                    body = prompt_logprobs.tokenize_body(cfg.model, cfg.api, messages)
                    prompt_ids = prompt_logprobs.tokenized(await self._post_json("/tokenize", body))
                    if len(self._prompt_ids) >= _PROMPT_IDS_CACHED:
                        self._prompt_ids.pop(next(iter(self._prompt_ids)))
                    self._prompt_ids[messages] = prompt_ids
                output_ids = list(output.token_ids)
                if not output_ids:
                    body = prompt_logprobs.tokenize_body(cfg.model, cfg.api, None, output.text)
                    output_ids = prompt_logprobs.tokenized(await self._post_json("/tokenize", body))
                if not output_ids:
                    return None
                answer = await self._post_json(
                    "/v1/completions",
                    prompt_logprobs.score_body(cfg.model, [*prompt_ids, *output_ids]),
                )
            return prompt_logprobs.teacher_score(answer, len(prompt_ids), output_ids)
        except (TimeoutError, httpx.HTTPError, ValueError) as exc:
            log.warning("openai.score_failed", error=f"{type(exc).__name__}: {exc}"[:300])
            return None

    async def _post_json(self, path: str, body: dict[str, Any]) -> Any:
        """POST `body`, return the decoded JSON answer (httpx.HTTPError on a failed status,
        ValueError on a body that is not JSON)."""
        assert self._client is not None
        headers = {"Accept": "application/json"}
        async with self._client.stream("POST", path, json=body, headers=headers) as response:
            response.raise_for_status()
            return json.loads(await read_capped(response, _JSON_ANSWER_BYTES))

    # -- generation -----------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> GenerationResult:
        started = time.perf_counter()
        try:
            self.load()
        except EngineConfigError as exc:
            return GenerationResult.failed(ErrorKind.CONNECTION, str(exc), 0.0)
        loop = self._loop
        if loop is None:
            return GenerationResult.failed(ErrorKind.CONNECTION, "engine is closed", 0.0)
        future = self._submit(loop, self._generate(request))
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            return GenerationResult.failed(
                ErrorKind.CONNECTION,
                "cancelled: the engine was closed while the request was in flight",
                time.perf_counter() - started,
            )

    def _submit(
        self, loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, _T]
    ) -> concurrent.futures.Future[_T]:
        async def tracked() -> _T:
            task = asyncio.current_task()
            assert task is not None
            self._tasks.add(task)
            try:
                return await coroutine
            finally:
                self._tasks.discard(task)

        return asyncio.run_coroutine_threadsafe(tracked(), loop)

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        cfg, sampling = self.config, request.sampling
        body: dict[str, Any] = {
            "model": cfg.model,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if cfg.server_kind == "vllm":
            # usage on every chunk: how many tokens each chunk carried (a verify step's)
            body["stream_options"]["continuous_usage_stats"] = True
        if cfg.server_kind == "llamacpp" and sampling.greedy:
            # llama-cpp-python's server applies repeat_penalty 1.1 unless told, so its
            # "greedy" token is not the argmax of the log-probs it lists (raw): the greedy
            # check and its teacher need the argmax. extra_body, merged last, overrides.
            body["repeat_penalty"] = 1.0
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if cfg.api == "chat":
            body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
        else:
            # The completions API takes raw text: the server's chat template is bypassed.
            body["prompt"] = "\n\n".join(m.content for m in request.messages)
        if self._asks_logprobs(request):
            body.update(logprobs.request_fields(cfg.api, cfg.top_logprobs))
        body.update(cfg.extra_body)
        return body

    def _asks_logprobs(self, request: GenerationRequest) -> bool:
        """A baseline's greedy requests ask for its top log-probs (the greedy divergence
        judge, canaryd.scoring.margins), unless the server refused them once."""
        cfg = self.config
        return (
            not self.speculative
            and request.sampling.greedy
            and cfg.top_logprobs > 0
            and not self._logprobs_refused
        )

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        assert self._slots is not None
        cfg = self.config
        limit = min(cfg.timeouts.total, request.timeout_s or math.inf)
        window = self.speculative and cfg.server_kind in ("vllm", "tgi") and cfg.metrics_url
        started = time.perf_counter()
        try:
            async with asyncio.timeout(limit), self._slots:
                before = await self._scrape() if window else None
                started = time.perf_counter()  # queueing for a slot is not the server's latency
                stream = await self._stream_with_retries(request, started)
                e2e = time.perf_counter() - started
                after = await self._scrape() if self.speculative and cfg.metrics_url else None
        except TimeoutError:
            return GenerationResult.failed(
                ErrorKind.TIMEOUT,
                f"no complete answer within {limit:g} s",
                time.perf_counter() - started,
            )
        except StreamFailure as failure:
            return GenerationResult.failed(
                failure.error,
                failure.detail,
                time.perf_counter() - started,
                http_status=failure.http_status,
            )
        return self._result(stream, e2e, before, after)

    async def _stream_with_retries(
        self, request: GenerationRequest, started: float
    ) -> StreamedAnswer:
        assert self._client is not None
        cfg = self.config
        path = "/v1/chat/completions" if cfg.api == "chat" else "/v1/completions"
        body = self._body(request)
        attempt = 0
        while True:
            delay = _BACKOFF_S * 2**attempt
            try:
                async with self._client.stream("POST", path, json=body) as response:
                    if response.status_code >= 400:
                        message = await read_at_most(response, _ERROR_BODY_BYTES)
                        text = message.decode(errors="replace")
                        if response.status_code in (400, 422) and "logprobs" in body:
                            # Refused before any work: ask again without, from now on.
                            log.warning("openai.logprobs_refused", status=response.status_code)
                            self._logprobs_refused = True
                            body = self._body(request)
                            continue
                        if response.status_code in _RETRY_STATUSES and attempt < cfg.max_retries:
                            delay = _retry_after(response.headers.get("retry-after"), delay)
                            log.info("openai.retry", status=response.status_code, delay_s=delay)
                        else:
                            raise StreamFailure(
                                ErrorKind.HTTP,
                                f"HTTP {response.status_code}: {text[:_DETAIL_CHARS]}",
                                response.status_code,
                            )
                    else:
                        return await read_events(
                            response,
                            chat=cfg.api == "chat",
                            started=started,
                            cap=self._byte_cap(request, "logprobs" in body),
                        )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt >= cfg.max_retries:
                    kind = (
                        ErrorKind.TIMEOUT
                        if isinstance(exc, httpx.ConnectTimeout)
                        else ErrorKind.CONNECTION
                    )
                    raise StreamFailure(kind, f"{type(exc).__name__}: {exc}") from exc
                log.info("openai.retry", error=type(exc).__name__, delay_s=delay)
            except httpx.TimeoutException as exc:
                raise StreamFailure(ErrorKind.TIMEOUT, f"{type(exc).__name__}: {exc}") from exc
            except httpx.HTTPError as exc:  # cut stream, reset, protocol error
                raise StreamFailure(ErrorKind.CONNECTION, f"{type(exc).__name__}: {exc}") from exc
            attempt += 1
            await asyncio.sleep(delay)

    def _byte_cap(self, request: GenerationRequest, with_logprobs: bool) -> int:
        """`output_byte_cap`, and room for the listed candidates when log-probs are asked."""
        tokens = max(request.sampling.max_tokens, 1)
        candidates = self.config.top_logprobs + 1 if with_logprobs else 0
        return output_byte_cap(tokens) + logprobs.BYTES_PER_CANDIDATE * candidates * tokens

    # -- acceptance -----------------------------------------------------------------

    async def _scrape(self) -> acceptance.Scrape | None:
        """One read of `metrics_url`; None (acceptance not reported) if it fails."""
        assert self._client is not None
        cfg = self.config
        if not cfg.metrics_url:
            return None
        try:
            async with self._client.stream(
                "GET", cfg.metrics_url, headers={"Accept": "*/*"}
            ) as response:
                response.raise_for_status()
                page = await read_capped(response, _METRICS_PAGE_BYTES)
            if cfg.server_kind == "vllm":
                return acceptance.Scrape(acceptance.vllm_counters(page.decode(errors="replace")))
            if cfg.server_kind == "tgi":
                return acceptance.Scrape(acceptance.tgi_counters(page.decode(errors="replace")))
            if cfg.server_kind == "sglang":
                return acceptance.Scrape({}, acceptance.sglang_avg_accept_length(json.loads(page)))
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("openai.metrics_unreadable", url=cfg.metrics_url, error=str(exc))
        return None

    def _acceptance(
        self,
        stream: StreamedAnswer,
        output_tokens: int,
        before: acceptance.Scrape | None,
        after: acceptance.Scrape | None,
    ) -> SpeculativeStats | None:
        cfg = self.config
        if not self.speculative:
            return None
        if cfg.server_kind == "llamacpp" and stream.timings is not None:
            return acceptance.llamacpp_stats(stream.timings, output_tokens)
        if cfg.server_kind == "sglang":
            if stream.meta_info is not None:
                exact = acceptance.sglang_stats(stream.meta_info, output_tokens)
                if exact is not None:
                    return exact
            if after is not None and after.accept_length is not None:
                return acceptance.stats_from_accept_length(after.accept_length, output_tokens)
        if cfg.server_kind == "vllm" and stream.metrics is not None:
            exact = acceptance.vllm_request_stats(stream.metrics)
            if exact is not None:
                return exact
        if before is None or after is None:
            return None
        if cfg.server_kind == "vllm":
            return acceptance.vllm_window_stats(before.counters, after.counters)
        if cfg.server_kind == "tgi":
            return acceptance.tgi_window_stats(
                before.counters, after.counters, cfg.num_draft_tokens
            )
        return None

    def _result(
        self,
        stream: StreamedAnswer,
        e2e: float,
        before: acceptance.Scrape | None,
        after: acceptance.Scrape | None,
    ) -> GenerationResult:
        usage = stream.usage or {}
        completion = usage.get("completion_tokens")
        # Without usage, one content chunk is one token on vLLM, SGLang, TGI and llama.cpp.
        output_tokens = completion if isinstance(completion, int) else stream.content_chunks
        prompt = usage.get("prompt_tokens")
        ttft = stream.ttft_s
        tpot = (
            (e2e - ttft) / (output_tokens - 1) if ttft is not None and output_tokens > 1 else None
        )
        stats = self._acceptance(stream, output_tokens, before, after)
        return GenerationResult(
            text="".join(stream.parts),
            token_ids=(),
            finish_reason=stream.finish_reason or "stop",
            prompt_tokens=prompt if isinstance(prompt, int) else 0,
            output_tokens=output_tokens,
            ttft_s=ttft,
            tpot_s=tpot,
            e2e_s=e2e,
            speculative=stats,
            acceptance_source=stats.source if stats else AcceptanceSource.NOT_REPORTED,
            token_logprobs=() if stream.logprobs_broken else tuple(stream.logprobs),
            itl=inter_token_latency(stream.arrivals),
        )


def _retry_after(header: str | None, default: float) -> float:
    """Seconds from a Retry-After header (delta-seconds form), capped; else `default`."""
    try:
        return min(max(float(header), 0.0), _MAX_RETRY_AFTER_S) if header else default
    except ValueError:
        return default
