"""The soak daemon's lifecycle: one owner for the store, engines, status server and scheduler.

`Daemon.start()` enters every component through one `ExitStack` — store, the gate hook's
start (the switch state file is written from the database before anything that can fail
on a GPU or a model), status server (with the verdict endpoints), engines, the daemon run
row, then the APScheduler jobs (pair cycle, gates, retention, heartbeat) — and
`Daemon.stop()` closes that stack, so SIGTERM, SIGINT, an error at start-up and a test all
take the same ordered path back out: stop scheduling, let the in-flight pair finish (or
drop it whole after `schedule.shutdown_timeout_s`), flush the pairs buffered while the
database was away, finish the run, close engines, stop HTTP, close the store.
`Daemon.reload()` (SIGHUP) validates a new configuration completely before swapping it in.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import structlog
from apscheduler.schedulers.background import BackgroundScheduler

from canaryd import paths
from canaryd.config import Settings, load_settings
from canaryd.daemon.buffer import PairWriter, PendingPairs
from canaryd.daemon.health import DatabaseProbe, health_report, max_stall_s, readiness_report
from canaryd.daemon.parity import ParityJob
from canaryd.daemon.scheduling import pace_cycles, reschedule, start_scheduler
from canaryd.errors import CanarydError, DatabaseError, EngineError
from canaryd.judging.verdict import VerdictService
from canaryd.logs import configure_logging
from canaryd.metrics import CanarydMetrics
from canaryd.pairs.plan import (
    arm_names,
    new_run,
    pair_params,
    prompt_sampler,
    resolve_prompts,
    speculative_engines,
)
from canaryd.pairs.runner import OwnSampling, PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.scoring import load_metrics
from canaryd.server.app import StatusServer
from canaryd.server.rollout import ProgressiveDelivery
from canaryd.store import SqlStore, Store
from canaryd.switch.statefile import read_state_file
from canaryd.traffic import LiveSampler, SamplingBounds, TrafficSink
from canaryd.traffic.live import SourceMix, live_prompt, own_sampling, stored_record
from canaryd.traffic.mix import WindowMix
from engine.base import Engine
from engine.registry import build_engine
from gates.records import BASELINE_ARM, PairSource, Prompt, RunInfo

__all__ = ["RESTART_ONLY", "Daemon", "GateHook", "NoGates"]

log = structlog.get_logger(__name__)

# Settings a running daemon cannot change: they are bound at start (socket, store). The
# mirror sink's other settings (bounds, token, key) also apply at the next start;
# traffic.live_share and traffic.store_text apply at once.
RESTART_ONLY = ("storage.url", "server.listen", "traffic.listen")


FINISH_WAIT_S = 2.0  # how long shutdown waits to store the buffer and the run's end


class GateHook(Protocol):
    """What the gate job calls on its interval; the gates/switch work plugs in here.
    `start` runs once the store is open and before the engines load; `role` is this
    daemon's part among those on one database (`leader`, `follower`), and
    `state_file_problem` why the state file could not be written, both for /readyz."""

    def start(self) -> None: ...

    def evaluate(self, now: datetime) -> None: ...

    def role(self) -> str: ...

    def state_file_problem(self) -> str | None: ...

    @property
    def suspicion(self) -> float | None:
        """The largest progress of an undecided enforce detector at the last gate run
        this daemon led (None: not leading, or nothing evaluated)."""
        ...


class NoGates:
    """The default gate hook: nothing is evaluated."""

    def start(self) -> None:
        return None

    def evaluate(self, now: datetime) -> None:
        return None

    def state_file_problem(self) -> str | None:
        return None

    def role(self) -> str:
        return "none"

    @property
    def suspicion(self) -> float | None:
        return None


@dataclass(frozen=True, slots=True)
class _Plan:
    """Everything a cycle runs with; replaced whole by a reload, never mutated."""

    settings: Settings
    sampler: StratifiedSampler
    runner: PairRunner
    engines: dict[str, Engine]  # by arm name: baseline, the switch's arm, comparison arms
    run: RunInfo


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
        # Called with the Unix time on every heartbeat while cycles progress: systemd's
        # watchdog is fed from here, so a daemon whose scheduler has died, or whose cycle
        # is wedged in a generation or a check, is restarted.
        self.heartbeat_hooks: list[Callable[[float], None]] = []
        self._pairs = PairWriter(settings.storage.buffer_pairs, self.metrics)

        self._stack: contextlib.ExitStack | None = None
        self._store: Store | None = None
        self._probe: DatabaseProbe | None = None
        self._server: StatusServer | None = None
        self._scheduler: BackgroundScheduler | None = None
        self._pair_interval_s = settings.schedule.pair_interval_s  # the pace now
        self._plan: _Plan | None = None
        self._engines: dict[str, Engine] = {}
        self._engines_loaded = False
        self._stopping = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._cycle_lock = threading.Lock()  # one cycle at a time; a reload swaps between
        self._started_at = time.monotonic()
        self._last_cycle_at: float | None = None
        # A cycle starting, a pair finishing, a cycle finishing: the soak is not wedged.
        self._progress_at = self._started_at
        self._stalled = False
        self.last_heartbeat: float | None = None
        self.cycles = 0
        self.gate_failures = 0  # gate runs that raised in a row
        self._parity = ParityJob(self.metrics)
        self._traffic: LiveSampler | None = None  # with [traffic] listen: the live queue
        self._sink: TrafficSink | None = None
        self._mix = SourceMix()

    # -- lifecycle --------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._stack is not None

    @property
    def pending(self) -> PendingPairs:
        """The pairs waiting for the database."""
        return self._pairs.pending

    @property
    def abandoned(self) -> bool:
        """True when shutdown left a pair generating (dropped whole)."""
        return self._pairs.abandoned

    @property
    def address(self) -> str:
        """Where /metrics, /healthz and /readyz are served (`host:port`)."""
        if self._server is None:
            raise RuntimeError("the daemon is not started")
        return self._server.address

    @property
    def traffic(self) -> LiveSampler | None:
        """The sampled live requests waiting for a pair (None without a mirror sink)."""
        return self._traffic

    @property
    def traffic_address(self) -> str:
        """Where the mirror sink listens (`host:port`)."""
        if self._sink is None:
            raise RuntimeError("the daemon serves no mirror sink (no [traffic] listen)")
        return self._sink.address

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
    def engines(self) -> dict[str, Engine]:
        """The running engine of each arm, by name."""
        return dict(self._engines)

    @property
    def store(self) -> Store:
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
        # Scoring's modules load at start so that a missing package fails here, not in the
        # first pair. In this thread, before anything else starts: they import transformers'
        # lazy module too, and two threads racing through its first import see it
        # half-initialised (`cannot import name 'AutoModelForCausalLM'`).
        load_metrics()
        with contextlib.ExitStack() as stack:
            self._stopping.clear()
            url = settings.storage.resolved_url()
            self._store = stack.enter_context(SqlStore.open(url, create=True))
            self._pairs.open(self._store)
            self._probe = DatabaseProbe(url)
            stack.callback(self._probe.close)
            stack.callback(self._pairs.close)
            # Production may have no state file at all (/run is emptied at boot): write
            # the stored switch state before the engines, which may never load.
            self.gates.start()

            # /v1/verdict and the Flagger webhooks judge from the database on their own
            # connection, with the settings of the moment (a reload's apply).
            verdicts = VerdictService(lambda: self.settings)
            stack.callback(verdicts.close)
            self._server = StatusServer(
                settings.server.listen,
                self.metrics,
                self.health,
                self.ready,
                self.switch_file,
                ProgressiveDelivery(verdicts),
                token=(
                    settings.server.auth_token.get_secret_value()
                    if settings.server.auth_token is not None
                    else None
                ),
            )
            self._server.start()
            stack.callback(self._server.stop)
            if settings.traffic.enabled:
                self._start_sink(settings)
                stack.callback(self._stop_sink)

            self._engines = self._load_engines(settings, {})
            stack.callback(self._close_engines)
            plan = self._new_plan(settings, sampler, self._engines)
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
            self._started_at = self._progress_at = time.monotonic()
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

    def _start_sink(self, settings: Settings) -> None:
        """The mirror sink and its sampler; what it receives waits for the pair cycles."""
        self._traffic = LiveSampler(
            SamplingBounds.of(settings.traffic),
            seed=settings.prompts.seed,
            observe=self.metrics.traffic_request,
            on_window=self._traffic_mix,
        )
        self._sink = TrafficSink(settings.traffic, self._traffic)
        self._sink.start()

    def _stop_sink(self) -> None:
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.stop()

    def _traffic_mix(self, mix: WindowMix) -> None:
        self.metrics.traffic_mix(mix.shares, mix.prompt_chars, mix.repetition)

    def _load_engines(self, settings: Settings, reuse: dict[str, Engine]) -> dict[str, Engine]:
        """Engines for every arm: those in `reuse` as they are, the others built, loaded
        and warmed up; if one fails, those built here are closed again."""
        engines: dict[str, Engine] = {}
        with contextlib.ExitStack() as fresh:
            for arm in arm_names(settings):
                if arm in reuse:
                    engines[arm] = reuse[arm]
                    continue
                engine = build_engine(settings.arms.arm(arm), models_dir=paths.models_dir())
                fresh.callback(engine.close)
                log.info("engine.loading", arm=arm, identity=engine.identity)
                engine.load()
                engines[arm] = engine
            fresh.pop_all()
        self.metrics.set_arms(engines)
        for arm in engines:
            self.metrics.set_engine_ready(arm, True)
        self._engines_loaded = True
        return engines

    def _close_engines(self) -> None:
        self._engines_loaded = False
        for arm in self._engines:
            self.metrics.set_engine_ready(arm, False)
        if self.abandoned:
            return  # a pair is still generating on them; the process is about to exit
        for engine in self._engines.values():
            engine.close()

    def _new_plan(
        self,
        settings: Settings,
        sampler: StratifiedSampler,
        engines: dict[str, Engine],
        *,
        previous: RunInfo | None = None,
    ) -> _Plan:
        """A plan under a new run, or under `previous` when the config is unchanged (the
        runner must then stamp pairs with that run's id: a new one has no run row)."""
        if previous is not None and previous.config_hash == settings.config_hash():
            run = previous
        else:
            run = self._new_run(settings, engines)
        self.metrics.tie_margin_nats = settings.gates.quality.tie_margin_nats
        runner = PairRunner(
            engines[BASELINE_ARM],
            speculative_engines(engines),
            run_id=run.run_id,
            seed=settings.prompts.seed,
            params=pair_params(settings),
        )
        return _Plan(settings, sampler, runner, engines, run)

    def _new_run(self, settings: Settings, engines: dict[str, Engine]) -> RunInfo:
        return new_run(settings, "daemon", engines)

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
        self._pair_interval_s = settings.schedule.pair_interval_s
        self.metrics.pair_interval.set(self._pair_interval_s)
        return start_scheduler(
            settings.schedule,
            cycle=self.run_cycle,
            gates=self.evaluate_gates,
            retention=self.apply_retention,
            heartbeat=self.heartbeat,
            probe=self.run_probe,
        )

    def _stop_scheduler(self) -> None:
        """No new cycles; wait up to the shutdown timeout for the in-flight one."""
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is None:
            return
        # wait=False: APScheduler would wait for ever; the bound is ours to enforce.
        scheduler.shutdown(wait=False)
        timeout = self.settings.schedule.shutdown_timeout_s
        if not self._idle.wait(timeout):
            self._pairs.abandon()
            log.warning(
                "shutdown.pair_dropped",
                reason=f"the in-flight pair did not finish within {timeout:g} s; it is "
                "dropped whole (no generation of it is stored)",
            )

    def _finish(self) -> None:
        """Flush the buffer once and mark the run finished, best effort and bounded: on a
        database that does not answer (no client-side timeout ends a read from a frozen
        server) shutdown gives up after `FINISH_WAIT_S` and the run stays unfinished, as
        after a crash."""
        finisher = threading.Thread(target=self._finish_run, name="canaryd-finish", daemon=True)
        finisher.start()
        finisher.join(FINISH_WAIT_S)
        if finisher.is_alive():
            log.warning(
                "run.not_finished",
                reason=f"the database did not answer within {FINISH_WAIT_S:g} s; the "
                "buffered pairs and the run's end are not stored",
            )

    def _finish_run(self) -> None:
        self._pairs.flush(final=True)
        if self._plan is None:
            return
        try:
            with self._pairs.lock:
                self.store.finish_run(self._plan.run.run_id, datetime.now(UTC))
        except DatabaseError as exc:
            self.metrics.store_error("finish_run")
            log.error("run.finish_failed", run_id=self._plan.run.run_id, reason=str(exc))

    # -- jobs -------------------------------------------------------------------------

    def run_cycle(self) -> None:
        """One pair cycle: retry the buffered pairs, then run and store `pairs_per_cycle`."""
        with self._cycle_lock:
            self._idle.clear()
            started = self._progress_at = time.monotonic()
            try:
                if self._stopping.is_set() or self._plan is None:
                    return
                interval = self._pair_interval_s
                ok = self._cycle(self._plan)
            except Exception:
                # A bug in one cycle must not stop the soak; it is logged and counted.
                log.exception("cycle.failed")
                ok, interval = False, self._pair_interval_s
            finally:
                self._idle.set()
            self._last_cycle_at = self._progress_at = time.monotonic()
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

    def _next_pair(self, plan: _Plan) -> tuple[Prompt, OwnSampling | None, PairSource]:
        """The next prompt, its own sampling (live requests') and its source: a live
        request for `traffic.live_share` of the pairs while any wait, else a suite's."""
        live = self._traffic
        share = plan.settings.traffic.live_share
        if live is not None and self._mix.next_is_live(share, live.waiting() > 0):
            request = live.take()
            self.metrics.traffic_queue.set(len(live))
            if request is not None:
                return live_prompt(request), own_sampling(request), "live"
        return plan.sampler.next(), None, "control"

    def _cycle(self, plan: _Plan) -> bool:
        db_away = not self._pairs.flush()
        ok = not db_away
        include_text = plan.settings.logging.include_text
        store_text = plan.settings.traffic.store_text
        for _ in range(plan.settings.schedule.pairs_per_cycle):
            if self._stopping.is_set():
                break  # stop scheduling new pairs; the one that finished is stored
            prompt, sampling, source = self._next_pair(plan)
            group = plan.runner.run_group(prompt, sampling=sampling, source=source)
            self._progress_at = time.monotonic()
            try:
                self.metrics.observe_group(group.records)
            except Exception:
                # Nothing an engine sends may cost the pair: it is stored all the same.
                log.exception("pair.metrics_failed", group_id=group.group_id)
            for measured in group.records:
                # A live pair keeps no text unless traffic.store_text says so; its
                # scores were computed on the whole pair already.
                record = stored_record(measured, store_text=store_text)
                if include_text and source == "control":  # a live pair's text: never
                    log.info(
                        "pair.text",
                        pair_id=record.pair_id,
                        arm=record.arm,
                        prompt_text=[m.content for m in prompt.messages],
                        baseline_text=record.baseline.text,
                        speculative_text=record.speculative.text,
                    )
                if db_away:
                    self._pairs.buffer(record)  # keep the order: after the pairs waiting
                    continue
                if not self._pairs.save(record):
                    db_away, ok = True, False
        return ok

    def evaluate_gates(self) -> None:
        """The gate job: hand the gates the current time (they read everything else).

        A run that raises judged nothing and confirmed nothing: it is counted, and after
        `GATE_FAILURES_NOT_READY` in a row /readyz answers 503 (the state file's
        `confirmed_at` ages meanwhile, so a router turns speculation off)."""
        try:
            self.gates.evaluate(datetime.now(UTC))
        except Exception as exc:
            self.gate_failures += 1
            self.metrics.gate_run_finished(time.time(), ok=False)
            log.exception(
                "gates.failed",
                consecutive_failures=self.gate_failures,
                reason=f"{type(exc).__name__}: {exc}",
            )
        else:
            self.gate_failures = 0
            self.metrics.gate_run_finished(time.time(), ok=True)
        self._pace()

    def _pace(self) -> None:
        """Adaptive pair rate: while an enforce detector is past `speed_up_at` of its
        threshold and undecided, pairs run at `max_pairs_per_minute`, so that a suspected
        fault is decided in minutes, not hours; back to `pair_interval_s` once it decides
        (the evidence restarts) or fades."""
        schedule = self.settings.schedule
        interval = schedule.pair_interval_s
        progress = self.gates.suspicion
        if (
            schedule.max_pairs_per_minute is not None
            and progress is not None
            and progress >= schedule.speed_up_at
        ):
            interval = min(interval, 60.0 / schedule.max_pairs_per_minute)
        if interval == self._pair_interval_s:
            return
        log.info(
            "schedule.pace",
            pair_interval_s=interval,
            was_s=self._pair_interval_s,
            detector_progress=None if progress is None else round(progress, 3),
            reason="an enforce detector is past speed_up_at of its threshold"
            if interval < schedule.pair_interval_s
            else "no undecided detector past speed_up_at",
        )
        self._pair_interval_s = interval
        self.metrics.pair_interval.set(interval)
        if self._scheduler is not None:
            pace_cycles(self._scheduler, schedule, interval)

    def run_probe(self) -> None:
        """The probe job (canaryd.daemon.parity): between cycles, so that its burst and
        long prompts never weigh on a pair's latency; each capability counts as progress."""
        with self._cycle_lock:
            if self._stopping.is_set() or self._plan is None:
                return
            try:
                self._parity.run(
                    self._plan.settings, self._engines, self.store, on_progress=self._progressed
                )
            except Exception:
                log.exception("probe.crashed")  # a bug in the probe must not stop the soak

    def _progressed(self) -> None:
        self._progress_at = time.monotonic()

    def apply_retention(self) -> None:
        """The retention job: roll up and remove old rows; erase live text older than
        `retention.live_text_days` (kept only with `traffic.store_text`)."""
        settings = self.settings
        storage = settings.storage
        now = datetime.now(UTC)
        try:
            report = self.store.apply_retention(
                now, storage.raw_retention_days, storage.rollup_retention_days
            )
            erased = self.store.erase_live_text(
                now - timedelta(days=settings.retention.live_text_days)
            )
        except DatabaseError as exc:
            self.metrics.store_error("retention")
            log.error("retention.failed", reason=str(exc))
            return
        log.info("retention.done", report=repr(report), live_generations_erased=erased)

    def heartbeat(self) -> None:
        """The heartbeat job: proves the scheduler is alive to metrics and, while cycles
        progress, to the watchdogs (`heartbeat_hooks`)."""
        now = time.time()
        self.last_heartbeat = now
        self.metrics.heartbeat(now)
        if not self.progressing():
            return
        for hook in self.heartbeat_hooks:
            try:
                hook(now)
            except Exception:
                log.exception("heartbeat.hook_failed")

    # -- probes -----------------------------------------------------------------------

    def progressing(self) -> bool:
        """Whether the soak made progress within `max_stall_s`; logs once when it stops
        (a generation or a check is stuck: the watchdog is no longer fed) and resumes."""
        age, limit = self.last_progress_age_s(), max_stall_s(self.settings)
        stalled = age > limit
        if stalled and not self._stalled:
            log.error(
                "cycle.stalled",
                last_progress_age_s=round(age, 1),
                max_stall_s=limit,
                reason="no pair has finished and no cycle started or ended within the "
                "limit: a generation or a check is stuck; systemd's watchdog is no longer "
                "fed and will restart canaryd",
            )
        elif self._stalled and not stalled:
            log.info("cycle.progressing", last_progress_age_s=round(age, 1))
        self._stalled = stalled
        return not stalled

    def last_progress_age_s(self) -> float:
        """Seconds since a cycle started, a pair finished or a cycle finished."""
        return time.monotonic() - self._progress_at

    def last_cycle_age_s(self) -> float:
        """Seconds since the last cycle finished (since start, before the first)."""
        since = self._last_cycle_at if self._last_cycle_at is not None else self._started_at
        return time.monotonic() - since

    def switch_file(self) -> dict[str, Any] | None:
        """What production reads, for `/v1/switch`: the state file's object (None while
        it is missing or unreadable)."""
        return read_state_file(self.settings.switch.resolved_state_file())

    def health(self) -> tuple[bool, dict[str, Any]]:
        """/healthz: the scheduler runs and the last cycle is recent enough."""
        return health_report(
            self._scheduler,
            self.last_cycle_age_s(),
            self.settings,
            self.cycles,
            progress_age_s=self.last_progress_age_s(),
        )

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """/readyz: both engines loaded and the database reachable; and this daemon's
        role (a follower is ready too: it measures, another daemon gates)."""
        reason = self._probe.check() if self._probe is not None else "store is not open"
        ok, detail = readiness_report(
            engines_loaded=self._engines_loaded,
            database_problem=reason or self._pairs.problem,
            pending=self.pending,
            gate_failures=self.gate_failures,
            state_file_problem=self.gates.state_file_problem(),
        )
        return ok, {**detail, "switch_role": self.gates.role()}

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
            arm: engine
            for arm, engine in old.engines.items()
            if arm in new.arms.names and new.arms.arm(arm) == old.settings.arms.arm(arm)
        }
        replaced = [arm for arm in old.engines if arm not in reuse]
        engines: dict[str, Engine] = dict(reuse)
        try:
            engines = self._load_engines(new, reuse)
            plan = self._new_plan(new, sampler, engines, previous=old.run)
            if plan.run is not old.run:
                with self._pairs.lock:
                    self.store.create_run(plan.run)
        except Exception as exc:
            # Any error, not only ours: a model directory transformers cannot read raises
            # OSError, a GPU without room for the new model a RuntimeError. A reload must
            # never take the running daemon down with it.
            for arm, engine in engines.items():
                if arm not in reuse:
                    engine.close()
            self.metrics.set_arms(old.engines)
            for arm in old.engines:
                self.metrics.set_engine_ready(arm, True)
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
                with self._pairs.lock:
                    self.store.finish_run(old.run.run_id, datetime.now(UTC))
            except DatabaseError as exc:
                log.error("run.finish_failed", run_id=old.run.run_id, reason=str(exc))
            self._build_info(plan)
        self._pairs.resize(new.storage.buffer_pairs)
        self._reschedule(old.settings, new)
        if self.manage_logging:
            configure_logging(new.logging)
        log.info(
            "config.reloaded",
            run_id=plan.run.run_id,
            config_hash=plan.run.config_hash,
            engines_rebuilt=[arm for arm in engines if arm not in reuse],
            engines_closed=replaced,
            categories=sampler.categories,
        )
        return True

    def _keep_restart_only(self, new: Settings, old: Settings) -> Settings:
        changed = []
        if new.storage.url != old.storage.url:
            changed.append("storage.url")
        if new.server.listen != old.server.listen:
            changed.append("server.listen")
        if new.traffic.listen != old.traffic.listen:
            changed.append("traffic.listen")
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
                "traffic": new.traffic.model_copy(update={"listen": old.traffic.listen}),
            }
        )

    def _reschedule(self, old: Settings, new: Settings) -> None:
        scheduler = self._scheduler
        if scheduler is None or old.schedule == new.schedule:
            return
        reschedule(scheduler, new.schedule)
        self._pair_interval_s = new.schedule.pair_interval_s
        self.metrics.pair_interval.set(self._pair_interval_s)
