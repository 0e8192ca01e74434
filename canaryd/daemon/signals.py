"""The daemon's main-thread loop behind `canaryd run`: SIGTERM and SIGINT stop the daemon
in order, SIGHUP reloads its configuration, and systemd hears READY, RELOADING and
STOPPING at the matching moments. Handlers only queue the signal; the stop and the reload
run in the main thread, never inside a handler."""

from __future__ import annotations

import contextlib
import queue
import signal
from collections.abc import Callable, Iterator
from types import FrameType

import structlog

from canaryd.daemon import sdnotify
from canaryd.daemon.lifecycle import Daemon

__all__ = ["serve_until_signalled"]

log = structlog.get_logger(__name__)


@contextlib.contextmanager
def _signals_to(queue_: queue.SimpleQueue[int]) -> Iterator[None]:
    """Route SIGTERM, SIGINT and SIGHUP into `queue_` while inside; restore after."""
    wanted = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def handler(signum: int, _frame: FrameType | None) -> None:
        queue_.put(signum)  # SimpleQueue.put is safe from a signal handler

    previous = {sig: signal.signal(sig, handler) for sig in wanted}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def serve_until_signalled(
    daemon: Daemon, *, poll_s: float = 0.5, on_ready: Callable[[], None] | None = None
) -> int:
    """Block the main thread until SIGTERM or SIGINT, reloading on SIGHUP; return 0.

    Signals only set a flag-like queue entry; the stop and the reload run here, in the
    main thread, never inside a handler. `on_ready` runs once the handlers are in place:
    telling systemd READY=1 before that would let an early `systemctl reload` (SIGHUP's
    default action) kill the process.
    """
    signals: queue.SimpleQueue[int] = queue.SimpleQueue()
    with _signals_to(signals):
        if on_ready is not None:
            on_ready()
        while True:
            try:
                signum = signals.get(timeout=poll_s)
            except queue.Empty:
                continue
            if signum == signal.SIGHUP:
                log.info("signal.received", signal="SIGHUP")
                sdnotify.reloading()
                try:
                    daemon.reload()
                except Exception:
                    # The running configuration is intact; a failed reload is no reason
                    # to leave without stopping in order.
                    log.exception("config.reload_failed")
                sdnotify.ready("configuration reloaded")
                continue
            log.info("signal.received", signal=signal.Signals(signum).name)
            break
        sdnotify.stopping()
        daemon.stop()
    return 0
