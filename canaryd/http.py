"""The daemon's status endpoints: `/metrics`, `/healthz` and `/readyz` on `server.listen`.

`StatusServer` runs a standard-library `ThreadingHTTPServer` in a daemon thread, with at
most `MAX_CONNECTIONS` connections served at once: one more is answered 503 and closed,
so a flood of (or stalled) clients cannot grow threads without bound. It holds no state
of its own: `/metrics` renders the `CanarydMetrics` registry, and the two probes call the
daemon's `health` and `ready` callables, answering 200 with their JSON details when they
say yes and 503 (with the details saying why) when they say no or raise. Probe answers
are scrubbed of credentials (`canaryd.redact`) before they are served.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST

from canaryd.errors import StatusServerError
from canaryd.metrics import CanarydMetrics
from canaryd.redact import redact_value

__all__ = ["MAX_CONNECTIONS", "Probe", "StatusServer"]

log = structlog.get_logger(__name__)

Probe = Callable[[], tuple[bool, dict[str, Any]]]
_JSON = "application/json"
_REQUEST_TIMEOUT_S = 10.0  # a stalled client must not hold a handler thread for ever
# Connections served at once (one thread each). Scrapers and probes keep a few
# keep-alive connections; more than this is a flood, answered 503 without a thread.
MAX_CONNECTIONS = 16
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 5\r\nRetry-After: 1\r\nConnection: close\r\n\r\nbusy\n"
)
_BUSY_LOG_INTERVAL_S = 60.0


def _split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise StatusServerError(listen, "not a host:port address")
    return host.strip("[]"), int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # daemon threads are not tracked; stop() must not wait on them
    # SO_REUSEADDR lets a restarted daemon rebind while old connections sit in TIME_WAIT;
    # on Linux it still refuses a port another process listens on.
    allow_reuse_address = True
    max_connections = MAX_CONNECTIONS
    request_queue_size = 64  # listen backlog: a burst is accepted (or refused) at once

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._busy_logged_at = -float("inf")
        self.refused = 0
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        # Runs in the serving thread: a connection beyond the limit gets a canned 503
        # (a few bytes into an empty socket buffer, so this never blocks) and no thread.
        if not self._slots.acquire(blocking=False):
            self._refuse(request, client_address)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse(self, request: Any, client_address: Any) -> None:
        self.refused += 1
        with contextlib.suppress(OSError):  # a client already gone: closing is all left
            request.sendall(_BUSY_RESPONSE)
        self.shutdown_request(request)
        now = time.monotonic()
        if now - self._busy_logged_at >= _BUSY_LOG_INTERVAL_S:
            self._busy_logged_at = now
            log.warning(
                "http.busy",
                client=str(client_address[0]) if client_address else "",
                max_connections=self.max_connections,
                refused_total=self.refused,
                reason="too many connections at once; this one was answered 503",
            )

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can stall for the resolver
        # timeout on a host without DNS; the name is only used in CGI environments.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Server6(_Server):
    address_family = socket.AF_INET6


class StatusServer:
    """`/metrics`, `/healthz` and `/readyz` over HTTP, started and stopped by the daemon."""

    def __init__(
        self,
        listen: str,
        metrics: CanarydMetrics,
        health: Probe,
        ready: Probe,
    ) -> None:
        self.listen = listen
        self.metrics = metrics
        self._probes: dict[str, Probe] = {"/healthz": health, "/readyz": ready}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """The bound `host:port` (the real port when `listen` asked for port 0)."""
        if self._server is None:
            raise RuntimeError("StatusServer is not started")
        host, port = self._server.server_address[:2]
        host = str(host)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Bind and serve in a daemon thread; raise `StatusServerError` if binding fails."""
        if self._server is not None:
            return
        host, port = _split_listen(self.listen)
        server_class = _Server6 if ":" in host else _Server
        try:
            server = server_class((host, port), self._handler_class())
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                reason = "address in use"
            elif exc.errno == errno.EADDRNOTAVAIL:
                reason = "no such local address"
            elif exc.errno == errno.EACCES:
                reason = "permission denied (ports below 1024 need privileges)"
            else:
                reason = exc.strerror or type(exc).__name__
            raise StatusServerError(self.listen, reason) from exc
        except (socket.gaierror, UnicodeError) as exc:
            raise StatusServerError(self.listen, f"cannot resolve host {host!r}") from exc
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="canaryd-status-http",
            daemon=True,
        )
        self._thread.start()
        log.info("http.listening", address=self.address)

    def stop(self) -> None:
        """Stop serving and release the port; safe to call twice or before `start`."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> StatusServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _respond(self, path: str) -> tuple[int, str, bytes]:
        """Status, content type and body for a GET of `path`."""
        path = path.split("?", 1)[0]
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, self.metrics.render()
        probe = self._probes.get(path)
        if probe is None:
            body = {"status": "not found", "endpoints": ["/metrics", "/healthz", "/readyz"]}
            return 404, _JSON, json.dumps(body).encode()
        try:
            ok, detail = probe()
        except Exception as exc:
            # A probe that raises is a failing probe; the daemon keeps serving.
            log.exception("http.probe_raised", path=path)
            ok, detail = False, {"error": f"{type(exc).__name__}: {exc}"}
        body = redact_value({**detail, "status": "ok" if ok else "unavailable"})
        return (200 if ok else 503), _JSON, json.dumps(body, default=str).encode()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        respond = self._respond

        class Handler(BaseHTTPRequestHandler):
            timeout = _REQUEST_TIMEOUT_S
            protocol_version = "HTTP/1.1"
            server_version = "canaryd"

            def _send(self, head_only: bool) -> None:
                status, content_type, body = respond(self.path)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                if not head_only:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(head_only=False)

            def do_HEAD(self) -> None:
                self._send(head_only=True)

            def log_message(self, format: str, *args: Any) -> None:
                # Scrapes every few seconds would flood stderr; keep them at debug level.
                log.debug("http.request", client=self.client_address[0], line=format % args)

        return Handler
