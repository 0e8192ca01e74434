"""The daemon's APScheduler wiring: the job ids, their interval triggers, starting a
scheduler that runs the pair cycle, gates, retention, heartbeat and capability probe
jobs, moving those jobs onto a reloaded `schedule` section (a probe interval of 0
pauses the probe job), and onto a wall clock that was stepped (`follow_clock`, called by
`canaryd.daemon.clock`); the pair cycle's interval after start is the pace's
(`canaryd.daemon.pace`), which moves it with `pace_cycles`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from canaryd.config import ScheduleConfig

__all__ = [
    "CYCLE_JOB",
    "GATE_JOB",
    "HEARTBEAT_JOB",
    "PROBE_JOB",
    "RETENTION_JOB",
    "follow_clock",
    "pace_cycles",
    "reschedule",
    "start_scheduler",
]

CYCLE_JOB = "pair-cycle"
GATE_JOB = "gates"
RETENTION_JOB = "retention"
HEARTBEAT_JOB = "heartbeat"
PROBE_JOB = "probe"
_JOBS = (CYCLE_JOB, GATE_JOB, RETENTION_JOB, HEARTBEAT_JOB)
# The first probe waits this long after start: the first pairs come first.
_FIRST_PROBE_DELAY_S = 60.0


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
    probe: Callable[[], None] | None = None,
) -> BackgroundScheduler:
    """A started scheduler with one instance at most of each job, missed runs coalesced.

    The cycle, retention and heartbeat jobs run at once; the gates wait one interval;
    the probe (when given) a minute, then runs every `probe_interval_s` (paused at 0).
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
    if probe is not None:
        scheduler.add_job(
            probe,
            _interval(schedule.probe_interval_s or 3600.0),
            id=PROBE_JOB,
            # None: added paused (probe_interval_s = 0), for a reload to resume.
            next_run_time=(
                now + timedelta(seconds=_FIRST_PROBE_DELAY_S)
                if schedule.probe_interval_s > 0
                else None
            ),
        )
    scheduler.start()
    return scheduler


def reschedule(scheduler: BackgroundScheduler, schedule: ScheduleConfig) -> None:
    """Put every job on the misfire grace of `schedule`, and every job but the pair cycle
    on its intervals: the cycle's is the pace's (`canaryd.daemon.pace`)."""
    scheduler.reschedule_job(GATE_JOB, trigger=_interval(schedule.gate_interval_s))
    scheduler.reschedule_job(RETENTION_JOB, trigger=_interval(schedule.retention_interval_s))
    scheduler.reschedule_job(HEARTBEAT_JOB, trigger=_interval(schedule.heartbeat_interval_s))
    grace = _misfire_grace(schedule)
    for job_id in _JOBS:
        scheduler.modify_job(job_id, misfire_grace_time=grace)
    if scheduler.get_job(PROBE_JOB) is not None:
        if schedule.probe_interval_s > 0:  # rescheduling resumes a paused job
            scheduler.reschedule_job(PROBE_JOB, trigger=_interval(schedule.probe_interval_s))
            scheduler.modify_job(PROBE_JOB, misfire_grace_time=grace)
        else:
            scheduler.pause_job(PROBE_JOB)


def pace_cycles(
    scheduler: BackgroundScheduler, schedule: ScheduleConfig, interval_s: float
) -> None:
    """Run the pair cycle every `interval_s` (the pace), jitter as configured."""
    scheduler.reschedule_job(CYCLE_JOB, trigger=_interval(interval_s, schedule.jitter_s))


def follow_clock(scheduler: BackgroundScheduler, jump_s: float) -> dict[str, float]:
    """Move every scheduled job's next run by `jump_s`, the wall clock's step, so that it
    keeps its place on the monotonic clock; never before now, and an interval job never
    more than one interval (and its jitter) from now. Returns the seconds from now to each
    moved job's next run, by job id (a paused job stays paused).

    The bounds make a second move harmless: a job the scheduler ran between the step and
    this call already has its next run on the new clock."""
    now = datetime.now(UTC)
    moved: dict[str, float] = {}
    for job in scheduler.get_jobs():
        if job.next_run_time is None:
            continue
        next_run = max(job.next_run_time + timedelta(seconds=jump_s), now)
        if isinstance(job.trigger, IntervalTrigger):
            longest = job.trigger.interval_length + (job.trigger.jitter or 0.0)
            next_run = min(next_run, now + timedelta(seconds=longest))
        try:
            scheduler.modify_job(job.id, next_run_time=next_run)
        except JobLookupError:
            continue  # removed meanwhile (a reload dropped the telemetry job)
        moved[job.id] = round((next_run - now).total_seconds(), 3)
    return moved
