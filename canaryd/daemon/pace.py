"""The pace of pairs: `Pace` owns the seconds between pair cycles in force and everything
that follows from it — the cycle job's trigger, the `canaryd_pair_interval_seconds` and
`canaryd_burst_active` gauges, and the pair rate the verdict's estimates read. The pace is
the schedule's `pair_interval_s`, faster while an enforce detector is past `speed_up_at`
of its threshold and undecided (`schedule.max_pairs_per_minute`, so that a suspected fault
is decided in minutes, not hours) or while a rollout burst runs (`rollout.concurrency`
pairs at once at `rollout.max_pairs_per_minute`: `canaryd.daemon.burst`). The daemon owns
one: the scheduler's start and a reload set the schedule's pace, the gate job and the
burst's start and stop re-pace."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog
from apscheduler.schedulers.background import BackgroundScheduler

from canaryd.config import ScheduleConfig, Settings
from canaryd.config.sections import interval_for, pairs_per_minute
from canaryd.daemon.burst import RolloutBurst
from canaryd.daemon.scheduling import pace_cycles
from canaryd.metrics.liveness import LivenessMetrics

__all__ = ["Pace"]

log = structlog.get_logger(__name__)


class Pace:
    """The pair interval in force. Thread-safe: the gate job, the pair cycle (through the
    burst), the verdict endpoints and a reload set or read it.

    `suspicion` answers the gates' largest undecided enforce progress (None: not leading);
    `scheduler` the running scheduler (None: cycles are run by hand, or it stopped).
    """

    def __init__(
        self,
        settings: Callable[[], Settings],
        burst: RolloutBurst,
        metrics: LivenessMetrics,
        *,
        suspicion: Callable[[], float | None],
        scheduler: Callable[[], BackgroundScheduler | None],
    ) -> None:
        self._settings = settings
        self._burst = burst
        self._metrics = metrics
        self._suspicion = suspicion
        self._scheduler = scheduler
        self._lock = threading.Lock()
        self._interval_s = settings().schedule.pair_interval_s

    @property
    def interval_s(self) -> float:
        """Seconds between pair cycles now."""
        return self._interval_s  # one read of a float: the cycle never waits on a re-pace

    def pairs_per_minute(self) -> float:
        """The pair rate now: a rollout burst's while one runs, else the pace's."""
        burst = self._burst.pairs_per_minute()
        if burst is not None:
            return burst
        return pairs_per_minute(self._settings().schedule.pairs_per_cycle, self.interval_s)

    def scheduled(self, schedule: ScheduleConfig) -> None:
        """The pace of `schedule` itself: before the scheduler starts (its cycle job is
        created on it), and after a reload that changed the schedule (the cycle job is
        moved onto it); the next gate run re-paces."""
        with self._lock:
            self._interval_s = schedule.pair_interval_s
            self._metrics.pair_interval.set(self._interval_s)
            scheduler = self._scheduler()
            if scheduler is not None:
                pace_cycles(scheduler, schedule, self._interval_s)

    def repace(self) -> None:
        """Set the pace from the suspicion and the burst of this moment; a change moves
        the cycle job onto it and is logged with its reason."""
        with self._lock:
            settings = self._settings()
            schedule = settings.schedule
            interval = schedule.pair_interval_s
            progress = self._suspicion()
            if (
                schedule.max_pairs_per_minute is not None
                and progress is not None
                and progress >= schedule.speed_up_at
            ):
                # Spaces cycles, whatever `pairs_per_cycle`: one cycle per pair of that rate.
                interval = min(interval, interval_for(1, schedule.max_pairs_per_minute))
            bursting = self._burst.active()
            self._metrics.burst_active.set(1 if bursting else 0)
            if bursting:
                rollout = settings.rollout
                interval = min(
                    interval, interval_for(rollout.concurrency, rollout.max_pairs_per_minute)
                )
            if interval == self._interval_s:
                return
            if bursting:
                reason = "a rollout burst: a revision is being judged and undecided"
            elif interval < schedule.pair_interval_s:
                reason = "an enforce detector is past speed_up_at of its threshold"
            else:
                reason = "no undecided detector past speed_up_at and no rollout burst"
            log.info(
                "schedule.pace",
                pair_interval_s=interval,
                was_s=self._interval_s,
                detector_progress=None if progress is None else round(progress, 3),
                reason=reason,
            )
            self._interval_s = interval
            self._metrics.pair_interval.set(interval)
            scheduler = self._scheduler()
            if scheduler is not None:
                pace_cycles(scheduler, schedule, interval)
