"""/healthz's report alone, on ages given by hand: the heartbeat's age against its limit
says whether the scheduler runs its jobs, beside the cycle's age and the stall."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC

import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from canaryd.config import Settings
from canaryd.daemon.health import HEARTBEAT_MARGIN_S, health_report, max_heartbeat_age_s

SETTINGS = Settings(schedule={"heartbeat_interval_s": 10.0})


@pytest.fixture
def running() -> Iterator[BackgroundScheduler]:
    scheduler = BackgroundScheduler(timezone=UTC)
    scheduler.start()
    yield scheduler
    scheduler.shutdown(wait=False)


class TestHeartbeatAge:
    def test_the_limit_is_three_intervals_and_a_margin(self) -> None:
        """Three heartbeat intervals plus `HEARTBEAT_MARGIN_S`: 40 s by default."""
        assert max_heartbeat_age_s(SETTINGS) == 30.0 + HEARTBEAT_MARGIN_S == 40.0

    def test_a_scheduler_that_runs_no_heartbeat_is_unhealthy(
        self, running: BackgroundScheduler
    ) -> None:
        """A running scheduler whose last heartbeat is older than the limit (its jobs
        held, as by a wall clock set back) fails /healthz with the age and the limit,
        though the last cycle and the last progress are still within theirs."""
        ok, detail = health_report(
            running, 30.0, SETTINGS, 3, progress_age_s=30.0, heartbeat_age_s=41.0
        )
        assert not ok
        assert detail["problems"] == [
            "the scheduler ran no heartbeat for 41.0 s, over the 40 s limit: its jobs are "
            "not being run"
        ]
        assert detail["last_heartbeat_age_s"] == 41.0 and detail["max_heartbeat_age_s"] == 40.0

    def test_a_recent_heartbeat_is_healthy(self, running: BackgroundScheduler) -> None:
        """Within the limit, the report is healthy and carries the age."""
        ok, detail = health_report(running, 1.0, SETTINGS, 3, heartbeat_age_s=39.0)
        assert ok, detail
        assert detail["last_heartbeat_age_s"] == 39.0

    def test_a_stopped_scheduler_is_reported_as_stopped_only(self) -> None:
        """Without a running scheduler the heartbeat's age says nothing more: the one
        problem is the scheduler's state."""
        ok, detail = health_report(None, 1.0, SETTINGS, 0, heartbeat_age_s=1000.0)
        assert not ok
        assert detail["problems"] == ["scheduler is stopped"]
        assert "last_heartbeat_age_s" not in detail
