"""canaryd's soak daemon: `Daemon` (lifecycle) owns the store, engines, status server and
scheduled jobs, with its roles in mixins — the pair cycle and the other jobs (cycle), the
status server's probes (probes), SIGHUP's reload (reload) — over the state they share
(state); `GateHook` and `NoGates` (hooks) are its seam to the gates; what a cycle runs with
is assembled in plan, the soak's progress clock is kept in progress, and the pair
interval in force (`Pace`) in pace. `PairWriter` and `PendingPairs` (buffer) keep pairs
while the database is away, and `Quarantine` (quarantine) keeps the ones it refuses;
`DatabaseProbe` and the health and readiness reports (health) answer /healthz and /readyz;
the scheduling module wires the jobs into APScheduler, and `ClockWatch` (clock) moves them
onto a wall clock that was stepped; `serve_until_signalled` (signals) is
the main-thread loop behind `canaryd run`."""

from __future__ import annotations

from canaryd.daemon.buffer import PairWriter, PendingPairs
from canaryd.daemon.health import DatabaseProbe, max_cycle_age_s, max_stall_s
from canaryd.daemon.hooks import GateHook, NoGates
from canaryd.daemon.lifecycle import Daemon
from canaryd.daemon.quarantine import Quarantine
from canaryd.daemon.scheduling import CYCLE_JOB, GATE_JOB, HEARTBEAT_JOB, RETENTION_JOB
from canaryd.daemon.signals import serve_until_signalled

__all__ = [
    "CYCLE_JOB",
    "GATE_JOB",
    "HEARTBEAT_JOB",
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
