"""The daemon's /healthz and /readyz answers: `DatabaseProbe` (does the database answer a
cheap query on a fresh connection, within seconds), the limits on the age of the last
finished cycle, on the time without cycle progress (past which the daemon stops feeding
systemd's watchdog) and on the age of the scheduler's last heartbeat, and the two reports
the status server serves, built from the daemon's scheduler, its ages (monotonic),
engines, database and pending-pair buffer. Driver messages in the reports are scrubbed of
credentials before they are served."""

from __future__ import annotations

import threading
import time
from typing import Any

from apscheduler.schedulers.base import STATE_PAUSED, STATE_RUNNING, BaseScheduler
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from canaryd.config import Settings
from canaryd.daemon.buffer import PendingPairs
from canaryd.redact import redact_text
from canaryd.store.database import make_engine

__all__ = [
    "HEARTBEAT_MARGIN_S",
    "STALL_MARGIN_S",
    "DatabaseProbe",
    "health_report",
    "max_cycle_age_s",
    "max_heartbeat_age_s",
    "max_stall_s",
    "readiness_report",
]

_PROBE_TIMEOUT_S = 2
# Room for scoring a pair and for a flush of buffered pairs on top of the two
# generations and the gap between cycles that `max_stall_s` allows for.
STALL_MARGIN_S = 60.0
# Room for a heartbeat that waits on a busy process on top of the three intervals that
# `max_heartbeat_age_s` allows for.
HEARTBEAT_MARGIN_S = 10.0
_PROBE_CACHE_S = 1.0  # /readyz scraped by several probes hits the database once a second


class DatabaseProbe:
    """Whether the database answers a cheap query on a fresh connection, within seconds.

    It reads the schema version table, not `SELECT 1`, so that a SQLite file that was
    deleted (and would be silently recreated empty) reads as unreachable too.
    """

    def __init__(self, url: str, timeout_s: int = _PROBE_TIMEOUT_S) -> None:
        parsed = make_url(url)
        timeout = {"sqlite": "timeout"}.get(parsed.get_backend_name(), "connect_timeout")
        parsed = parsed.update_query_dict({timeout: str(timeout_s)})
        if parsed.get_backend_name() == "postgresql":
            # connect_timeout bounds only the connect: a server that accepts and then
            # stops answering would hold the probe (and /readyz) without this.
            parsed = parsed.update_query_dict(
                {"options": f"-c statement_timeout={timeout_s * 1000}"}
            )
        self._engine = make_engine(parsed.render_as_string(hide_password=False))
        self._lock = threading.Lock()
        self._checked_at = -float("inf")
        self._problem: str | None = None

    def check(self) -> str | None:
        """None when the database answers; else why not (cached for about a second)."""
        with self._lock:
            if time.monotonic() - self._checked_at < _PROBE_CACHE_S:
                return self._problem
            try:
                with self._engine.connect() as connection:
                    connection.execute(text("SELECT version_num FROM alembic_version")).all()
                self._problem = None
            except SQLAlchemyError as exc:
                self._problem = redact_text(" ".join(str(getattr(exc, "orig", exc)).split()))
            finally:
                # A fresh connection every time: a pooled one would hide a dead server.
                self._engine.dispose()
            self._checked_at = time.monotonic()
            return self._problem

    def close(self) -> None:
        self._engine.dispose()


def max_cycle_age_s(settings: Settings) -> float:
    """/healthz's limit on the age of the last finished cycle."""
    configured = settings.server.max_cycle_age_s
    if configured is not None:
        return configured
    return 3 * settings.schedule.pair_interval_s + 2 * settings.prompts.timeout_s


def max_stall_s(settings: Settings) -> float:
    """How long the soak may go without progress (a cycle starting, a pair finishing, a
    cycle finishing) before the daemon counts as wedged and stops feeding the watchdog:
    `server.max_cycle_age_s` when set, else one gap between cycles plus one pair's two
    generations plus `STALL_MARGIN_S`."""
    configured = settings.server.max_cycle_age_s
    if configured is not None:
        return configured
    schedule = settings.schedule
    return (
        schedule.pair_interval_s
        + schedule.jitter_s
        + 2 * settings.prompts.timeout_s
        + STALL_MARGIN_S
    )


def max_heartbeat_age_s(settings: Settings) -> float:
    """How long the scheduler may go without running the heartbeat job before /healthz
    says that its jobs are not being run: three `heartbeat_interval_s` plus
    `HEARTBEAT_MARGIN_S`."""
    return 3 * settings.schedule.heartbeat_interval_s + HEARTBEAT_MARGIN_S


def health_report(
    scheduler: BaseScheduler | None,
    cycle_age_s: float,
    settings: Settings,
    cycles: int,
    *,
    progress_age_s: float | None = None,
    heartbeat_age_s: float | None = None,
) -> tuple[bool, dict[str, Any]]:
    """/healthz: the scheduler runs, the last cycle is recent enough and, given
    `progress_age_s`, the cycle in flight is not wedged; given `heartbeat_age_s` and a
    running scheduler, the scheduler runs its jobs."""
    problems: list[str] = []
    state = {STATE_RUNNING: "running", STATE_PAUSED: "paused"}.get(
        scheduler.state if scheduler is not None else -1, "stopped"
    )
    if state != "running":
        problems.append(f"scheduler is {state}")
    limit = max_cycle_age_s(settings)
    if cycle_age_s > limit:
        problems.append(f"last cycle finished {cycle_age_s:.1f} s ago, over the {limit:g} s limit")
    detail: dict[str, Any] = {
        "scheduler": state,
        "last_cycle_age_s": round(cycle_age_s, 3),
        "max_cycle_age_s": limit,
        "cycles": cycles,
    }
    if progress_age_s is not None:
        stall_limit = max_stall_s(settings)
        detail["last_progress_age_s"] = round(progress_age_s, 3)
        detail["max_stall_s"] = stall_limit
        if progress_age_s > stall_limit:
            problems.append(
                f"no cycle progress for {progress_age_s:.1f} s, over the {stall_limit:g} s "
                "limit: a generation or a check is stuck; systemd's watchdog is not fed"
            )
    if heartbeat_age_s is not None and state == "running":
        heartbeat_limit = max_heartbeat_age_s(settings)
        detail["last_heartbeat_age_s"] = round(heartbeat_age_s, 3)
        detail["max_heartbeat_age_s"] = heartbeat_limit
        if heartbeat_age_s > heartbeat_limit:
            problems.append(
                f"the scheduler ran no heartbeat for {heartbeat_age_s:.1f} s, over the "
                f"{heartbeat_limit:g} s limit: its jobs are not being run"
            )
    if problems:
        detail["problems"] = problems
    return not problems, detail


# Gate runs that raised in a row before /readyz says the daemon is not ready.
GATE_FAILURES_NOT_READY = 3


def readiness_report(
    *,
    engines_loaded: bool,
    database_problem: str | None,
    pending: PendingPairs,
    gate_failures: int = 0,
    state_file_problem: str | None = None,
) -> tuple[bool, dict[str, Any]]:
    """/readyz: both engines loaded, the database reachable (`database_problem` None),
    fewer than `GATE_FAILURES_NOT_READY` failed gate runs in a row, and the state file
    production reads written at the last attempt."""
    problems: list[str] = []
    if not engines_loaded:
        problems.append("engines are not loaded")
    database = "reachable"
    if database_problem is not None:
        database = "unreachable"
        problems.append(f"database unreachable: {redact_text(database_problem)}")
    if gate_failures >= GATE_FAILURES_NOT_READY:
        problems.append(
            f"the last {gate_failures} gate runs failed: nothing is judged and the state "
            "file is no longer confirmed (see the gates.failed log)"
        )
    if state_file_problem is not None:
        problems.append(f"state file not written: {state_file_problem}")
    detail: dict[str, Any] = {
        "engines_loaded": engines_loaded,
        "database": database,
        "pending_pairs": len(pending),
        "lost_pairs": pending.dropped,
        "gate_failures_in_a_row": gate_failures,
        "state_file": "ok" if state_file_problem is None else "failing",
    }
    if problems:
        detail["problems"] = problems
    return not problems, detail
