"""Rate-limited log lines: one line per reason per interval, the next one carrying how
many were left out, and a bounded memory of reasons."""

from __future__ import annotations

import threading

import pytest

from canaryd.traffic.throttle import OTHER_REASONS, LogThrottle


class Clock:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TestLogThrottle:
    def test_one_line_per_reason_per_interval_with_the_count_left_out(self) -> None:
        """The first line is admitted (0 left out); lines within the interval are not;
        the first after it carries how many were left out, then the count starts over."""
        clock = Clock()
        throttle = LogThrottle(60.0, clock=clock)
        assert throttle.admit("unusable") == 0
        assert [throttle.admit("unusable") for _ in range(999)] == [None] * 999
        assert throttle.admit("too_large") == 0  # reasons are limited apart
        clock.now += 59.9
        assert throttle.admit("unusable") is None
        clock.now += 0.1
        assert throttle.admit("unusable") == 1000
        clock.now += 60.0
        assert throttle.admit("unusable") == 0

    def test_reasons_beyond_the_bound_share_one_slot(self) -> None:
        """Beyond `max_reasons` distinct reasons the rest share the `other` slot, so
        callers passing ever new reasons cannot grow its memory or its lines."""
        throttle = LogThrottle(60.0, max_reasons=2, clock=Clock())
        assert throttle.admit("a") == 0
        assert throttle.admit("b") == 0
        assert throttle.admit("c") == 0
        assert [throttle.admit(f"new{i}") for i in range(100)] == [None] * 100
        assert set(throttle._last) == {"a", "b", OTHER_REASONS}

    def test_threads_admit_exactly_one_line(self) -> None:
        """Admitted from many threads at once, one line per interval all the same."""
        throttle = LogThrottle(3600.0)
        admitted: list[int | None] = []
        lock = threading.Lock()

        def admit() -> None:
            for _ in range(200):
                result = throttle.admit("unusable")
                with lock:
                    admitted.append(result)

        threads = [threading.Thread(target=admit) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert admitted.count(0) == 1
        assert admitted.count(None) == 8 * 200 - 1

    def test_a_negative_interval_is_refused(self) -> None:
        """A negative interval is a programming error, named with its value."""
        with pytest.raises(ValueError, match="-1"):
            LogThrottle(-1.0)
