"""The clock watch alone: a wall clock stepped by hand against a monotonic one moved by
hand, so that every step and every drift is exact and no test waits on real time, except
the one that runs the watch's own thread."""

from __future__ import annotations

import threading

import pytest
from structlog.testing import capture_logs

from canaryd.daemon.clock import JUMP_TOLERANCE_S, ClockWatch


class Clocks:
    """A wall clock and a monotonic one, both moved by hand."""

    def __init__(self) -> None:
        self.monotonic_now = 5_000.0
        self.wall_now = 1_800_000_000.0
        self.preempt_s = 0.0  # the next wall read is preceded by this long a pause

    def monotonic(self) -> float:
        return self.monotonic_now

    def wall(self) -> float:
        if self.preempt_s:  # the reading thread lost the CPU between two reads
            self.elapse(self.preempt_s)
            self.preempt_s = 0.0
        return self.wall_now

    def elapse(self, seconds: float) -> None:
        """Time passes: both clocks move."""
        self.monotonic_now += seconds
        self.wall_now += seconds

    def step(self, seconds: float) -> None:
        """The wall clock alone is stepped (`date -s`)."""
        self.wall_now += seconds


class Follower:
    """What the daemon does with a step: records it, answers the jobs' next runs."""

    def __init__(self) -> None:
        self.jumps: list[float] = []

    def __call__(self, jump_s: float) -> dict[str, float]:
        self.jumps.append(jump_s)
        return {"gates": 7.5}


def watch(clocks: Clocks, follower: Follower) -> ClockWatch:
    return ClockWatch(follower, wall=clocks.wall, monotonic=clocks.monotonic)


class TestClockWatch:
    def test_a_clock_set_back_an_hour_is_one_step_of_minus_an_hour(self) -> None:
        """A wall clock set back 3600 s is handed on once as -3600, and logged once as
        `clock.jumped` with the step and the next runs the follower answered."""
        clocks, follower = Clocks(), Follower()
        watcher = watch(clocks, follower)
        clocks.elapse(1.0)
        clocks.step(-3600.0)
        with capture_logs() as logs:
            assert watcher.check() == pytest.approx(-3600.0)
            clocks.elapse(1.0)
            assert watcher.check() is None
        assert follower.jumps == [pytest.approx(-3600.0)]
        (line,) = [e for e in logs if e["event"] == "clock.jumped"]
        assert line["jump_s"] == -3600.0 and line["next_runs_in_s"] == {"gates": 7.5}

    def test_forward_and_back_again_are_two_steps(self) -> None:
        """An hour forward, then back to the true time: each step is handed on, the
        second one as -3600 (it is measured from the first, not from the start)."""
        clocks, follower = Clocks(), Follower()
        watcher = watch(clocks, follower)
        clocks.step(3600.0)
        assert watcher.check() == pytest.approx(3600.0)
        clocks.elapse(15.0)
        assert watcher.check() is None
        clocks.step(-3600.0)
        assert watcher.check() == pytest.approx(-3600.0)
        assert follower.jumps == [pytest.approx(3600.0), pytest.approx(-3600.0)]

    def test_time_passing_is_no_step(self) -> None:
        """Both clocks moving together, however far, is not a step."""
        clocks, follower = Clocks(), Follower()
        watcher = watch(clocks, follower)
        for _ in range(3):
            clocks.elapse(86_400.0)
            assert watcher.check() is None
        assert follower.jumps == []

    def test_a_step_within_the_tolerance_is_not_followed(self) -> None:
        """A step of at most `JUMP_TOLERANCE_S` is left alone, one just past it is not."""
        clocks, follower = Clocks(), Follower()
        watcher = watch(clocks, follower)
        clocks.step(JUMP_TOLERANCE_S * 0.9)
        assert watcher.check() is None
        clocks.step(-JUMP_TOLERANCE_S * 1.1)
        assert watcher.check() == pytest.approx(-JUMP_TOLERANCE_S * 1.1)

    def test_a_slow_drift_is_never_summed_into_a_step(self) -> None:
        """Ten checks each a second off (NTP slewing, much exaggerated) add up to five
        times the tolerance and are still no step: each check compares with the last."""
        clocks, follower = Clocks(), Follower()
        watcher = watch(clocks, follower)
        for _ in range(10):
            clocks.elapse(1.0)
            clocks.step(JUMP_TOLERANCE_S / 2)
            assert watcher.check() is None
        assert follower.jumps == []

    def test_a_reading_interrupted_by_a_pause_is_read_again(self) -> None:
        """A 30 s pause between the reads of one check (the thread lost the CPU) would
        look like a 15 s step; the reading is taken again and no step is seen."""
        clocks, follower = Clocks(), Follower()
        watcher = watch(clocks, follower)
        clocks.preempt_s = 30.0
        assert watcher.check() is None
        assert follower.jumps == []

    def test_a_failing_follower_leaves_the_watch_watching(self) -> None:
        """What the follower raises is logged as `clock.follow_failed`; the next step is
        handed on all the same."""
        clocks = Clocks()
        calls: list[float] = []

        def failing(jump_s: float) -> dict[str, float]:
            calls.append(jump_s)
            if len(calls) == 1:
                raise RuntimeError("the scheduler is shutting down")
            return {}

        watcher = ClockWatch(failing, wall=clocks.wall, monotonic=clocks.monotonic)
        clocks.step(-600.0)
        with capture_logs() as logs:
            assert watcher.check() == pytest.approx(-600.0)
        assert [e["event"] for e in logs] == ["clock.follow_failed"]
        clocks.step(600.0)
        assert watcher.check() == pytest.approx(600.0)
        assert calls == [pytest.approx(-600.0), pytest.approx(600.0)]

    def test_its_thread_hands_on_a_step_until_stopped(self) -> None:
        """Started, the watch checks on a thread of its own and hands a step on within a
        few checks; stopped, its thread has ended."""
        clocks = Clocks()
        seen = threading.Event()

        def follow(jump_s: float) -> dict[str, float]:
            seen.set()
            return {}

        watcher = ClockWatch(follow, every_s=0.01, wall=clocks.wall, monotonic=clocks.monotonic)
        watcher.start()
        try:
            with pytest.raises(RuntimeError, match="already started"):
                watcher.start()
            clocks.step(-3600.0)
            assert seen.wait(10), "the step was not handed on"
        finally:
            watcher.stop()
        assert not any(t.name == "canaryd-clock" for t in threading.enumerate())
        watcher.stop()  # idempotent
