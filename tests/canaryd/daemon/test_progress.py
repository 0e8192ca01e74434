"""The soak's progress clock: ages since progress and since the last cycle, and the
stall it reports against the limit of the moment."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from canaryd.daemon import progress as progress_module
from canaryd.daemon.progress import Progress


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

    def test_stalled_past_the_limit_and_progressing_again_after_a_mark(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Past the limit the soak is not progressing; the limit is read at each call,
        so a reload's new limit applies at once."""
        # The module's clock, moved by hand: with real time, a pause of the loaded test
        # machine between the mark and the check below could outlast a short limit.
        clock = [1000.0]
        monkeypatch.setattr(progress_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
        limit = [60.0]
        progress = Progress(lambda: limit[0])
        assert progress.progressing()
        limit[0] = 0.2
        clock[0] += 0.25
        assert not progress.progressing()
        assert not progress.progressing()  # stays stalled (logged once)
        progress.mark()
        assert progress.progressing()
