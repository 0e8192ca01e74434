"""The soak's progress clock: when the daemon started, when a pair or a cycle last moved,
when the last cycle finished, when the scheduler last ran the heartbeat, and whether the
soak has stalled past `max_stall_s`. The pair cycle and the probe job mark it; the
heartbeat (which feeds systemd's watchdog only while it says the soak progresses) beats
it and reads it; /healthz reads it. Every age is on the monotonic clock, so a step of the
wall clock neither hides a stall nor fakes one."""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

__all__ = ["Progress"]

log = structlog.get_logger(__name__)


class Progress:
    """Monotonic times of the soak's progress; `max_stall_s` gives the limit of the moment
    (it follows a reload), `clock` the monotonic time (a test moves it by hand)."""

    def __init__(
        self, max_stall_s: Callable[[], float], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max_stall_s = max_stall_s
        self._clock = clock
        self._started_at = clock()
        self._last_cycle_at: float | None = None
        # A cycle starting, a pair finishing, a cycle finishing: the soak is not wedged.
        self._progress_at = self._started_at
        self._heartbeat_at: float | None = None
        self._stalled = False

    def restart(self) -> None:
        """The daemon (re)starts: ages count from now."""
        self._started_at = self._progress_at = self._clock()
        self._heartbeat_at = None

    def mark(self) -> float:
        """Something progressed (a cycle started, a pair or a capability finished); the
        monotonic time of it."""
        self._progress_at = self._clock()
        return self._progress_at

    def cycle_finished(self) -> float:
        """A cycle finished; the monotonic time of it."""
        self._last_cycle_at = self._progress_at = self._clock()
        return self._last_cycle_at

    def beat(self) -> None:
        """The scheduler ran the heartbeat job: its jobs are being run."""
        self._heartbeat_at = self._clock()

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
        return self._clock() - self._progress_at

    def last_cycle_age_s(self) -> float:
        """Seconds since the last cycle finished (since start, before the first)."""
        since = self._last_cycle_at if self._last_cycle_at is not None else self._started_at
        return self._clock() - since

    def last_heartbeat_age_s(self) -> float:
        """Seconds since the scheduler last ran the heartbeat (since start, before the
        first)."""
        since = self._heartbeat_at if self._heartbeat_at is not None else self._started_at
        return self._clock() - since
