"""Moving the jobs onto a stepped wall clock (`follow_clock`), on a real APScheduler
started paused, so that no job runs and each next run stays where the test put it: a
job's next run as the scheduler holds it just after a step is the time it held before,
now read on the new clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from canaryd.daemon.scheduling import follow_clock

HOUR_S = 3600.0


def _no_job() -> None:
    return None


@pytest.fixture
def scheduler() -> Iterator[BackgroundScheduler]:
    paused = BackgroundScheduler(timezone=UTC)
    paused.start(paused=True)
    yield paused
    paused.shutdown(wait=False)


def add(
    scheduler: BackgroundScheduler, job_id: str, every_s: float, due_in_s: float | None
) -> None:
    """A job every `every_s` whose next run is `due_in_s` from now (None: paused)."""
    scheduler.add_job(
        _no_job,
        IntervalTrigger(seconds=every_s),
        id=job_id,
        next_run_time=(
            None if due_in_s is None else datetime.now(UTC) + timedelta(seconds=due_in_s)
        ),
    )


def due_in_s(scheduler: BackgroundScheduler, job_id: str) -> float | None:
    next_run = scheduler.get_job(job_id).next_run_time
    return None if next_run is None else (next_run - datetime.now(UTC)).total_seconds()


class TestFollowClock:
    def test_a_clock_set_back_keeps_each_job_in_its_place(
        self, scheduler: BackgroundScheduler
    ) -> None:
        """Set back an hour, a gate run due in 20 s reads as due in an hour and 20 s;
        followed, it is due in 20 s again, and the pair cycle in 3 s."""
        add(scheduler, "gates", 60.0, HOUR_S + 20.0)
        add(scheduler, "pair-cycle", 5.0, HOUR_S + 3.0)
        moved = follow_clock(scheduler, -HOUR_S)
        assert due_in_s(scheduler, "gates") == pytest.approx(20.0, abs=1.0)
        assert due_in_s(scheduler, "pair-cycle") == pytest.approx(3.0, abs=1.0)
        assert moved == {
            "gates": pytest.approx(20.0, abs=1.0),
            "pair-cycle": pytest.approx(3.0, abs=1.0),
        }

    def test_a_clock_set_forward_keeps_each_job_in_its_place(
        self, scheduler: BackgroundScheduler
    ) -> None:
        """Set forward an hour, a gate run due in 20 s reads as an hour overdue; followed,
        it is due in 20 s, not run at once."""
        add(scheduler, "gates", 60.0, 20.0 - HOUR_S)
        follow_clock(scheduler, HOUR_S)
        assert due_in_s(scheduler, "gates") == pytest.approx(20.0, abs=1.0)

    def test_no_job_is_put_more_than_one_interval_away(
        self, scheduler: BackgroundScheduler
    ) -> None:
        """A job already on the new clock (the scheduler ran it between the step and the
        follow) moved again would land an interval plus the step away: it is held to one
        interval and its jitter from now."""
        scheduler.add_job(
            _no_job,
            IntervalTrigger(seconds=30.0, jitter=5.0),
            id="pair-cycle",
            next_run_time=datetime.now(UTC) + timedelta(seconds=30.0),
        )
        follow_clock(scheduler, HOUR_S)
        assert due_in_s(scheduler, "pair-cycle") == pytest.approx(35.0, abs=1.0)

    def test_no_job_is_put_in_the_past(self, scheduler: BackgroundScheduler) -> None:
        """A job that would land before now is due now."""
        add(scheduler, "retention", 86_400.0, 60.0)
        follow_clock(scheduler, -2 * HOUR_S)
        assert due_in_s(scheduler, "retention") == pytest.approx(0.0, abs=1.0)

    def test_a_paused_job_stays_paused(self, scheduler: BackgroundScheduler) -> None:
        """The probe paused by `probe_interval_s = 0` is not resumed by a step."""
        add(scheduler, "probe", HOUR_S, None)
        add(scheduler, "heartbeat", 10.0, HOUR_S + 4.0)
        moved = follow_clock(scheduler, -HOUR_S)
        assert due_in_s(scheduler, "probe") is None
        assert set(moved) == {"heartbeat"}
