"""The daemon's APScheduler wiring: the four job ids, their interval triggers, starting a
scheduler that runs the pair cycle, gates, retention and heartbeat jobs, and moving those
jobs onto a reloaded `schedule` section."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from canaryd.config import ScheduleConfig

__all__ = [
    "CYCLE_JOB",
    "GATE_JOB",
    "HEARTBEAT_JOB",
    "RETENTION_JOB",
    "pace_cycles",
    "reschedule",
    "start_scheduler",
]

CYCLE_JOB = "pair-cycle"
GATE_JOB = "gates"
RETENTION_JOB = "retention"
HEARTBEAT_JOB = "heartbeat"
_JOBS = (CYCLE_JOB, GATE_JOB, RETENTION_JOB, HEARTBEAT_JOB)


def _interval(seconds: float, jitter_s: float = 0.0) -> IntervalTrigger:
    return IntervalTrigger(seconds=seconds, jitter=jitter_s or None)


def _misfire_grace(schedule: ScheduleConfig) -> int:
    return max(1, round(schedule.misfire_grace_s))


def start_scheduler(
    schedule: ScheduleConfig,
    *,
    cycle: Callable[[], None],
    gates: Callable[[], None],
    retention: Callable[[], None],
    heartbeat: Callable[[], None],
) -> BackgroundScheduler:
    """A started scheduler with one instance at most of each job, missed runs coalesced.

    The cycle, retention and heartbeat jobs run at once; the gates wait one interval.
    """
    scheduler = BackgroundScheduler(
        timezone=UTC,
        job_defaults={
            "max_instances": 1,
            "coalesce": True,
            "misfire_grace_time": _misfire_grace(schedule),
        },
    )
    now = datetime.now(UTC)
    scheduler.add_job(
        cycle,
        _interval(schedule.pair_interval_s, schedule.jitter_s),
        id=CYCLE_JOB,
        next_run_time=now,  # the first cycle starts at once, not one interval later
    )
    scheduler.add_job(gates, _interval(schedule.gate_interval_s), id=GATE_JOB)
    scheduler.add_job(
        retention, _interval(schedule.retention_interval_s), id=RETENTION_JOB, next_run_time=now
    )
    scheduler.add_job(
        heartbeat, _interval(schedule.heartbeat_interval_s), id=HEARTBEAT_JOB, next_run_time=now
    )
    scheduler.start()
    return scheduler


def reschedule(scheduler: BackgroundScheduler, schedule: ScheduleConfig) -> None:
    """Put every job on the intervals and misfire grace of `schedule`."""
    scheduler.reschedule_job(
        CYCLE_JOB, trigger=_interval(schedule.pair_interval_s, schedule.jitter_s)
    )
    scheduler.reschedule_job(GATE_JOB, trigger=_interval(schedule.gate_interval_s))
    scheduler.reschedule_job(RETENTION_JOB, trigger=_interval(schedule.retention_interval_s))
    scheduler.reschedule_job(HEARTBEAT_JOB, trigger=_interval(schedule.heartbeat_interval_s))
    grace = _misfire_grace(schedule)
    for job_id in _JOBS:
        scheduler.modify_job(job_id, misfire_grace_time=grace)


def pace_cycles(
    scheduler: BackgroundScheduler, schedule: ScheduleConfig, interval_s: float
) -> None:
    """Run the pair cycle every `interval_s` (the adaptive pace), jitter as configured."""
    scheduler.reschedule_job(CYCLE_JOB, trigger=_interval(interval_s, schedule.jitter_s))
