"""The daemon's status endpoints: `/metrics`, `/healthz`, `/readyz` and `/v1/switch` on
`server.listen`.

`StatusServer` serves a small ASGI app with uvicorn on its own event loop, in a daemon
thread. A connection costs no thread, so slow or hostile clients cannot starve probes and
scrapes: every request must arrive whole within `REQUEST_DEADLINE_S` of its connection
(or of the previous answer on a keep-alive connection), else the connection is closed,
and beyond `MAX_CONNECTIONS` open connections a request is answered 503 at once (but on
the probes, `/v1/switch` and `/metrics`: `RESERVED_PATHS`). The
probes call the daemon's `health` and `ready` callables on a small thread pool (they may
touch the database), answering 200 with their JSON details when they say yes and 503
(with the details saying why) when they say no or raise; probe answers are scrubbed of
credentials (`canaryd.redact`). `/metrics` renders the `CanarydMetrics` registry, at most
once per `METRICS_TTL_S` however many scrapers ask at once. `/v1/switch` serves the state
file's object (what production reads: `speculative_enabled`, `categories`, `generation`,
`confirmed_at`, …) with an `ETag`, so a router on another host can poll it cheaply
(`If-None-Match` → 304); 503 while no state file is written. `GET /v1/verdict` and
`POST /v1/flagger/<hook>` hand the query, headers or body (at most `MAX_BODY_BYTES`) to
the daemon's `Judge` (`canaryd.server.rollout`) and send its status and JSON object; with
`server.auth_token` set they need it as a bearer token (401 otherwise), while the probes,
`/metrics` and `/v1/switch` stay open. Without a token on an address that is not loopback,
the writes that start a rollout burst (`POST /v1/verdict`, the Flagger webhooks) answer
403 naming the key: anyone who reaches the port could spend GPU time on production.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol
from urllib.parse import parse_qs

import structlog
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST

from canaryd.metrics import CanarydMetrics
from canaryd.redact import redact_value
from canaryd.server.plumbing import (
    MAX_CONNECTIONS,
    REQUEST_DEADLINE_S,
    Body,
    BodyTimedOutError,
    BodyTooLargeError,
    DeadlineProtocol,
    Receive,
    Scope,
    Send,
    bind_listen,
    bound_address,
    read_body,
    serve_in_thread,
    split_listen,
)

__all__ = [
    "MAX_BODIES",
    "MAX_BODY_BYTES",
    "MAX_CONNECTIONS",
    "REQUEST_DEADLINE_S",
    "DeadlineProtocol",
    "Judge",
    "Probe",
    "StatusServer",
    "bind_listen",
    "bound_address",
    "serve_in_thread",
    "split_listen",
]

log = structlog.get_logger(__name__)

Probe = Callable[[], tuple[bool, dict[str, Any]]]

_JSON = "application/json"
METRICS_TTL_S = 0.25  # concurrent scrapes share one rendering
_PROBE_THREADS = 4
_JUDGE_THREADS = 2
SWITCH_PATH = "/v1/switch"
VERDICT_PATH = "/v1/verdict"
FLAGGER_PREFIX = "/v1/flagger/"
_ENDPOINTS = ["/metrics", "/healthz", "/readyz", SWITCH_PATH, VERDICT_PATH, FLAGGER_PREFIX + "…"]
# A request body (a Flagger payload is a few hundred bytes) larger than this is answered
# 413 without being read further.
MAX_BODY_BYTES = 64 * 1024
# Bodies read at once; a webhook beyond them is answered 503 (Flagger retries) before a
# byte of its body is read, so slow bodies cannot pile up.
MAX_BODIES = 16
# Paths served whatever the connection budget: the probes, the state routers poll, and
# the scrapes (Prometheus must see canaryd's own metrics exactly while someone floods it;
# one render serves every scraper within METRICS_TTL_S, so serving them costs a send).
RESERVED_PATHS = ("/healthz", "/readyz", SWITCH_PATH, "/metrics")

# What /v1/switch serves: the state file's object, None while there is none.
SwitchSource = Callable[[], dict[str, Any] | None]


class Judge(Protocol):
    """What answers `/v1/verdict` and the Flagger webhooks: a status and a JSON object.
    Called on threads of its own (it reads the database); it never raises for a request."""

    def verdict(
        self, params: Mapping[str, list[str]], headers: Mapping[str, str], *, write: bool = False
    ) -> tuple[int, dict[str, Any]]: ...

    def flagger(self, hook: str, body: bytes) -> tuple[int, dict[str, Any]]: ...


_UNAUTHORIZED = (
    b'{"status": "unauthorized", "reason": "this endpoint needs Authorization: Bearer '
    b'<server.auth_token>"}'
)


def _writes_refused(listen: str) -> bytes:
    return _json_body(
        {
            "status": "forbidden",
            "reason": f"canaryd listens on {listen} (not loopback) without "
            "server.auth_token: POST /v1/verdict and the Flagger webhooks start a rollout "
            "burst (GPU time) and need it; set CANARYD_SERVER__AUTH_TOKEN and send "
            "Authorization: Bearer <token>",
        }
    )


def is_loopback(sock: socket.socket) -> bool:
    """Whether `sock` is bound to a loopback address (only this host reaches it)."""
    try:
        return ipaddress.ip_address(str(sock.getsockname()[0]).split("%")[0]).is_loopback
    except ValueError:
        return False


def _metadata_token(payload: bytes) -> bytes:
    """The `token` in a Flagger payload's `metadata`; empty when there is none."""
    try:
        metadata = json.loads(payload).get("metadata")
    except (ValueError, AttributeError, RecursionError):
        return b""
    token = metadata.get("token") if isinstance(metadata, dict) else None
    return token.encode() if isinstance(token, str) else b""


def _json_body(data: dict[str, Any]) -> bytes:
    # allow_nan=False: a non-finite number is a bug to see, never invalid JSON to send.
    return json.dumps(data, sort_keys=True, allow_nan=False).encode()


class _App:
    """The ASGI app: GET/HEAD of the endpoints, POST of the Flagger webhooks."""

    def __init__(
        self,
        metrics: CanarydMetrics,
        probes: dict[str, Probe],
        switch: SwitchSource | None = None,
        judge: Judge | None = None,
        token: str | None = None,
        open_to: str | None = None,
    ) -> None:
        """`open_to`: the non-loopback address served without a token; its writes that
        start a burst are refused (None: loopback, or a token guards them)."""
        self.metrics = metrics
        self.probes = probes
        self.refused_writes = _writes_refused(open_to) if open_to and not token else None
        self.switch = switch
        self.judge = judge
        self.token = token.encode() if token else None
        self.pool = ThreadPoolExecutor(_PROBE_THREADS, thread_name_prefix="canaryd-probe")
        # Verdicts read and evaluate a window of pairs: on threads of their own, so that a
        # burst of rollout tools never keeps a probe waiting.
        self.judging = ThreadPoolExecutor(_JUDGE_THREADS, thread_name_prefix="canaryd-judge")
        self.bodies = Body(MAX_BODIES, MAX_BODY_BYTES)
        self._rendered: tuple[float, bytes] | None = None
        self._rendering: asyncio.Lock | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; nothing else is served
        method = scope["method"]
        path = scope["path"]
        extra: list[tuple[bytes, bytes]] = []
        guarded = path == VERDICT_PATH or path.startswith(FLAGGER_PREFIX)
        hook = method == "POST" and path.startswith(FLAGGER_PREFIX)
        if guarded and not hook and not self.authorized(scope):
            status, content_type, body = 401, _JSON, _UNAUTHORIZED
        elif guarded and method == "POST" and self.refused_writes is not None:
            # Anyone who reaches the port could start a burst against production.
            status, content_type, body = 403, _JSON, self.refused_writes
        elif hook:  # its token may be in the payload's `metadata`: checked once read
            status, content_type, body = await self.flagger(scope, receive)
        elif method == "POST" and path == VERDICT_PATH:
            status, content_type, body = await self.verdict(scope, receive)
        elif method not in ("GET", "HEAD"):
            status, content_type, body = 405, _JSON, b'{"status": "method not allowed"}'
        elif path == SWITCH_PATH:
            status, content_type, body, extra = await self.switch_state(scope)
        elif path == VERDICT_PATH:
            status, content_type, body = await self.verdict(scope)
        else:
            status, content_type, body = await self.respond(path)
        if status == 401:
            extra = [(b"www-authenticate", b'Bearer realm="canaryd"')]
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})

    def authorized(self, scope: Scope, payload: bytes | None = None) -> bool:
        """With `server.auth_token` set, the verdict and the Flagger webhooks need
        `Authorization: Bearer <token>` (or, for Flagger, whose webhooks send no headers,
        `token` in the webhook's `metadata`, its `payload`; `?token=` on the URL is still
        read, but Flagger repeats a failing URL in its events); compared in constant
        time, never logged."""
        if self.token is None:
            return True
        if payload is not None and hmac.compare_digest(_metadata_token(payload), self.token):
            return True
        headers = dict(scope.get("headers") or [])
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token):
            return True
        if scope["path"].startswith(FLAGGER_PREFIX):
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            for value in query.get("token", []):
                if hmac.compare_digest(value.encode(), self.token):
                    return True
        return False

    async def respond(self, path: str) -> tuple[int, str, bytes]:
        """Status, content type and body for a GET of `path`."""
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, await self.render()
        probe = self.probes.get(path)
        if probe is None:
            body = {"status": "not found", "endpoints": _ENDPOINTS}
            return 404, _JSON, json.dumps(body).encode()
        loop = asyncio.get_running_loop()
        try:
            ok, detail = await loop.run_in_executor(self.pool, probe)
        except Exception as exc:
            # A probe that raises is a failing probe; the daemon keeps serving.
            log.exception("http.probe_raised", path=path)
            ok, detail = False, {"error": f"{type(exc).__name__}: {exc}"}
        body = redact_value({**detail, "status": "ok" if ok else "unavailable"})
        return (200 if ok else 503), _JSON, json.dumps(body, default=str).encode()

    async def switch_state(self, scope: Scope) -> tuple[int, str, bytes, list[tuple[bytes, bytes]]]:
        """The state file's object with its ETag; 304 when the client's `If-None-Match`
        names it; 503 while there is none (or no source: a server without a switch)."""
        loop = asyncio.get_running_loop()
        data = None
        if self.switch is not None:
            try:
                data = await loop.run_in_executor(self.pool, self.switch)
            except Exception:
                log.exception("http.switch_source_raised")
        if data is None:
            missing = {
                "status": "unavailable",
                "reason": "no switch state yet: the state file is not written (or unreadable)",
            }
            return 503, _JSON, json.dumps(missing).encode(), []
        body = json.dumps(data, sort_keys=True, default=str).encode()
        etag = f'"{data.get("generation", "-")}-{hashlib.sha256(body).hexdigest()[:16]}"'
        headers = [(b"etag", etag.encode())]
        wanted = dict(scope.get("headers") or []).get(b"if-none-match", b"").decode("latin-1")
        if etag in {tag.strip() for tag in wanted.split(",")}:
            return 304, _JSON, b"", headers
        return 200, _JSON, body, headers

    async def verdict(self, scope: Scope, receive: Receive | None = None) -> tuple[int, str, bytes]:
        """`GET /v1/verdict`: the judge's answer to the query string and headers; `POST`
        (with `receive`) the same after opening the revision's window, its body ignored."""
        if self.judge is None:
            return 404, _JSON, _json_body({"status": "not found", "endpoints": _ENDPOINTS})
        if receive is not None:
            body = await self._body(receive)
            if not isinstance(body, bytes):
                return body
        query = scope.get("query_string", b"").decode("latin-1")
        params = parse_qs(query, keep_blank_values=True)
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers") or []
        }
        return await self._judged(
            functools.partial(self.judge.verdict, write=receive is not None), params, headers
        )

    async def _body(self, receive: Receive) -> bytes | tuple[int, str, bytes]:
        """The request body read whole within the bounds, or the answer that refuses it."""
        if self.bodies.full:
            reason = f"{MAX_BODIES} request bodies are being read already; retry"
            return 503, _JSON, _json_body({"status": "unavailable", "reason": reason})
        try:
            return await read_body(receive, self.bodies)
        except BodyTooLargeError:
            reason = f"the body is larger than {MAX_BODY_BYTES} bytes"
            return 413, _JSON, _json_body({"status": "too large", "reason": reason})
        except BodyTimedOutError:
            reason = f"the body did not arrive whole within {REQUEST_DEADLINE_S:g} s"
            return 400, _JSON, _json_body({"status": "bad request", "reason": reason})

    async def flagger(self, scope: Scope, receive: Receive) -> tuple[int, str, bytes]:
        """`POST /v1/flagger/<hook>`: the judge's answer to the payload, once authorized."""
        body = await self._body(receive)
        if not isinstance(body, bytes):
            return body
        if not self.authorized(scope, body):
            return 401, _JSON, _UNAUTHORIZED
        if self.judge is None:
            return 404, _JSON, _json_body({"status": "not found", "endpoints": _ENDPOINTS})
        hook = scope["path"].removeprefix(FLAGGER_PREFIX)
        return await self._judged(self.judge.flagger, hook, body)

    async def _judged(
        self, answer: Callable[..., tuple[int, dict[str, Any]]], *args: Any
    ) -> tuple[int, str, bytes]:
        loop = asyncio.get_running_loop()
        try:
            status, data = await loop.run_in_executor(self.judging, answer, *args)
        except Exception as exc:
            # A judge that raises is a bug; the caller sees "cannot judge", never a verdict.
            log.exception("http.judge_raised")
            status, data = 503, {"status": "unavailable", "reason": f"{type(exc).__name__}: {exc}"}
        return status, _JSON, _json_body(data)

    async def render(self) -> bytes:
        if self._rendering is None:
            self._rendering = asyncio.Lock()
        async with self._rendering:
            cached = self._rendered
            if cached is not None and time.monotonic() - cached[0] < METRICS_TTL_S:
                return cached[1]
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(self.pool, self.metrics.render)
            self._rendered = (time.monotonic(), body)
            return body


class StatusServer:
    """`/metrics`, `/healthz`, `/readyz`, `/v1/switch`, and with a `judge` `/v1/verdict`
    and the Flagger webhooks, over HTTP, started and stopped by the daemon."""

    def __init__(
        self,
        listen: str,
        metrics: CanarydMetrics,
        health: Probe,
        ready: Probe,
        switch: SwitchSource | None = None,
        judge: Judge | None = None,
        token: str | None = None,
    ) -> None:
        self.listen = listen
        self.metrics = metrics
        self._probes: dict[str, Probe] = {"/healthz": health, "/readyz": ready}
        self._switch = switch
        self._judge = judge
        self._token = token
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self._app: _App | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """The bound `host:port` (the real port when `listen` asked for port 0)."""
        if self._socket is None:
            raise RuntimeError("StatusServer is not started")
        return bound_address(self._socket)

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Bind, then serve on a daemon thread; raise `StatusServerError` if binding fails."""
        if self._server is not None:
            return
        host, port = split_listen(self.listen)
        sock = bind_listen(host, port, self.listen)
        open_to = None if is_loopback(sock) else bound_address(sock)
        app = _App(self.metrics, self._probes, self._switch, self._judge, self._token, open_to)
        if open_to is not None and self._judge is not None and not self._token:
            log.warning(
                "http.rollout_writes_refused",
                address=open_to,
                reason="server.listen is not loopback and server.auth_token is unset: "
                "POST /v1/verdict and the Flagger webhooks answer 403",
            )
        server, thread = serve_in_thread(app, sock, "canaryd-status-http", reserved=RESERVED_PATHS)
        self._server, self._socket, self._app, self._thread = server, sock, app, thread
        log.info("http.listening", address=self.address)

    def stop(self) -> None:
        """Stop serving and release the port; safe to call twice or before `start`."""
        server, sock, app, thread = self._server, self._socket, self._app, self._thread
        self._server = self._socket = self._app = self._thread = None
        if server is None:
            return
        server.should_exit = True
        if thread is not None:
            thread.join(timeout=5)
        if sock is not None:
            sock.close()
        if app is not None:
            app.pool.shutdown(wait=False)
            app.judging.shutdown(wait=False)

    def __enter__(self) -> StatusServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
