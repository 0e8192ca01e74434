"""The pace of pairs alone: `Pace` on real settings, a real `RolloutBurst` on a hand-moved
clock, a real metrics registry and a real APScheduler whose cycle job it moves."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC
from typing import Any

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from canaryd.config import Settings
from canaryd.daemon import CYCLE_JOB
from canaryd.daemon.burst import RolloutBurst
from canaryd.daemon.pace import Pace
from canaryd.judging.verdict import VerdictQuery
from canaryd.metrics import CanarydMetrics

# Two pairs a minute (one cycle of two every 60 s); suspicious past 0.25 of a threshold:
# 6 pairs a minute, one cycle every 10 s; a burst: 4 at once, 30 a minute, every 8 s.
SETTINGS = Settings(schedule={"pair_interval_s": 60.0, "pairs_per_cycle": 2, "jitter_s": 0})


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """A pace over settings, a burst, a suspicion set by hand and, once started, a
    scheduler holding a cycle job."""

    def __init__(self, settings: Settings = SETTINGS) -> None:
        self.settings = settings
        self.suspicion: float | None = 0.0
        self.metrics = CanarydMetrics()
        self.clock = Clock()
        self.burst = RolloutBurst(lambda: self.settings, clock=self.clock)
        self.scheduler: BackgroundScheduler | None = None
        self.pace = Pace(
            lambda: self.settings,
            self.burst,
            self.metrics.liveness,
            suspicion=lambda: self.suspicion,
            scheduler=lambda: self.scheduler,
        )
        self.burst.on_change = self.pace.repace

    def start(self) -> None:
        scheduler = BackgroundScheduler(timezone=UTC)
        seconds = self.settings.schedule.pair_interval_s
        scheduler.add_job(_no_cycle, IntervalTrigger(seconds=seconds), id=CYCLE_JOB)
        scheduler.start()
        self.scheduler = scheduler

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)

    def cycle_every(self) -> float:
        assert self.scheduler is not None
        trigger: Any = self.scheduler.get_job(CYCLE_JOB).trigger
        return float(trigger.interval.total_seconds())

    def gauge(self, name: str) -> float | None:
        return self.metrics.registry.get_sample_value(name)


def _no_cycle() -> None:
    return None


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig()
    yield made
    made.stop()


class TestPace:
    def test_it_starts_at_the_schedule(self, rig: Rig) -> None:
        """A new pace is the schedule's interval, and its rate the schedule's rule."""
        assert rig.pace.interval_s == 60.0
        assert rig.pace.pairs_per_minute() == rig.settings.schedule.pairs_per_minute == 2.0

    def test_a_suspicious_detector_speeds_pairs_up_until_it_fades(self, rig: Rig) -> None:
        """Past speed_up_at, cycles run every 60 / max_pairs_per_minute s (the cycle job
        and the gauge with them); below it, the schedule's interval again."""
        rig.start()
        rig.pace.repace()
        assert rig.pace.interval_s == 60.0 and rig.cycle_every() == 60.0
        rig.suspicion = 0.25
        rig.pace.repace()
        assert rig.pace.interval_s == 10.0 and rig.cycle_every() == 10.0
        assert rig.gauge("canaryd_pair_interval_seconds") == 10.0
        assert rig.pace.pairs_per_minute() == 12.0  # two pairs a cycle, six cycles a minute
        rig.suspicion = 0.2
        rig.pace.repace()
        assert rig.pace.interval_s == 60.0 and rig.cycle_every() == 60.0
        assert rig.gauge("canaryd_pair_interval_seconds") == 60.0

    def test_a_follower_or_no_max_rate_keeps_the_schedule(self) -> None:
        """No suspicion (not leading), or `max_pairs_per_minute` null: never faster."""
        follower = Rig()
        follower.suspicion = None
        follower.pace.repace()
        assert follower.pace.interval_s == 60.0
        capped = Rig(Settings(schedule={"pair_interval_s": 60.0, "max_pairs_per_minute": None}))
        capped.suspicion = 0.9
        capped.pace.repace()
        assert capped.pace.interval_s == 60.0

    def test_a_rollout_burst_sets_its_own_pace_and_rate(self, rig: Rig) -> None:
        """Naming a revision re-paces at once: a cycle of `concurrency` every
        60 x concurrency / rollout.max_pairs_per_minute s, the burst's rate answered, the
        burst gauge on; when the hold expires, the schedule's pace again."""
        rig.start()
        rig.burst.named(VerdictQuery("r"), None)
        assert rig.pace.interval_s == 8.0 and rig.cycle_every() == 8.0
        assert rig.pace.pairs_per_minute() == 30.0
        assert rig.gauge("canaryd_burst_active") == 1.0
        rig.clock.now += rig.settings.rollout.burst_hold_s + 1
        assert not rig.burst.refresh()
        assert rig.pace.interval_s == 60.0 and rig.cycle_every() == 60.0
        assert rig.gauge("canaryd_burst_active") == 0.0
        assert rig.pace.pairs_per_minute() == 2.0

    def test_a_new_schedule_resets_the_pace_and_the_cycle_job(self, rig: Rig) -> None:
        """`scheduled` puts the pace, the gauge and the running cycle job on a reloaded
        schedule's interval, however fast the pace was."""
        rig.start()
        rig.suspicion = 0.9
        rig.pace.repace()
        assert rig.cycle_every() == 10.0
        slower = SETTINGS.schedule.model_copy(update={"pair_interval_s": 120.0})
        rig.pace.scheduled(slower)
        assert rig.pace.interval_s == 120.0 and rig.cycle_every() == 120.0
        assert rig.gauge("canaryd_pair_interval_seconds") == 120.0

    def test_without_a_scheduler_only_the_pace_moves(self, rig: Rig) -> None:
        """Before the scheduler starts (or cycles run by hand) the pace and its gauge
        still follow; there is no job to move."""
        rig.suspicion = 0.9
        rig.pace.repace()
        assert rig.pace.interval_s == 10.0
        assert rig.gauge("canaryd_pair_interval_seconds") == 10.0
