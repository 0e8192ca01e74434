"""Rate-limited log lines: at most one line per reason in an interval, and that line
says how many were left out since the previous one.

A hostile or broken client can send thousands of bad requests a second; each is counted
in a metric, but a log line for each would grow the log with the attacker's rate.
`LogThrottle.admit(reason)` answers whether a line for `reason` may be written now and,
when it may, how many lines for it were suppressed since the last one written, so that
the line can carry that count. Reasons are meant to come from a small fixed set; beyond
`max_reasons` distinct ones, the rest share one slot, so memory stays bounded whatever
callers pass. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = ["OTHER_REASONS", "LogThrottle"]

OTHER_REASONS: Final = "other"  # the slot reasons beyond `max_reasons` share


class LogThrottle:
    """At most one admitted line per reason every `interval_s` seconds (`clock` is
    monotonic seconds)."""

    def __init__(
        self,
        interval_s: float,
        *,
        max_reasons: int = 32,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s < 0:
            raise ValueError(f"interval_s must be at least 0, not {interval_s!r}")
        self.interval_s = interval_s
        self.max_reasons = max_reasons
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def admit(self, reason: str) -> int | None:
        """None when a line for `reason` was written less than `interval_s` ago (this
        one is counted as suppressed); else the number suppressed since that line (0
        for the first), and the interval starts again."""
        with self._lock:
            if reason not in self._last and len(self._last) >= self.max_reasons:
                reason = OTHER_REASONS
            now = self._clock()
            last = self._last.get(reason)
            if last is not None and now - last < self.interval_s:
                self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
                return None
            self._last[reason] = now
            return self._suppressed.pop(reason, 0)
