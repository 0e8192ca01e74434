"""The soak daemon's lifecycle: `Daemon`, one owner for the store, engines, status server
and scheduler, composed of its role mixins (`CycleJobs`, `Probes`, `Reloading`).

`Daemon.start()` enters every component through one `ExitStack` — store, the gate hook's
start (the switch state file is written from the database before anything that can fail
on a GPU or a model), status server (with the verdict endpoints), engines, the daemon run
row, then the APScheduler jobs (pair cycle, gates, retention, heartbeat, and the telemetry
scrape with `[telemetry]`) and the clock watch that moves them onto a stepped wall clock — and
`Daemon.stop()` closes that stack, so SIGTERM, SIGINT, an error at start-up and a test all
take the same ordered path back out: stop scheduling, let the in-flight pair finish (or
drop it whole after `schedule.shutdown_timeout_s`), flush the pairs buffered while the
database was away, finish the run, close engines, stop HTTP, close the store.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import structlog
from apscheduler.schedulers.background import BackgroundScheduler

from canaryd.config import Settings
from canaryd.daemon.buffer import PairWriter
from canaryd.daemon.burst import RolloutBurst
from canaryd.daemon.clock import ClockWatch
from canaryd.daemon.cycle import CycleJobs
from canaryd.daemon.health import DatabaseProbe, max_stall_s
from canaryd.daemon.hooks import GateHook, NoGates
from canaryd.daemon.pace import Pace
from canaryd.daemon.parity import ParityJob
from canaryd.daemon.plan import new_plan, publish_build_info
from canaryd.daemon.probes import Probes
from canaryd.daemon.progress import Progress
from canaryd.daemon.reload import Reloading
from canaryd.daemon.scheduling import follow_clock, start_scheduler
from canaryd.daemon.telemetry import TelemetryJob
from canaryd.errors import DatabaseError
from canaryd.judging.inputs import log_unprovided
from canaryd.judging.verdict import VerdictService
from canaryd.metrics import CanarydMetrics
from canaryd.pairs.plan import suite_sampler
from canaryd.scoring import load_metrics
from canaryd.server.app import StatusServer
from canaryd.server.rollout import ProgressiveDelivery
from canaryd.store import SqlStore
from canaryd.traffic import LiveSampler, SamplingBounds, TrafficSink
from canaryd.traffic.live import SourceMix
from canaryd.traffic.mix import WindowMix
from engine.base import Engine

__all__ = ["Daemon"]

log = structlog.get_logger(__name__)

FINISH_WAIT_S = 2.0  # how long shutdown waits to store the buffer and the run's end


class Daemon(CycleJobs, Probes, Reloading):
    """canaryd's soak loop as one object: `start()`, `stop()`, `reload()`, probes.

    `config_path` is what `reload()` reads (None: `CANARYD_CONFIG`, else defaults).
    `manage_logging` makes a reload re-apply the `logging` section (the CLI owns logging;
    an embedded daemon in a test or benchmark leaves it alone). `wall_clock` is the clock
    the clock watch compares with the monotonic one (a test steps it).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        config_path: Path | None = None,
        gates: GateHook | None = None,
        metrics: CanarydMetrics | None = None,
        manage_logging: bool = False,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.config_path = config_path
        self.gates = gates or NoGates()
        self.metrics = metrics or CanarydMetrics()
        self.manage_logging = manage_logging
        # Called with the Unix time on every heartbeat while cycles progress: systemd's
        # watchdog is fed from here, so a daemon whose scheduler has died, or whose cycle
        # is wedged in a generation or a check, is restarted.
        self.heartbeat_hooks: list[Callable[[float], None]] = []
        self._pairs = PairWriter(settings.storage.buffer_pairs, self.metrics.store)

        self._stack = None
        self._store = None
        self._probe = None
        self._server = None
        self._scheduler = None
        self._burst = RolloutBurst(lambda: self.settings)
        self._pace = Pace(
            lambda: self.settings,
            self._burst,
            self.metrics.liveness,
            suspicion=lambda: self.gates.suspicion,
            scheduler=lambda: self._scheduler,
        )
        self._burst.on_change = self._pace.repace
        self._verdicts = None
        self._plan = None
        self._engines = {}
        self._engines_loaded = False
        self._stopping = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._cycle_lock = threading.Lock()
        self._progress = Progress(lambda: max_stall_s(self.settings))
        self._clock_watch = ClockWatch(self._follow_clock, wall=wall_clock)
        self.last_heartbeat = None
        self.cycles = 0
        self.gate_failures = 0
        self._parity = ParityJob(
            self.metrics.probe, pair_metrics=self.metrics.pairs, store_metrics=self.metrics.store
        )
        self._telemetry = TelemetryJob(
            lambda: self.settings,
            self.metrics.telemetry,
            store_metrics=self.metrics.store,
            store=lambda: self.store,
            leading=lambda: self.gates.role() != "follower",
            source=config_path,
        )
        self._traffic = None
        self._sink = None
        self._mix = SourceMix()

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
    def burst(self) -> RolloutBurst:
        """The rollout burst: which revision a rollout tool is judging, and its cost."""
        return self._burst

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
    def telemetry(self) -> TelemetryJob:
        """The scrape job of the arms' production telemetry ([telemetry])."""
        return self._telemetry

    @property
    def engines(self) -> dict[str, Engine]:
        """The running engine of each arm, by name."""
        return dict(self._engines)

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
        sampler = suite_sampler(settings)
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
            verdicts = VerdictService(lambda: self.settings, pace=self._pace.pairs_per_minute)
            stack.callback(verdicts.close)
            self._verdicts = verdicts
            self._server = StatusServer(
                settings.server.listen,
                self.metrics,
                self.health,
                self.ready,
                self.switch_file,
                ProgressiveDelivery(verdicts, self._burst),
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
            plan = new_plan(settings, sampler, self._engines, self.metrics.pairs)
            self._store.create_run(plan.run)
            self._plan = plan
            stack.callback(self._finish)
            publish_build_info(self.metrics.build, plan.run)
            log.info(
                "daemon.started",
                run_id=plan.run.run_id,
                address=self._server.address,
                database=self._store.url,
                categories=sampler.categories,
            )
            # An enforce gate the servers cannot feed would hold every PASS in silence.
            log_unprovided(settings)
            self._progress.restart()
            if schedule:
                self._scheduler = self._start_scheduler(settings)
                stack.callback(self._stop_scheduler)
                self._clock_watch.start()
                stack.callback(self._clock_watch.stop)
            # Its own job and lock, never the pair cycle's; closed before the scheduler
            # stops, so that a scrape in flight ends first.
            self._telemetry.start(self._scheduler)
            stack.callback(self._telemetry.close)
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
            observe=self.metrics.traffic.request,
            on_window=self._traffic_mix,
        )
        self._sink = TrafficSink(settings.traffic, self._traffic)
        self._sink.start()

    def _stop_sink(self) -> None:
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.stop()

    def _traffic_mix(self, mix: WindowMix) -> None:
        self.metrics.traffic.mix(mix.shares, mix.prompt_chars, mix.repetition)

    def _close_engines(self) -> None:
        self._engines_loaded = False
        for arm in self._engines:
            self.metrics.liveness.set_engine_ready(arm, False)
        if self.abandoned:
            return  # a pair is still generating on them; the process is about to exit
        for engine in self._engines.values():
            engine.close()

    def _start_scheduler(self, settings: Settings) -> BackgroundScheduler:
        self._pace.scheduled(settings.schedule)
        return start_scheduler(
            settings.schedule,
            cycle=self.run_cycle,
            gates=self.evaluate_gates,
            retention=self.apply_retention,
            heartbeat=self.heartbeat,
            probe=self.run_probe,
        )

    def _follow_clock(self, jump_s: float) -> dict[str, float]:
        """The clock watch saw the wall clock step by `jump_s`: the jobs follow it."""
        scheduler = self._scheduler
        return {} if scheduler is None else follow_clock(scheduler, jump_s)

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
            self.metrics.store.error("finish_run")
            log.error("run.finish_failed", run_id=self._plan.run.run_id, reason=str(exc))
