"""systemd's readiness and watchdog protocol (sd_notify), without libsystemd.

Under a `Type=notify` unit systemd sets `NOTIFY_SOCKET` to an `AF_UNIX` datagram socket:
a filesystem path, or an abstract-namespace name written with a leading `@`. Each
notification is one datagram of newline-separated `KEY=VALUE` lines (`READY=1`,
`WATCHDOG=1`, `STOPPING=1`, `RELOADING=1`, `STATUS=…`), as documented in sd_notify(3).
Outside systemd (no `NOTIFY_SOCKET`) every function is a no-op returning False, so the
daemon calls them unconditionally. A failed send is logged and reported as False, never
raised: a notification is advice to the service manager, not part of the soak.
"""

from __future__ import annotations

import os
import socket
import time

import structlog

__all__ = [
    "NOTIFY_SOCKET_ENV",
    "notify",
    "ready",
    "reloading",
    "status",
    "stopping",
    "watchdog",
    "watchdog_interval_s",
]

log = structlog.get_logger(__name__)

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
_STATUS_MAX = 200  # systemctl status shows one line; keep the datagram small
# The last send failure, logged once rather than on every 10 s watchdog ping.
_last_failure: list[str] = []


def _address(value: str) -> str | None:
    """The socket address `NOTIFY_SOCKET` names, or None when canaryd cannot use it."""
    if value.startswith("@"):
        # The abstract namespace: a leading NUL byte instead of "@" (unix(7)).
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    # "vsock:…" (systemd ≥ 254, for VMs) and relative paths are not for a host daemon.
    return None


def notify(*lines: str) -> bool:
    """Send `lines` as one notification; True when a datagram was sent."""
    value = os.environ.get(NOTIFY_SOCKET_ENV, "")
    if not value:
        return False
    address = _address(value)
    if address is None:
        log.warning("sdnotify.unsupported_socket", notify_socket=value)
        return False
    payload = "\n".join(lines).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(payload)
    except OSError as exc:
        if _last_failure != [str(exc)]:
            log.warning("sdnotify.send_failed", notify_socket=value, reason=str(exc))
            _last_failure[:] = [str(exc)]
        return False
    if _last_failure:
        log.info("sdnotify.send_recovered", notify_socket=value)
        _last_failure.clear()
    return True


def ready(text: str = "") -> bool:
    """The daemon is serving: engines loaded and warmed up, database checked."""
    lines = ["READY=1"]
    if text:
        lines.append(_status_line(text))
    return notify(*lines)


def reloading() -> bool:
    """A reload (SIGHUP) began; `ready()` again when it is done (systemd ≥ 253 waits)."""
    # MONOTONIC_USEC lets systemd order this against the READY=1 that ends the reload.
    return notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")


def watchdog() -> bool:
    """The keep-alive ping for `WatchdogSec=`: cycles still progress (the daemon calls
    this from its heartbeat only while a pair finished or a cycle started recently, so a
    wedged generation or check ends in a watchdog restart, not a silent stall)."""
    return notify("WATCHDOG=1")


def stopping(text: str = "") -> bool:
    """Shutdown began (the in-flight pair may still take `shutdown_timeout_s`)."""
    lines = ["STOPPING=1"]
    if text:
        lines.append(_status_line(text))
    return notify(*lines)


def status(text: str) -> bool:
    """A one-line status that `systemctl status canaryd` shows."""
    return notify(_status_line(text))


def _status_line(text: str) -> str:
    return "STATUS=" + " ".join(text.split())[:_STATUS_MAX]


def watchdog_interval_s() -> float | None:
    """systemd's watchdog timeout in seconds (`WATCHDOG_USEC`), or None when the watchdog
    is off or meant for another process (`WATCHDOG_PID` is not ours).

    Ping at least twice per timeout: the heartbeat interval should be at most half of it.
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1_000_000 if value > 0 else None
