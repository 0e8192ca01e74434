"""What the status server asks the daemon, as the `Probes` mixin of `Daemon`: /healthz
(the scheduler runs its jobs, the last cycle is recent, the soak progresses), /readyz (engines
loaded, database reachable, gate runs succeeding, the state file writable, this daemon's
role) and /v1/switch (the state file as production reads it). The reports themselves
are built in `canaryd.daemon.health`; a mixin over `DaemonState` (see there why), since
the server is handed these bound methods."""

from __future__ import annotations

from typing import Any

from canaryd.daemon.health import health_report, readiness_report
from canaryd.daemon.state import DaemonState
from canaryd.switch.statefile import read_state_file

__all__ = ["Probes"]


class Probes(DaemonState):
    """The health, readiness and switch answers, and the progress they are built on."""

    def progressing(self) -> bool:
        """Whether the soak made progress within `max_stall_s`; logs once when it stops
        (a generation or a check is stuck: the watchdog is no longer fed) and resumes."""
        return self._progress.progressing()

    def last_progress_age_s(self) -> float:
        """Seconds since a cycle started, a pair finished or a cycle finished."""
        return self._progress.last_progress_age_s()

    def last_cycle_age_s(self) -> float:
        """Seconds since the last cycle finished (since start, before the first)."""
        return self._progress.last_cycle_age_s()

    def switch_file(self) -> dict[str, Any] | None:
        """What production reads, for `/v1/switch`: the state file's object (None while
        it is missing or unreadable)."""
        return read_state_file(self.settings.switch.resolved_state_file())

    def health(self) -> tuple[bool, dict[str, Any]]:
        """/healthz: the scheduler runs its jobs, the last cycle is recent enough and the
        cycle in flight progresses."""
        return health_report(
            self._scheduler,
            self.last_cycle_age_s(),
            self.settings,
            self.cycles,
            progress_age_s=self.last_progress_age_s(),
            heartbeat_age_s=self._progress.last_heartbeat_age_s(),
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
