"""Steps of the wall clock: `ClockWatch` compares the wall clock with the monotonic one
from a thread of its own and hands each step past a tolerance (`date -s`, an NTP step, a
virtual machine restored or resumed) to the daemon, which moves its scheduled jobs onto
the new wall clock (`canaryd.daemon.scheduling.follow_clock`). APScheduler 3 keeps each
job's next run as a wall-clock time, so without this a clock set back an hour holds every
job, the heartbeat included, for that hour. A thread rather than a scheduled job: a job
would be held with the others."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import structlog

__all__ = ["CHECK_EVERY_S", "JUMP_TOLERANCE_S", "ClockWatch"]

log = structlog.get_logger(__name__)

CHECK_EVERY_S = 1.0
# A step smaller than this is not followed: NTP slews the clock by well under a
# millisecond a second, and a job a second or two off its time costs nothing.
JUMP_TOLERANCE_S = 2.0
# A reading whose two monotonic reads are further apart than this (the thread was
# preempted between them) is read again: the pause would look like a step.
_READ_SLACK_S = 0.05
_READ_TRIES = 5
_STOP_WAIT_S = 5.0  # a stop never waits longer for a check in progress


class ClockWatch:
    """Calls `on_jump` with the wall clock's step in seconds (negative: set back) once per
    step larger than `tolerance_s`, checked every `every_s`, and logs the step with what
    `on_jump` answered (the seconds to each job's next run); `wall` and `monotonic` are the
    clocks compared (a test steps the wall one). `on_jump` never stops the watch: what it
    raises is logged."""

    def __init__(
        self,
        on_jump: Callable[[float], Mapping[str, float]],
        *,
        tolerance_s: float = JUMP_TOLERANCE_S,
        every_s: float = CHECK_EVERY_S,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_jump = on_jump
        self._tolerance_s = tolerance_s
        self._every_s = every_s
        self._wall = wall
        self._monotonic = monotonic
        self._offset = self._read_offset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read_offset(self) -> float:
        """The wall clock less the monotonic one, read between two monotonic reads."""
        for _ in range(_READ_TRIES):
            before = self._monotonic()
            wall = self._wall()
            after = self._monotonic()
            if after - before <= _READ_SLACK_S:
                break
        return wall - (before + after) / 2

    def check(self) -> float | None:
        """The wall clock's step since the last check, when larger than the tolerance
        (`on_jump` has then been called with it); else None."""
        offset = self._read_offset()
        jump, self._offset = offset - self._offset, offset
        if abs(jump) <= self._tolerance_s:
            return None  # and a slow drift is followed, never summed into a step
        try:
            next_runs = dict(self._on_jump(jump))
        except Exception:
            log.exception("clock.follow_failed", jump_s=round(jump, 3))
            return jump
        log.warning(
            "clock.jumped",
            jump_s=round(jump, 3),
            next_runs_in_s=next_runs,
            reason="the wall clock was stepped (date -s, an NTP step, a restored or "
            "resumed machine); each scheduled job keeps its place on the monotonic clock, "
            "at most one interval away; stored times stay wall-clock UTC",
        )
        return jump

    def start(self) -> None:
        """Check every `every_s` on a daemon thread until `stop()`."""
        if self._thread is not None:
            raise RuntimeError("the clock watch is already started")
        self._stop.clear()
        self._offset = self._read_offset()
        self._thread = threading.Thread(target=self._run, name="canaryd-clock", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop checking (idempotent); waits a few seconds at most for a check in progress."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(_STOP_WAIT_S)

    def _run(self) -> None:
        # Event.wait times out on the monotonic clock (CPython 3.11+ on glibc 2.30+): a
        # step never holds the watch itself.
        while not self._stop.wait(self._every_s):
            self.check()
