"""The soak's progress clock: when the daemon started, when a pair or a cycle last moved,
when the last cycle finished, and whether the soak has stalled past `max_stall_s`. The
pair cycle and the probe job mark it; the heartbeat (which feeds systemd's watchdog only
while it says the soak progresses) and /healthz read it."""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

__all__ = ["Progress"]

log = structlog.get_logger(__name__)


class Progress:
    """Monotonic times of the soak's progress; `max_stall_s` gives the limit of the moment
    (it follows a reload)."""

    def __init__(self, max_stall_s: Callable[[], float]) -> None:
        self._max_stall_s = max_stall_s
        self._started_at = time.monotonic()
        self._last_cycle_at: float | None = None
        # A cycle starting, a pair finishing, a cycle finishing: the soak is not wedged.
        self._progress_at = self._started_at
        self._stalled = False

    def restart(self) -> None:
        """The daemon (re)starts: ages count from now."""
        self._started_at = self._progress_at = time.monotonic()

    def mark(self) -> float:
        """Something progressed (a cycle started, a pair or a capability finished); the
        monotonic time of it."""
        self._progress_at = time.monotonic()
        return self._progress_at

    def cycle_finished(self) -> float:
        """A cycle finished; the monotonic time of it."""
        self._last_cycle_at = self._progress_at = time.monotonic()
        return self._last_cycle_at

    def progressing(self) -> bool:
        """Whether the soak made progress within `max_stall_s`; logs once when it stops
        (a generation or a check is stuck: the watchdog is no longer fed) and resumes."""
        age, limit = self.last_progress_age_s(), self._max_stall_s()
        stalled = age > limit
        if stalled and not self._stalled:
            log.error(
                "cycle.stalled",
                last_progress_age_s=round(age, 1),
                max_stall_s=limit,
                reason="no pair has finished and no cycle started or ended within the "
                "limit: a generation or a check is stuck; systemd's watchdog is no longer "
                "fed and will restart canaryd",
            )
        elif self._stalled and not stalled:
            log.info("cycle.progressing", last_progress_age_s=round(age, 1))
        self._stalled = stalled
        return not stalled

    def last_progress_age_s(self) -> float:
        """Seconds since a cycle started, a pair finished or a cycle finished."""
        return time.monotonic() - self._progress_at

    def last_cycle_age_s(self) -> float:
        """Seconds since the last cycle finished (since start, before the first)."""
        since = self._last_cycle_at if self._last_cycle_at is not None else self._started_at
        return time.monotonic() - since
