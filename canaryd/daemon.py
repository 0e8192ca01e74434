"""The soak daemon's lifecycle: one owner for the store, engines, status server and scheduler.

`Daemon.start()` enters every component through one `ExitStack` — store, status server,
engines, the daemon run row, then the APScheduler jobs (pair cycle, gates, retention,
heartbeat) — and `Daemon.stop()` closes that stack, so SIGTERM, SIGINT, an error at
start-up and a test all take the same ordered path back out: stop scheduling, let the
in-flight pair finish (or drop it whole after `schedule.shutdown_timeout_s`), flush the
pairs buffered while the database was away, finish the run, close engines, stop HTTP,
close the store. `Daemon.reload()` (SIGHUP) validates a new configuration completely
before swapping it in. `serve_until_signalled` is the blocking main-thread loop behind
`canaryd run`.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import structlog
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_PAUSED, STATE_RUNNING
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from canaryd import paths, sdnotify
from canaryd.assembly import new_run, pair_params, prompt_sampler, resolve_prompts
from canaryd.config import Settings, load_settings
from canaryd.errors import CanarydError, DatabaseError, EngineError
from canaryd.http import StatusServer
from canaryd.logs import configure_logging
from canaryd.metrics import CanarydMetrics
from canaryd.records import ARMS, Arm, PairRecord, RunInfo
from canaryd.runner import PairRunner
from canaryd.sampling import StratifiedSampler
from canaryd.scoring import load_metrics
from canaryd.store import SqlStore
from canaryd.store.sql import make_engine
from engine.base import Engine
from engine.registry import build_engine

__all__ = [
    "CYCLE_JOB",
    "GATE_JOB",
    "HEARTBEAT_JOB",
    "RETENTION_JOB",
    "Daemon",
    "DatabaseProbe",
    "GateHook",
    "NoGates",
    "PendingPairs",
    "serve_until_signalled",
]

log = structlog.get_logger(__name__)

CYCLE_JOB = "pair-cycle"
GATE_JOB = "gates"
RETENTION_JOB = "retention"
HEARTBEAT_JOB = "heartbeat"
# Settings a running daemon cannot change: they are bound at start (socket, store).
RESTART_ONLY = ("storage.url", "server.listen")
_PROBE_TIMEOUT_S = 2
_PROBE_CACHE_S = 1.0  # /readyz scraped by several probes hits the database once a second


class GateHook(Protocol):
    """What the gate job calls on its interval; the gates/switch work plugs in here."""

    def evaluate(self, now: datetime) -> None: ...


class NoGates:
    """The default gate hook: nothing is evaluated."""

    def evaluate(self, now: datetime) -> None:
        return None


class PendingPairs:
    """Pairs waiting for the database, oldest first, at most `capacity`; when full, adding
    one drops the oldest, which is counted in `dropped`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pairs: deque[PairRecord] = deque()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._pairs)

    def add(self, record: PairRecord) -> PairRecord | None:
        """Queue `record`; return the pair dropped to make room, if any."""
        dropped = None
        if len(self._pairs) >= self.capacity:
            dropped = self._pairs.popleft()
            self.dropped += 1
        self._pairs.append(record)
        return dropped

    def oldest(self) -> PairRecord:
        return self._pairs[0]

    def remove_oldest(self) -> None:
        self._pairs.popleft()

    def resize(self, capacity: int) -> list[PairRecord]:
        """Change the capacity; return the oldest pairs dropped to fit it."""
        self.capacity = capacity
        dropped = []
        while len(self._pairs) > capacity:
            dropped.append(self._pairs.popleft())
            self.dropped += 1
        return dropped


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
                self._problem = " ".join(str(getattr(exc, "orig", exc)).split())
            finally:
                # A fresh connection every time: a pooled one would hide a dead server.
                self._engine.dispose()
            self._checked_at = time.monotonic()
            return self._problem

    def close(self) -> None:
        self._engine.dispose()


@dataclass(frozen=True, slots=True)
class _Plan:
    """Everything a cycle runs with; replaced whole by a reload, never mutated."""

    settings: Settings
    sampler: StratifiedSampler
    runner: PairRunner
    engines: dict[Arm, Engine]
    run: RunInfo


def max_cycle_age_s(settings: Settings) -> float:
    """/healthz's limit on the age of the last finished cycle."""
    configured = settings.server.max_cycle_age_s
    if configured is not None:
        return configured
    return 3 * settings.schedule.pair_interval_s + 2 * settings.prompts.timeout_s


def _interval(seconds: float, jitter_s: float = 0.0) -> IntervalTrigger:
    return IntervalTrigger(seconds=seconds, jitter=jitter_s or None)


class Daemon:
    """canaryd's soak loop as one object: `start()`, `stop()`, `reload()`, probes.

    `config_path` is what `reload()` reads (None: `CANARYD_CONFIG`, else defaults).
    `manage_logging` makes a reload re-apply the `logging` section (the CLI owns logging;
    an embedded daemon in a test or benchmark leaves it alone).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        config_path: Path | None = None,
        gates: GateHook | None = None,
        metrics: CanarydMetrics | None = None,
        manage_logging: bool = False,
    ) -> None:
        self.settings = settings
        self.config_path = config_path
        self.gates: GateHook = gates or NoGates()
        self.metrics = metrics or CanarydMetrics()
        self.manage_logging = manage_logging
        # Called with the Unix time on every heartbeat. Issue 5 adds sd_notify
        # ("WATCHDOG=1") here, so systemd restarts a daemon whose scheduler has died.
        self.heartbeat_hooks: list[Callable[[float], None]] = []
        self.pending = PendingPairs(settings.storage.buffer_pairs)
        self.abandoned = False  # True when shutdown left a pair generating (dropped whole)

        self._stack: contextlib.ExitStack | None = None
        self._store: SqlStore | None = None
        self._probe: DatabaseProbe | None = None
        self._server: StatusServer | None = None
        self._scheduler: BackgroundScheduler | None = None
        self._plan: _Plan | None = None
        self._engines: dict[Arm, Engine] = {}
        self._engines_loaded = False
        self._stopping = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._cycle_lock = threading.Lock()  # one cycle at a time; a reload swaps between
        self._save_lock = threading.Lock()  # saves, the flush and the store's close
        self._store_closed = False
        self._store_problem: str | None = None  # the last save's DatabaseError, until one works
        self._started_at = time.monotonic()
        self._last_cycle_at: float | None = None
        self.last_heartbeat: float | None = None
        self.cycles = 0

    # -- lifecycle --------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._stack is not None

    @property
    def address(self) -> str:
        """Where /metrics, /healthz and /readyz are served (`host:port`)."""
        if self._server is None:
            raise RuntimeError("the daemon is not started")
        return self._server.address

    @property
    def scheduler(self) -> BackgroundScheduler:
        if self._scheduler is None:
            raise RuntimeError("the daemon is not started")
        return self._scheduler

    @property
    def run_id(self) -> str:
        if self._plan is None:
            raise RuntimeError("the daemon is not started")
        return self._plan.run.run_id

    @property
    def engines(self) -> dict[Arm, Engine]:
        """The running engine of each arm."""
        return dict(self._engines)

    @property
    def store(self) -> SqlStore:
        if self._store is None:
            raise RuntimeError("the daemon is not started")
        return self._store

    def start(self, *, schedule: bool = True) -> None:
        """Open the store, serve HTTP, load the engines, record the run, start the jobs.

        Any failure closes what was already opened, in reverse order, and re-raises.
        `schedule=False` leaves the scheduler out (`run_cycle()` is then called directly,
        as the overhead benchmark does).
        """
        if self._stack is not None:
            raise RuntimeError("the daemon is already started")
        settings = self.settings
        # Validate prompts before touching anything: a bad suite fails start-up cheaply.
        sampler = prompt_sampler(settings, resolve_prompts(settings, None))
        with contextlib.ExitStack() as stack:
            # Scoring's modules take seconds to import: load them at start (so a missing
            # package fails here, not in the first pair), beside the engines' warm-up.
            loader = stack.enter_context(ThreadPoolExecutor(1, "canaryd-load-scoring"))
            scoring = loader.submit(load_metrics)
            self._stopping.clear()
            url = settings.storage.resolved_url()
            self._store = stack.enter_context(SqlStore.open(url, create=True))
            self._store_closed = False
            self._probe = DatabaseProbe(url)
            stack.callback(self._probe.close)
            stack.callback(self._close_store_for_good)

            self._server = StatusServer(
                settings.server.listen, self.metrics, self.health, self.ready
            )
            self._server.start()
            stack.callback(self._server.stop)

            self._engines = self._load_engines(settings, {})
            stack.callback(self._close_engines)
            plan = self._new_plan(settings, sampler, self._engines)
            scoring.result()
            self._store.create_run(plan.run)
            self._plan = plan
            stack.callback(self._finish)
            self._build_info(plan)
            log.info(
                "daemon.started",
                run_id=plan.run.run_id,
                address=self._server.address,
                database=self._store.url,
                categories=sampler.categories,
            )
            self._started_at = time.monotonic()
            if schedule:
                self._scheduler = self._start_scheduler(settings)
                stack.callback(self._stop_scheduler)
            self._stack = stack.pop_all()

    def stop(self) -> None:
        """Stop everything in order (idempotent); returns within about
        `schedule.shutdown_timeout_s` plus one flush of the buffered pairs."""
        stack, self._stack = self._stack, None
        if stack is None:
            return
        self._stopping.set()
        log.info("daemon.stopping")
        stack.close()
        log.info("daemon.stopped", abandoned_pair=self.abandoned)

    def __enter__(self) -> Daemon:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _load_engines(self, settings: Settings, reuse: dict[Arm, Engine]) -> dict[Arm, Engine]:
        """Engines for both arms: those in `reuse` as they are, the others built, loaded and
        warmed up; if one fails, those built here are closed again."""
        engines: dict[Arm, Engine] = {}
        with contextlib.ExitStack() as fresh:
            for arm in ARMS:
                if arm in reuse:
                    engines[arm] = reuse[arm]
                    continue
                engine = build_engine(getattr(settings.arms, arm), models_dir=paths.models_dir())
                fresh.callback(engine.close)
                log.info("engine.loading", arm=arm, identity=engine.identity)
                engine.load()
                engines[arm] = engine
            fresh.pop_all()
        for arm in ARMS:
            self.metrics.set_engine_ready(arm, True)
        self._engines_loaded = True
        return engines

    def _close_engines(self) -> None:
        self._engines_loaded = False
        for arm in ARMS:
            self.metrics.set_engine_ready(arm, False)
        if self.abandoned:
            return  # a pair is still generating on them; the process is about to exit
        for engine in self._engines.values():
            engine.close()

    def _new_plan(
        self,
        settings: Settings,
        sampler: StratifiedSampler,
        engines: dict[Arm, Engine],
        *,
        previous: RunInfo | None = None,
    ) -> _Plan:
        """A plan under a new run, or under `previous` when the config is unchanged (the
        runner must then stamp pairs with that run's id: a new one has no run row)."""
        if previous is not None and previous.config_hash == settings.config_hash():
            run = previous
        else:
            run = self._new_run(settings, engines)
        runner = PairRunner(
            engines["baseline"],
            engines["speculative"],
            run_id=run.run_id,
            seed=settings.prompts.seed,
            params=pair_params(settings),
        )
        return _Plan(settings, sampler, runner, engines, run)

    def _new_run(self, settings: Settings, engines: dict[Arm, Engine]) -> RunInfo:
        return new_run(settings, "daemon", engines["baseline"], engines["speculative"])

    def _build_info(self, plan: _Plan) -> None:
        software = plan.run.software
        self.metrics.set_build_info(
            version=software.get("canaryd", "unknown"),
            python=software.get("python", "unknown"),
            torch=software.get("torch", "absent"),
            transformers=software.get("transformers", "absent"),
            baseline=plan.run.baseline_identity,
            speculative=plan.run.speculative_identity,
        )

    def _start_scheduler(self, settings: Settings) -> BackgroundScheduler:
        schedule = settings.schedule
        scheduler = BackgroundScheduler(
            timezone=UTC,
            job_defaults={
                "max_instances": 1,
                "coalesce": True,
                "misfire_grace_time": max(1, round(schedule.misfire_grace_s)),
            },
        )
        now = datetime.now(UTC)
        scheduler.add_job(
            self.run_cycle,
            _interval(schedule.pair_interval_s, schedule.jitter_s),
            id=CYCLE_JOB,
            next_run_time=now,  # the first cycle starts at once, not one interval later
        )
        scheduler.add_job(self.evaluate_gates, _interval(schedule.gate_interval_s), id=GATE_JOB)
        scheduler.add_job(
            self.apply_retention,
            _interval(schedule.retention_interval_s),
            id=RETENTION_JOB,
            next_run_time=now,
        )
        scheduler.add_job(
            self.heartbeat, _interval(schedule.heartbeat_interval_s), id=HEARTBEAT_JOB,
            next_run_time=now,
        )  # fmt: skip
        scheduler.start()
        return scheduler

    def _stop_scheduler(self) -> None:
        """No new cycles; wait up to the shutdown timeout for the in-flight one."""
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is None:
            return
        # wait=False: APScheduler would wait for ever; the bound is ours to enforce.
        scheduler.shutdown(wait=False)
        timeout = self.settings.schedule.shutdown_timeout_s
        if not self._idle.wait(timeout):
            with self._save_lock:
                self.abandoned = True
            log.warning(
                "shutdown.pair_dropped",
                reason=f"the in-flight pair did not finish within {timeout:g} s; it is "
                "dropped whole (no generation of it is stored)",
            )

    def _finish(self) -> None:
        """Flush the buffer once and mark the run finished (best effort: the DB may be away)."""
        self._flush_pending(final=True)
        if self._plan is None:
            return
        try:
            with self._save_lock:
                self.store.finish_run(self._plan.run.run_id, datetime.now(UTC))
        except DatabaseError as exc:
            self.metrics.store_error("finish_run")
            log.error("run.finish_failed", run_id=self._plan.run.run_id, reason=str(exc))

    def _close_store_for_good(self) -> None:
        with self._save_lock:
            self._store_closed = True

    # -- jobs -------------------------------------------------------------------------

    def run_cycle(self) -> None:
        """One pair cycle: retry the buffered pairs, then run and store `pairs_per_cycle`."""
        with self._cycle_lock:
            self._idle.clear()
            started = time.monotonic()
            try:
                if self._stopping.is_set() or self._plan is None:
                    return
                interval = self._plan.settings.schedule.pair_interval_s
                ok = self._cycle(self._plan)
            except Exception:
                # A bug in one cycle must not stop the soak; it is logged and counted.
                log.exception("cycle.failed")
                ok, interval = False, self.settings.schedule.pair_interval_s
            finally:
                self._idle.set()
            self._last_cycle_at = time.monotonic()
            self.cycles += 1
            self.metrics.cycle_finished(time.time(), ok)
            took = self._last_cycle_at - started
            if took > interval:
                # APScheduler skips (coalesces) the runs this one overlapped; say so once.
                log.warning(
                    "cycle.overrun",
                    took_s=round(took, 3),
                    pair_interval_s=interval,
                    reason="a cycle took longer than the pair interval; cycles run back to "
                    "back, fewer than configured",
                )

    def _cycle(self, plan: _Plan) -> bool:
        db_away = not self._flush_pending()
        ok = not db_away
        include_text = plan.settings.logging.include_text
        for prompt in plan.sampler.take(plan.settings.schedule.pairs_per_cycle):
            if self._stopping.is_set():
                break  # stop scheduling new pairs; the one that finished is stored
            record = plan.runner.run_pair(prompt)
            self.metrics.observe_pair(record)
            if include_text:
                log.info(
                    "pair.text",
                    pair_id=record.pair_id,
                    prompt_text=[m.content for m in prompt.messages],
                    baseline_text=record.baseline.text,
                    speculative_text=record.speculative.text,
                )
            if db_away:
                with self._save_lock:  # a reload may resize the buffer meanwhile
                    self._buffer(record)  # keep the order: it goes after the pairs waiting
                continue
            if not self._save(record):
                db_away, ok = True, False
        return ok

    def _save(self, record: PairRecord) -> bool:
        """Store one pair; on `DatabaseError` buffer it. False when it was buffered."""
        with self._save_lock:
            if self._store_closed or self.abandoned:
                log.warning("pair.dropped", pair_id=record.pair_id, reason="shutting down")
                return True
            try:
                self.store.save_pair(record)
            except DatabaseError as exc:
                self._database_failed(exc)
                self._buffer(record)
                return False
            self._database_back()
            return True

    def _buffer(self, record: PairRecord) -> None:
        dropped = self.pending.add(record)
        if dropped is not None:
            self.metrics.store_error("pair_dropped")
            log.error(
                "pair.lost",
                pair_id=dropped.pair_id,
                reason=f"the database has been away for {self.pending.capacity} pairs; "
                "the oldest buffered pair is dropped",
                lost_total=self.pending.dropped,
            )
        self.metrics.pending_pairs(len(self.pending))

    def _flush_pending(self, *, final: bool = False) -> bool:
        """Save buffered pairs oldest first, stopping at the first failure; True when the
        buffer is empty afterwards."""
        with self._save_lock:
            if self._store_closed:
                return not self.pending
            saved = 0
            while self.pending:
                record = self.pending.oldest()
                try:
                    self.store.save_pair(record)
                except DatabaseError as exc:
                    self._database_failed(exc)
                    break
                self.pending.remove_oldest()
                saved += 1
            if saved:
                self._database_back()
                log.info("pending.flushed", saved=saved, still_pending=len(self.pending))
            self.metrics.pending_pairs(len(self.pending))
            if final and self.pending:
                log.error(
                    "pending.lost",
                    pairs=len(self.pending),
                    reason="the database is still unreachable at shutdown",
                )
            return not self.pending

    def _database_failed(self, exc: DatabaseError) -> None:
        self.metrics.store_error("save_pair")
        if self._store_problem is None:
            log.error("database.unreachable", reason=str(exc), pending=len(self.pending))
        self._store_problem = str(exc)

    def _database_back(self) -> None:
        if self._store_problem is not None:
            log.info("database.reachable", pending=len(self.pending))
        self._store_problem = None

    def evaluate_gates(self) -> None:
        """The gate job: hand the gates the current time (they read everything else)."""
        try:
            self.gates.evaluate(datetime.now(UTC))
        except Exception:
            log.exception("gates.failed")

    def apply_retention(self) -> None:
        """The retention job: roll up and remove old rows, if the store supports it."""
        apply: Callable[..., Any] | None = getattr(self._store, "apply_retention", None)
        if apply is None:
            log.debug("retention.unsupported")
            return
        storage = self.settings.storage
        try:
            report = apply(datetime.now(UTC), storage.raw_retention_days,
                           storage.rollup_retention_days)  # fmt: skip
        except DatabaseError as exc:
            self.metrics.store_error("retention")
            log.error("retention.failed", reason=str(exc))
            return
        log.info("retention.done", report=repr(report))

    def heartbeat(self) -> None:
        """The heartbeat job: proves the scheduler is alive to metrics and watchdogs."""
        now = time.time()
        self.last_heartbeat = now
        self.metrics.heartbeat(now)
        for hook in self.heartbeat_hooks:
            try:
                hook(now)
            except Exception:
                log.exception("heartbeat.hook_failed")

    # -- probes -----------------------------------------------------------------------

    def last_cycle_age_s(self) -> float:
        """Seconds since the last cycle finished (since start, before the first)."""
        since = self._last_cycle_at if self._last_cycle_at is not None else self._started_at
        return time.monotonic() - since

    def health(self) -> tuple[bool, dict[str, Any]]:
        """/healthz: the scheduler runs and the last cycle is recent enough."""
        problems: list[str] = []
        scheduler = self._scheduler
        state = {STATE_RUNNING: "running", STATE_PAUSED: "paused"}.get(
            scheduler.state if scheduler is not None else -1, "stopped"
        )
        if state != "running":
            problems.append(f"scheduler is {state}")
        age, limit = self.last_cycle_age_s(), max_cycle_age_s(self.settings)
        if age > limit:
            problems.append(f"last cycle finished {age:.1f} s ago, over the {limit:g} s limit")
        detail: dict[str, Any] = {
            "scheduler": state,
            "last_cycle_age_s": round(age, 3),
            "max_cycle_age_s": limit,
            "cycles": self.cycles,
        }
        if problems:
            detail["problems"] = problems
        return not problems, detail

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """/readyz: both engines loaded and the database reachable."""
        problems: list[str] = []
        if not self._engines_loaded:
            problems.append("engines are not loaded")
        database = "reachable"
        reason = self._probe.check() if self._probe is not None else "store is not open"
        reason = reason or self._store_problem
        if reason is not None:
            database = "unreachable"
            problems.append(f"database unreachable: {reason}")
        detail: dict[str, Any] = {
            "engines_loaded": self._engines_loaded,
            "database": database,
            "pending_pairs": len(self.pending),
            "lost_pairs": self.pending.dropped,
        }
        if problems:
            detail["problems"] = problems
        return not problems, detail

    # -- reload -----------------------------------------------------------------------

    def reload(self) -> bool:
        """Re-read the config file and suites; swap them in only if all of it is valid.

        Engines are rebuilt (and warmed up) only for arms whose config changed; a changed
        configuration starts a new daemon run row so every pair names the config it ran
        under. On any error the old configuration stays and the reason is logged.
        """
        old = self._plan
        if old is None or self._stack is None:
            raise RuntimeError("the daemon is not started")
        try:
            new = self._keep_restart_only(load_settings(self.config_path), old.settings)
            sampler = prompt_sampler(new, resolve_prompts(new, None))
        except (CanarydError, EngineError, ValueError) as exc:
            log.error("config.reload_failed", reason=str(exc), kept=old.run.config_hash)
            return False
        reuse = {
            arm: old.engines[arm]
            for arm in ARMS
            if getattr(new.arms, arm) == getattr(old.settings.arms, arm)
        }
        replaced = [arm for arm in ARMS if arm not in reuse]
        engines: dict[Arm, Engine] = dict(reuse)
        try:
            engines = self._load_engines(new, reuse)
            plan = self._new_plan(new, sampler, engines, previous=old.run)
            if plan.run is not old.run:
                with self._save_lock:
                    self.store.create_run(plan.run)
        except Exception as exc:
            # Any error, not only ours: a model directory transformers cannot read raises
            # OSError, a GPU without room for the new model a RuntimeError. A reload must
            # never take the running daemon down with it.
            for arm in replaced:
                if arm in engines and engines[arm] is not old.engines[arm]:
                    engines[arm].close()
            self._engines_loaded = True  # the old engines still are
            log.error(
                "config.reload_failed",
                reason=str(exc) or type(exc).__name__,
                kept=old.run.config_hash,
                exc_info=not isinstance(exc, (CanarydError, EngineError)),
            )
            return False
        with self._cycle_lock:
            self._plan = plan
            self._engines = engines
            self.settings = new
        for arm in replaced:
            old.engines[arm].close()
        if plan.run is not old.run:
            try:
                with self._save_lock:
                    self.store.finish_run(old.run.run_id, datetime.now(UTC))
            except DatabaseError as exc:
                log.error("run.finish_failed", run_id=old.run.run_id, reason=str(exc))
            self._build_info(plan)
        with self._save_lock:  # the cycle thread buffers under the same lock
            dropped = self.pending.resize(new.storage.buffer_pairs)
        for record in dropped:
            self.metrics.store_error("pair_dropped")
            log.error("pair.lost", pair_id=record.pair_id, reason="buffer_pairs reduced")
        self._reschedule(old.settings, new)
        if self.manage_logging:
            configure_logging(new.logging)
        log.info(
            "config.reloaded",
            run_id=plan.run.run_id,
            config_hash=plan.run.config_hash,
            engines_rebuilt=replaced,
            categories=sampler.categories,
        )
        return True

    def _keep_restart_only(self, new: Settings, old: Settings) -> Settings:
        changed = []
        if new.storage.url != old.storage.url:
            changed.append("storage.url")
        if new.server.listen != old.server.listen:
            changed.append("server.listen")
        if changed:
            log.warning(
                "config.restart_required",
                keys=changed,
                reason="these settings apply at start only; the running values are kept",
            )
        return new.model_copy(
            update={
                "storage": new.storage.model_copy(update={"url": old.storage.url}),
                "server": new.server.model_copy(update={"listen": old.server.listen}),
            }
        )

    def _reschedule(self, old: Settings, new: Settings) -> None:
        scheduler = self._scheduler
        if scheduler is None or old.schedule == new.schedule:
            return
        s = new.schedule
        scheduler.reschedule_job(CYCLE_JOB, trigger=_interval(s.pair_interval_s, s.jitter_s))
        scheduler.reschedule_job(GATE_JOB, trigger=_interval(s.gate_interval_s))
        scheduler.reschedule_job(RETENTION_JOB, trigger=_interval(s.retention_interval_s))
        scheduler.reschedule_job(HEARTBEAT_JOB, trigger=_interval(s.heartbeat_interval_s))
        grace = max(1, round(s.misfire_grace_s))
        for job_id in (CYCLE_JOB, GATE_JOB, RETENTION_JOB, HEARTBEAT_JOB):
            scheduler.modify_job(job_id, misfire_grace_time=grace)


# -- the main-thread loop ---------------------------------------------------------------


@contextlib.contextmanager
def _signals_to(queue_: queue.SimpleQueue[int]) -> Iterator[None]:
    """Route SIGTERM, SIGINT and SIGHUP into `queue_` while inside; restore after."""
    wanted = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def handler(signum: int, _frame: FrameType | None) -> None:
        queue_.put(signum)  # SimpleQueue.put is safe from a signal handler

    previous = {sig: signal.signal(sig, handler) for sig in wanted}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def serve_until_signalled(
    daemon: Daemon, *, poll_s: float = 0.5, on_ready: Callable[[], None] | None = None
) -> int:
    """Block the main thread until SIGTERM or SIGINT, reloading on SIGHUP; return 0.

    Signals only set a flag-like queue entry; the stop and the reload run here, in the
    main thread, never inside a handler. `on_ready` runs once the handlers are in place:
    telling systemd READY=1 before that would let an early `systemctl reload` (SIGHUP's
    default action) kill the process.
    """
    signals: queue.SimpleQueue[int] = queue.SimpleQueue()
    with _signals_to(signals):
        if on_ready is not None:
            on_ready()
        while True:
            try:
                signum = signals.get(timeout=poll_s)
            except queue.Empty:
                continue
            if signum == signal.SIGHUP:
                log.info("signal.received", signal="SIGHUP")
                sdnotify.reloading()
                try:
                    daemon.reload()
                except Exception:
                    # The running configuration is intact; a failed reload is no reason
                    # to leave without stopping in order.
                    log.exception("config.reload_failed")
                sdnotify.ready("configuration reloaded")
                continue
            log.info("signal.received", signal=signal.Signals(signum).name)
            break
        sdnotify.stopping()
        daemon.stop()
    return 0
