"""The mirror sink: an OpenAI-compatible receiving end for a gateway's mirrored requests.

`TrafficSink` serves `POST /v1/chat/completions` and `POST /v1/completions` (also under a
route prefix, `/<route>/v1/...`) on `traffic.listen`, with uvicorn on its own event loop
in a daemon thread, as the status server does (`canaryd.server.app.serve_in_thread`: a
request deadline, a connection cap). A gateway may wait for the mirror's answer, so every
request is answered at once with a small 202 — never an engine's answer, never a stream,
whatever `stream` says: the body is parsed and offered to the `LiveSampler`, which queues
a bounded, fair sample for the daemon's live pairs. The category is the gateway's header
when `traffic.categories` lists it, else `live` (or 422 with `traffic.unknown_category =
"refuse"`; `canaryd.traffic.categories`). With `traffic.auth_token` set a request needs it
as a bearer token (401 otherwise). The body is read whole within `REQUEST_DEADLINE_S` of
the request's start (408 otherwise) and up to `traffic.max_body_bytes` (413 beyond, the
rest unread); at most `bodies_in_flight` bodies are read at once (64 MiB of them in all:
503 beyond, before a byte is read); a body no pair can replay, however malformed, is 400.
Every request is counted under one outcome. Bodies are never logged, nor is any
exception raised while reading one; a rejected request's log line (at most one a minute
per outcome, with the number left out since the last) names its headers with
`traffic.redact_headers` masked.
"""

from __future__ import annotations

import hmac
import json
import socket
import threading
from collections.abc import MutableMapping
from typing import Any, Final

import structlog
import uvicorn

from canaryd.config import TrafficConfig
from canaryd.errors import StatusServerError, TrafficSinkError
from canaryd.redact import MASK
from canaryd.server.plumbing import (
    MAX_CONNECTIONS,
    REQUEST_DEADLINE_S,
    Body,
    BodyTimedOutError,
    BodyTooLargeError,
    bind_listen,
    bound_address,
    read_body,
    serve_in_thread,
    split_listen,
)
from canaryd.traffic.categories import CategoryPolicy
from canaryd.traffic.requests import UnusableRequestError, parse_request, split_route
from canaryd.traffic.reservoir import LiveSampler
from canaryd.traffic.throttle import LogThrottle

__all__ = ["TrafficSink"]

log = structlog.get_logger(__name__)

Scope = MutableMapping[str, Any]
_ACCEPTED = b'{"status":"accepted"}'
_REJECTION_LOG_S: Final = 60.0  # one log line per outcome at most this often
_SHOWN_CHARS: Final = 256  # a logged path or header value is cut to this many characters


# What the bodies being read at once may hold: the status port's 16 bodies of 64 KiB are
# 1 MiB; the sink's are larger (a prompt), so it bounds their bytes rather than their count.
BODY_BYTES_IN_FLIGHT = 64 * 1024 * 1024
MIN_BODIES_IN_FLIGHT = 16


def bodies_in_flight(max_body_bytes: int) -> int:
    """How many bodies of at most `max_body_bytes` the sink reads at once."""
    return max(MIN_BODIES_IN_FLIGHT, BODY_BYTES_IN_FLIGHT // max_body_bytes)


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True).encode()


def _shown(value: str) -> str:
    return value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "…"


class _SinkApp:
    """The ASGI app: answer, then offer the parsed request to the sampler."""

    def __init__(self, config: TrafficConfig, sampler: LiveSampler, deadline_s: float) -> None:
        self.config = config
        self.sampler = sampler
        self.deadline_s = deadline_s
        # Bodies are read whole within `deadline_s`, and only so many at once that those
        # in flight hold at most `BODY_BYTES_IN_FLIGHT` (slow clients cannot fill memory).
        self.bodies = Body(bodies_in_flight(config.max_body_bytes), config.max_body_bytes)
        token = config.auth_token
        self.token = token.get_secret_value().encode() if token is not None else None
        key = config.hash_key
        self.hash_key = key.get_secret_value().encode() if key is not None else b""
        self.category_header = config.category_header.lower().encode("latin-1")
        self.categories = CategoryPolicy.of(config)
        self.redacted = {name.lower() for name in config.redact_headers}
        self.throttle = LogThrottle(_REJECTION_LOG_S)

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
        _route, endpoint = split
        headers = dict(scope.get("headers") or [])
        if not self.authorized(headers):
            self.reject("unauthorized", scope)
            return 401, _json(
                {
                    "status": "unauthorized",
                    "reason": "needs Authorization: Bearer <traffic.auth_token>",
                }
            )
        category = self.category(scope, headers)
        if category is None:
            reason = "no category of traffic.categories named"
            self.reject("unlisted", scope, reason, hide=self.category_header)
            return 422, _json(
                {
                    "status": "refused",
                    "reason": f"the {self.config.category_header} header names no category "
                    "of traffic.categories (traffic.unknown_category = refuse)",
                }
            )
        if self.bodies.full:
            self.reject("busy", scope, f"{self.bodies.limit} bodies are being read already")
            reason = f"{self.bodies.limit} request bodies are being read already; retry"
            return 503, _json({"status": "unavailable", "reason": reason})
        try:
            raw = await read_body(
                receive,
                self.bodies,
                deadline_s=self.deadline_s,
                declared=headers.get(b"content-length", b""),
            )
        except BodyTooLargeError:
            return self.body_rejected("too_large", scope)
        except BodyTimedOutError:  # the deadline passed, or the client left, first
            return self.body_rejected("too_slow", scope)
        return self.accept(raw, endpoint, category, scope)

    def accept(self, raw: bytes, endpoint: str, category: str, scope: Scope) -> tuple[int, bytes]:
        """Parse and offer a whole body: 202, or 400 for any body a pair cannot replay."""
        reason: str | None = None
        try:
            request = parse_request(
                raw,
                endpoint,
                hash_key=self.hash_key,
                max_tokens_cap=self.config.max_tokens,
                category=category,
            )
        except UnusableRequestError as exc:
            reason = exc.reason
        except Exception as exc:
            # A parser bug is still a 400, never a 500 with uvicorn's traceback; only the
            # type's name is shown, as the exception's text may quote the body.
            reason = f"body: unreadable ({type(exc).__name__})"
        if reason is not None:
            self.reject("unusable", scope, reason)
            return 400, _json({"status": "unusable", "reason": reason})
        self.sampler.offer(request)
        return 202, _ACCEPTED

    def body_rejected(self, outcome: str, scope: Scope) -> tuple[int, bytes]:
        self.reject(outcome, scope)
        if outcome == "too_large":
            limit = self.config.max_body_bytes
            return 413, _json({"status": "too large", "reason": f"body over {limit} bytes"})
        reason = f"the body did not arrive whole within {self.deadline_s:g} s"
        return 408, _json({"status": "too slow", "reason": reason})

    def authorized(self, headers: dict[bytes, bytes]) -> bool:
        if self.token is None:
            return True
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)

    def category(self, scope: Scope, headers: dict[bytes, bytes]) -> str | None:
        """The request's live category from the gateway's header (None: refused); an
        unlisted value is logged (not shown) at most once a minute."""
        given = headers.get(self.category_header)
        value = given.decode("latin-1") if given else None
        category = self.categories.category(value)
        if value and category is not None and self.categories.listed(value) is None:
            self.note("traffic.category_unlisted", "unlisted", scope, hide=self.category_header)
        return category

    def reject(self, outcome: str, scope: Scope, reason: str = "", *, hide: bytes = b"") -> None:
        """Count a rejected request; log it (never its body) at most once a minute per
        outcome."""
        self.sampler.count(outcome)
        self.note("traffic.rejected", outcome, scope, reason, hide=hide)

    def note(
        self, event: str, outcome: str, scope: Scope, reason: str = "", *, hide: bytes = b""
    ) -> None:
        """A log line for `outcome` unless one was written within the minute; it says
        how many were left out since. Redacted headers, and the `hide` one, are masked."""
        suppressed = self.throttle.admit(f"{event}:{outcome}")
        if suppressed is None:
            return
        shown = {
            _shown(name.decode("latin-1").lower()): (
                MASK
                if name.decode("latin-1").lower() in self.redacted or name.lower() == hide
                else _shown(value.decode("latin-1"))
            )
            for name, value in scope.get("headers") or []
        }
        log.warning(
            event,
            outcome=outcome,
            reason=reason or outcome,
            path=_shown(scope["path"]),
            headers=shown,
            suppressed=suppressed,
            note=f"further lines for this outcome within {_REJECTION_LOG_S:g} s are only "
            "counted; suppressed: those left out since the last line",
        )


class TrafficSink:
    """The mirror sink on `config.listen`, offering what it receives to `sampler`;
    started and stopped by the daemon (or a test: port 0, then `address`). A body must
    arrive whole within `body_deadline_s` of its request's start."""

    def __init__(
        self,
        config: TrafficConfig,
        sampler: LiveSampler,
        *,
        body_deadline_s: float = REQUEST_DEADLINE_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if config.listen is None:
            raise ValueError("TrafficSink needs traffic.listen")
        self.listen = config.listen
        self.config = config
        self.sampler = sampler
        self.body_deadline_s = body_deadline_s
        self.max_connections = max_connections
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
        app = _SinkApp(self.config, self.sampler, self.body_deadline_s)
        server, thread = serve_in_thread(
            app,
            sock,
            "canaryd-traffic-sink",
            max_connections=self.max_connections,
            refused=lambda scope: app.reject("busy", scope),
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
