"""A TCP proxy on loopback that can freeze: to the client, a server that stopped
answering (SIGSTOP, a hung host) with its connections still open.

`FreezableProxy(host, port)` forwards every connection to the target. `freeze()` stops
moving bytes in both directions without closing anything, so a client blocks in a read
that no server-side timeout can end; `thaw()` resumes."""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["FreezableProxy"]


class FreezableProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._running = threading.Event()
        self._running.set()  # set: bytes flow; clear: frozen
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> FreezableProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._running.set()
        self._listener.close()
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def freeze(self) -> None:
        self._running.clear()

    def thaw(self) -> None:
        self._running.set()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        source.settimeout(0.2)
        while not self._closing.is_set():
            self._running.wait()
            try:
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            self._running.wait()  # frozen: hold what was read, as a stopped server would
            try:
                sink.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
