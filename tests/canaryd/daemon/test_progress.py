"""The soak's progress clock: ages since progress, since the last cycle and since the
last heartbeat, on the monotonic clock, and the stall it reports against the limit of
the moment."""

from __future__ import annotations

import time

import pytest

from canaryd.daemon.progress import Progress


class Clock:
    """A monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TestProgress:
    def test_before_the_first_cycle_the_cycle_age_counts_from_start(self) -> None:
        """With no cycle finished yet, the last cycle's age is the time since start."""
        progress = Progress(lambda: 60.0)
        time.sleep(0.02)
        assert progress.last_cycle_age_s() >= 0.02
        assert progress.last_progress_age_s() >= 0.02

    def test_a_mark_resets_the_progress_age_but_not_the_cycle_age(self) -> None:
        """A pair finishing is progress; only a finished cycle makes the cycle recent."""
        progress = Progress(lambda: 60.0)
        time.sleep(0.02)
        marked_at = time.monotonic()
        progress.mark()
        assert progress.last_progress_age_s() <= time.monotonic() - marked_at
        assert progress.last_cycle_age_s() >= 0.02
        finished_at = time.monotonic()
        finished = progress.cycle_finished()
        assert finished <= time.monotonic()
        assert progress.last_cycle_age_s() <= time.monotonic() - finished_at

    def test_stalled_past_the_limit_and_progressing_again_after_a_mark(self) -> None:
        """Past the limit the soak is not progressing; the limit is read at each call,
        so a reload's new limit applies at once."""
        # A clock moved by hand: with real time, a pause of the loaded test machine
        # between the mark and the check below could outlast a short limit.
        clock = Clock()
        limit = [60.0]
        progress = Progress(lambda: limit[0], clock)
        assert progress.progressing()
        limit[0] = 0.2
        clock.now += 0.25
        assert not progress.progressing()
        assert not progress.progressing()  # stays stalled (logged once)
        progress.mark()
        assert progress.progressing()

    def test_the_heartbeat_age_counts_from_start_then_from_each_beat(self) -> None:
        """Before the first heartbeat its age is the time since start; a beat resets it,
        and a restart counts from the restart again."""
        clock = Clock()
        progress = Progress(lambda: 60.0, clock)
        clock.now += 5.0
        assert progress.last_heartbeat_age_s() == 5.0
        progress.beat()
        clock.now += 2.0
        assert progress.last_heartbeat_age_s() == 2.0
        clock.now += 10.0
        progress.restart()
        assert progress.last_heartbeat_age_s() == 0.0

    def test_a_wall_clock_set_back_an_hour_changes_no_age(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Every age is on the monotonic clock: with the wall clock an hour behind (and
        then an hour ahead), no age goes negative or jumps an hour, so a step neither
        hides a stall nor fakes one."""
        progress = Progress(lambda: 60.0)
        progress.beat()
        progress.cycle_finished()
        real_time = time.time
        for step_s in (-3600.0, 3600.0):
            monkeypatch.setattr(time, "time", lambda step_s=step_s: real_time() + step_s)
            for age in (
                progress.last_progress_age_s(),
                progress.last_cycle_age_s(),
                progress.last_heartbeat_age_s(),
            ):
                assert 0.0 <= age < 60.0
            assert progress.progressing()
