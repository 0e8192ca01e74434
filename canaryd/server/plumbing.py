"""How canaryd serves HTTP, for the status port and the mirror sink alike: uvicorn on its
own event loop in a daemon thread, with bounds that hostile or broken clients cannot
lift.

- **A whole-request deadline.** Every request — headers *and* body — must arrive within
  `REQUEST_DEADLINE_S` of its connection (or of the previous answer on a keep-alive
  connection), else the connection is closed (`DeadlineProtocol`). uvicorn's own timer
  restarts on every byte, so a client trickling its headers or its body would otherwise
  hold the connection for ever.
- **A connection budget with reserved paths.** Beyond `max_connections` open connections
  a request is answered 503 at once — except on the `reserved` paths (the liveness and
  readiness probes, the switch state a router polls), which are always served: no
  client traffic can starve them. The process's open-file limit is raised to its hard
  limit at start, so the reserved paths find a descriptor.
- **Bodies read whole, bounded in time and bytes** by the app (`read_body`), with at
  most `max_bodies` of them in flight on one server: a request beyond is answered 503
  before a byte of its body is read.
"""

from __future__ import annotations

import asyncio
import errno
import resource
import socket
import threading
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

import structlog
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from canaryd.errors import StatusServerError

__all__ = [
    "MAX_CONNECTIONS",
    "REQUEST_DEADLINE_S",
    "Body",
    "BodyTimedOutError",
    "BodyTooLargeError",
    "DeadlineProtocol",
    "bind_listen",
    "bound_address",
    "read_body",
    "serve_in_thread",
    "split_listen",
]

log = structlog.get_logger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# A request must arrive whole, body included, within this many seconds: a client that
# trickles its headers or its body is closed instead of holding the connection.
REQUEST_DEADLINE_S = 5.0
# Open connections served at once; a request beyond them is answered 503 (reserved paths
# excepted). Connections cost no thread, so this bounds descriptors, not latency.
MAX_CONNECTIONS = 512
# The open-file limit asked for at start (the hard limit when that is lower).
WANTED_OPEN_FILES = 65_536

_BUSY = b'{"status": "unavailable", "reason": "too many open connections; retry"}'


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdecimal() or int(port) > 65535:
        raise StatusServerError(listen, "not a host:port address")
    return host.strip("[]"), int(port)


class DeadlineProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each whole request, body included:
    armed when the connection opens and after each answer, cancelled once the request's
    last body byte has arrived. At the deadline a connection whose request is still
    arriving is closed (the app, if it is waiting for the body, sees a disconnect)."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.more_body:
            self._disarm()  # the whole request has arrived: the app answers it

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(REQUEST_DEADLINE_S, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        cycle = self.cycle
        arriving = cycle is None or cycle.response_complete or cycle.more_body
        if arriving and not self.transport.is_closing():
            self.transport.close()


class BodyTooLargeError(Exception):
    """The body is larger than the server takes."""


class BodyTimedOutError(Exception):
    """The body did not arrive whole (the client left, or the deadline closed it)."""


class Body:
    """At most `limit` bodies read at once on one server (the app's event loop only)."""

    def __init__(self, limit: int, max_bytes: int) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.in_flight = 0

    @property
    def full(self) -> bool:
        return self.in_flight >= self.limit


async def read_body(
    receive: Receive, bodies: Body, *, deadline_s: float | None = None, declared: bytes = b""
) -> bytes:
    """The whole request body, at most `bodies.max_bytes`; `BodyTooLargeError` beyond that
    (at once when the `declared` Content-Length says so), `BodyTimedOutError` when the
    client leaves, `DeadlineProtocol` closes it, or `deadline_s` passes first. The caller
    checks `bodies.full` before and answers 503 instead of reading."""
    if declared.isdigit() and (len(declared) > 18 or int(declared) > bodies.max_bytes):
        raise BodyTooLargeError
    bodies.in_flight += 1
    try:
        body = bytearray()
        async with asyncio.timeout(deadline_s):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise BodyTimedOutError
                body += message.get("body", b"")
                if len(body) > bodies.max_bytes:
                    raise BodyTooLargeError
                if not message.get("more_body", False):
                    return bytes(body)
    except TimeoutError:
        raise BodyTimedOutError from None
    finally:
        bodies.in_flight -= 1


def _budgeted(
    app: App,
    server: uvicorn.Server,
    max_connections: int,
    reserved: Collection[str],
    refused: Callable[[Scope], None] | None = None,
) -> App:
    """`app` behind the connection budget: 503 beyond `max_connections` open connections,
    except on the `reserved` paths; `refused` (when given) is told of each such 503."""

    async def budgeted(scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] not in reserved
            and len(server.server_state.connections) > max_connections
        ):
            if refused is not None:
                refused(scope)
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(_BUSY)).encode()),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": _BUSY})
            return
        await app(scope, receive, send)

    return budgeted


def raise_open_files(wanted: int = WANTED_OPEN_FILES) -> int:
    """Raise the soft open-file limit towards `wanted` (never above the hard limit, never
    lower than now); returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            log.warning("http.open_files_not_raised", soft=soft, hard=hard)
    return soft


def bound_address(sock: socket.socket) -> str:
    """A listening socket's `host:port` (the real port when it was bound to port 0;
    an IPv6 host in brackets)."""
    host, port = sock.getsockname()[:2]
    host = str(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_listen(host: str, port: int, listen: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say
    # so, else every answer written in two parts waits for a delayed ACK (40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        # SO_REUSEADDR lets a restarted daemon rebind while old connections sit in
        # TIME_WAIT; on Linux it still refuses a port another process listens on.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if isinstance(exc, socket.gaierror):
            raise StatusServerError(listen, f"cannot resolve host {host!r}") from exc
        if exc.errno == errno.EADDRINUSE:
            reason = "address in use"
        elif exc.errno == errno.EADDRNOTAVAIL:
            reason = "no such local address"
        elif exc.errno == errno.EACCES:
            reason = "permission denied (ports below 1024 need privileges)"
        else:
            reason = exc.strerror or type(exc).__name__
        raise StatusServerError(listen, reason) from exc
    except UnicodeError as exc:
        sock.close()
        raise StatusServerError(listen, f"cannot resolve host {host!r}") from exc
    sock.setblocking(False)
    return sock


def serve_in_thread(
    app: App,
    sock: socket.socket,
    thread_name: str,
    *,
    max_connections: int = MAX_CONNECTIONS,
    reserved: Collection[str] = (),
    refused: Callable[[Scope], None] | None = None,
) -> tuple[uvicorn.Server, threading.Thread]:
    """Serve the ASGI `app` on the bound `sock` with uvicorn, on its own event loop in a
    daemon thread (every request whole within `REQUEST_DEADLINE_S`, at most
    `max_connections` open connections served but on the `reserved` paths, each refusal
    told to `refused`); returns once
    it listens. Stop it with `server.should_exit = True`, then join the thread."""
    raise_open_files()
    config = uvicorn.Config(
        app,
        http=DeadlineProtocol,
        lifespan="off",
        access_log=False,
        log_config=None,
        log_level="warning",
        timeout_keep_alive=int(REQUEST_DEADLINE_S),
        timeout_graceful_shutdown=1,
        server_header=False,
        date_header=False,
    )
    server = uvicorn.Server(config)
    config.app = _budgeted(app, server, max_connections, frozenset(reserved), refused)
    started = threading.Event()

    def serve() -> None:
        async def main() -> None:
            task = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started and not task.done():
                await asyncio.sleep(0.005)
            started.set()
            await task

        try:
            asyncio.run(main())
        finally:
            started.set()

    thread = threading.Thread(target=serve, name=thread_name, daemon=True)
    thread.start()
    started.wait(10)
    return server, thread
