"""The mirror sink: an OpenAI-compatible receiving end for a gateway's mirrored requests.

`TrafficSink` serves `POST /v1/chat/completions` and `POST /v1/completions` (also under a
route prefix, `/<route>/v1/...`) on `traffic.listen`, with uvicorn on its own event loop
in a daemon thread, as the status server does (`canaryd.server.app.serve_in_thread`: every
request whole within `REQUEST_DEADLINE_S`, a connection cap). A gateway may wait for the
mirror's answer, so every request is answered at once with a small 202 — never an
engine's answer, never a stream, whatever `stream` says: the body is parsed and offered
to the `LiveSampler`, which queues a bounded, fair sample for the daemon's live pairs.
With `traffic.auth_token` set a request needs it as a bearer token (401 otherwise); a
body over `traffic.max_body_bytes` is answered 413 unread. Bodies are never logged; a
rejected request's log line (at most one a minute per reason) names its headers with the
`traffic.redact_headers` masked.
"""

from __future__ import annotations

import hmac
import json
import socket
import threading
import time
from collections.abc import MutableMapping
from typing import Any

import structlog
import uvicorn

from canaryd.config import TrafficConfig
from canaryd.errors import StatusServerError, TrafficSinkError
from canaryd.redact import MASK
from canaryd.server.app import (
    MAX_CONNECTIONS,
    bind_listen,
    bound_address,
    serve_in_thread,
    split_listen,
)
from canaryd.traffic.requests import UnusableRequestError, parse_request, split_route
from canaryd.traffic.reservoir import LiveSampler

__all__ = ["TrafficSink"]

log = structlog.get_logger(__name__)

Scope = MutableMapping[str, Any]
_ACCEPTED = b'{"status":"accepted"}'
_REJECTION_LOG_S = 60.0  # one log line per reason at most this often


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True).encode()


class _SinkApp:
    """The ASGI app: answer, then offer the parsed request to the sampler."""

    def __init__(self, config: TrafficConfig, sampler: LiveSampler) -> None:
        self.config = config
        self.sampler = sampler
        token = config.auth_token
        self.token = token.get_secret_value().encode() if token is not None else None
        key = config.hash_key
        self.hash_key = key.get_secret_value().encode() if key is not None else b""
        self.category_header = config.category_header.lower().encode("latin-1")
        self.redacted = {name.lower() for name in config.redact_headers}
        self._logged: dict[str, float] = {}

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        status, body = await self.answer(scope, receive)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def answer(self, scope: Scope, receive: Any) -> tuple[int, bytes]:
        split = split_route(scope["path"])
        if split is None or scope["method"] != "POST":
            self.sampler.count("not_found")
            return 404, _json(
                {
                    "status": "not found",
                    "endpoints": ["POST /v1/chat/completions", "POST /v1/completions"],
                }
            )
        route, endpoint = split
        headers = dict(scope.get("headers") or [])
        if not self.authorized(headers):
            self.reject("unauthorized", scope)
            return 401, _json(
                {
                    "status": "unauthorized",
                    "reason": "needs Authorization: Bearer <traffic.auth_token>",
                }
            )
        raw = await self.read_body(headers, receive)
        if raw is None:
            self.reject("too_large", scope)
            limit = self.config.max_body_bytes
            return 413, _json({"status": "too large", "reason": f"body over {limit} bytes"})
        header_category = headers.get(self.category_header)
        try:
            request = parse_request(
                raw,
                endpoint,
                hash_key=self.hash_key,
                max_tokens_cap=self.config.max_tokens,
                header_category=header_category.decode("latin-1") if header_category else None,
                route=route,
            )
        except UnusableRequestError as exc:
            self.reject("unusable", scope, exc.reason)
            return 400, _json({"status": "unusable", "reason": exc.reason})
        self.sampler.offer(request)
        return 202, _ACCEPTED

    def authorized(self, headers: dict[bytes, bytes]) -> bool:
        if self.token is None:
            return True
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)

    async def read_body(self, headers: dict[bytes, bytes], receive: Any) -> bytes | None:
        """The whole body, or None once it is over the limit (the rest is not read)."""
        limit = self.config.max_body_bytes
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return None
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return bytes(body)
            body += message.get("body", b"")
            if len(body) > limit:
                return None
            if not message.get("more_body", False):
                return bytes(body)

    def reject(self, outcome: str, scope: Scope, reason: str = "") -> None:
        """Count a rejected request; log it (never its body) once a minute per outcome."""
        self.sampler.count(outcome)
        now = time.monotonic()
        if now - self._logged.get(outcome, -_REJECTION_LOG_S) < _REJECTION_LOG_S:
            return
        self._logged[outcome] = now
        shown = {
            name.decode("latin-1").lower(): (
                MASK if name.decode("latin-1").lower() in self.redacted else value.decode("latin-1")
            )
            for name, value in scope.get("headers") or []
        }
        log.warning(
            "traffic.rejected",
            outcome=outcome,
            reason=reason or outcome,
            path=scope["path"],
            headers=shown,
            note="further rejections for this reason within a minute are only counted",
        )


class TrafficSink:
    """The mirror sink on `config.listen`, offering what it receives to `sampler`;
    started and stopped by the daemon (or a test: port 0, then `address`)."""

    def __init__(self, config: TrafficConfig, sampler: LiveSampler) -> None:
        if config.listen is None:
            raise ValueError("TrafficSink needs traffic.listen")
        self.listen = config.listen
        self.config = config
        self.sampler = sampler
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """The bound `host:port` (the real port when `listen` asked for port 0)."""
        if self._socket is None:
            raise RuntimeError("TrafficSink is not started")
        return bound_address(self._socket)

    @property
    def counts(self) -> dict[str, int]:
        """Requests received, and by outcome (`canaryd.traffic.reservoir.OUTCOMES`)."""
        return dict(self.sampler.counts)

    def start(self) -> None:
        """Bind, then serve on a daemon thread; `TrafficSinkError` if binding fails."""
        if self._server is not None:
            return
        try:
            host, port = split_listen(self.listen)
            sock = bind_listen(host, port, self.listen)
        except StatusServerError as exc:
            raise TrafficSinkError(self.listen, exc.reason) from exc
        app = _SinkApp(self.config, self.sampler)
        server, thread = serve_in_thread(
            app, sock, "canaryd-traffic-sink", max_connections=MAX_CONNECTIONS
        )
        self._server, self._socket, self._thread = server, sock, thread
        log.info("traffic.listening", address=self.address)

    def stop(self) -> None:
        """Stop serving and release the port; safe to call twice or before `start`."""
        server, sock, thread = self._server, self._socket, self._thread
        self._server = self._socket = self._thread = None
        if server is None:
            return
        server.should_exit = True
        if thread is not None:
            thread.join(timeout=5)
        if sock is not None:
            sock.close()

    def __enter__(self) -> TrafficSink:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
