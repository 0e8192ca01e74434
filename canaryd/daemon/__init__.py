"""canaryd's soak daemon: `Daemon` (core) owns the store, engines, status server and
scheduled jobs; `PairWriter` and `PendingPairs` (buffer) keep pairs while the database is
away, and `Quarantine` (quarantine) keeps the ones it refuses; `DatabaseProbe` and the
health and readiness reports (probe) answer /healthz and /readyz; the scheduling module
wires the jobs into APScheduler; `serve_until_signalled` (signals) is the main-thread
loop behind `canaryd run`."""

from __future__ import annotations

from canaryd.daemon.buffer import PairWriter, PendingPairs
from canaryd.daemon.core import RESTART_ONLY, Daemon, GateHook, NoGates
from canaryd.daemon.health import DatabaseProbe, max_cycle_age_s, max_stall_s
from canaryd.daemon.quarantine import Quarantine
from canaryd.daemon.scheduling import CYCLE_JOB, GATE_JOB, HEARTBEAT_JOB, RETENTION_JOB
from canaryd.daemon.signals import serve_until_signalled

__all__ = [
    "CYCLE_JOB",
    "GATE_JOB",
    "HEARTBEAT_JOB",
    "RESTART_ONLY",
    "RETENTION_JOB",
    "Daemon",
    "DatabaseProbe",
    "GateHook",
    "NoGates",
    "PairWriter",
    "PendingPairs",
    "Quarantine",
    "max_cycle_age_s",
    "max_stall_s",
    "serve_until_signalled",
]
