"""The state every role of the daemon shares, declared once: `DaemonState` is the base of
the role mixins (`CycleJobs` in cycle, `Probes` in probes, `Reloading` in reload) and of
`Daemon` (lifecycle), which assigns all of it in `__init__`.

Mixins rather than collaborator objects, because the roles act on one state: the
scheduler and the status server call bound methods of the daemon, callers read
`cycles`, `gate_failures` and `settings` off it, and a reload swaps the plan, engines and
settings under the same lock the pair cycle holds. Declaring that state here lets each
role live in its own module and be type-checked alone. State with behaviour of its own is
a collaborator instead: `PairWriter` (buffer), `Progress` (progress), `ParityJob`
(parity), `Pace` (pace), the plan (plan)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler

from canaryd.config import Settings
from canaryd.daemon.buffer import PairWriter, PendingPairs
from canaryd.daemon.burst import RolloutBurst
from canaryd.daemon.health import DatabaseProbe
from canaryd.daemon.hooks import GateHook
from canaryd.daemon.pace import Pace
from canaryd.daemon.parity import ParityJob
from canaryd.daemon.plan import Plan, load_engines
from canaryd.daemon.progress import Progress
from canaryd.daemon.telemetry import TelemetryJob
from canaryd.judging.verdict import VerdictService
from canaryd.metrics import CanarydMetrics
from canaryd.server.app import StatusServer
from canaryd.store import Store
from canaryd.traffic import LiveSampler, TrafficSink
from canaryd.traffic.live import SourceMix
from engine.base import Engine

__all__ = ["DaemonState"]


class DaemonState:
    """The daemon's shared attributes, and the accessors more than one role reads."""

    settings: Settings
    config_path: Path | None
    gates: GateHook
    metrics: CanarydMetrics
    manage_logging: bool
    heartbeat_hooks: list[Callable[[float], None]]
    last_heartbeat: float | None
    cycles: int
    gate_failures: int  # gate runs that raised in a row

    _pairs: PairWriter
    _stack: contextlib.ExitStack | None
    _store: Store | None
    _probe: DatabaseProbe | None
    _server: StatusServer | None
    _scheduler: BackgroundScheduler | None
    _pace: Pace  # the pair interval in force: the gate job, a burst and a reload set it
    _burst: RolloutBurst  # the revision a rollout tool is judging, and its burst
    _verdicts: VerdictService | None  # judges that revision after each gate run
    _plan: Plan | None
    _engines: dict[str, Engine]
    _engines_loaded: bool
    _stopping: threading.Event
    _idle: threading.Event
    _cycle_lock: threading.Lock  # one cycle at a time; a reload swaps between
    _progress: Progress
    _parity: ParityJob
    _telemetry: TelemetryJob  # the scrape job of [telemetry], on its own lock
    _traffic: LiveSampler | None  # with [traffic] listen: the live queue
    _sink: TrafficSink | None
    _mix: SourceMix

    @property
    def pending(self) -> PendingPairs:
        """The pairs waiting for the database."""
        return self._pairs.pending

    @property
    def abandoned(self) -> bool:
        """True when shutdown left a pair generating (dropped whole)."""
        return self._pairs.abandoned

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("the daemon is not started")
        return self._store

    def _load_engines(self, settings: Settings, reuse: dict[str, Engine]) -> dict[str, Engine]:
        """`plan.load_engines`, then the engines count as loaded (for /readyz)."""
        engines = load_engines(settings, reuse)
        self._arms_ready(engines)
        self._engines_loaded = True
        return engines

    def _arms_ready(self, engines: dict[str, Engine]) -> None:
        """The metrics' arms become those of `engines`, each one's engine ready."""
        self.metrics.set_arms(engines)
        for arm in engines:
            self.metrics.liveness.set_engine_ready(arm, True)
