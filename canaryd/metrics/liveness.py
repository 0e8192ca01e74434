"""The liveness series: whether the daemon's loops are running.

`LivenessMetrics` owns what an alert on a stuck or dead daemon reads: pair cycles and the
time of the last (successful) one, gate runs and the time of the last completed one, the
pair interval in force, the heartbeat, and whether each arm's engine is ready.
"""

from __future__ import annotations

from canaryd.metrics.declare import Declarer
from canaryd.metrics.labels import BoundedLabel


class LivenessMetrics:
    """Cycle, gate-run, heartbeat and engine-readiness series; `arm` bounds arm names."""

    def __init__(self, declare: Declarer, *, arm: BoundedLabel) -> None:
        self._arm = arm
        self.cycles = declare.counter(
            "canaryd_cycles_total",
            "Pair cycles finished, by outcome (ok, failed).",
            ("outcome",),
            'increase(canaryd_cycles_total{outcome="failed"}[1h])',
        )
        self.last_cycle = declare.gauge(
            "canaryd_last_cycle_timestamp_seconds",
            "Unix time the last pair cycle finished, whatever its outcome.",
            (),
            "time() - canaryd_last_cycle_timestamp_seconds",
        )
        self.last_cycle_success = declare.gauge(
            "canaryd_last_cycle_success_timestamp_seconds",
            "Unix time the last pair cycle finished successfully.",
            (),
            "time() - canaryd_last_cycle_success_timestamp_seconds > 600",
        )
        self.gate_runs = declare.counter(
            "canaryd_gate_runs_total",
            "Gate runs finished, by outcome (ok; failed: the run raised, judged nothing and "
            "did not confirm the state file).",
            ("outcome",),
            'increase(canaryd_gate_runs_total{outcome="failed"}[15m])',
        )
        self.last_gate_run_success = declare.gauge(
            "canaryd_last_gate_run_success_timestamp_seconds",
            "Unix time the last gate run completed (leader: judged and confirmed; follower: "
            "mirrored the leader's state).",
            (),
            "time() - canaryd_last_gate_run_success_timestamp_seconds > 300",
        )
        self.pair_interval = declare.gauge(
            "canaryd_pair_interval_seconds",
            "Seconds between pair cycles now: schedule.pair_interval_s, or less while an "
            "enforce detector is past schedule.speed_up_at of its threshold.",
            (),
            "canaryd_pair_interval_seconds",
        )
        self.heartbeat_timestamp = declare.gauge(
            "canaryd_heartbeat_timestamp_seconds",
            "Unix time of the daemon's last heartbeat.",
            (),
            "time() - canaryd_heartbeat_timestamp_seconds > 60",
        )
        self.engine_ready = declare.gauge(
            "canaryd_engine_ready",
            "1 when the arm's engine is loaded and answering, else 0.",
            ("arm",),
            "min(canaryd_engine_ready) == 0",
        )
        for cycle_outcome in ("ok", "failed"):
            self.cycles.labels(outcome=cycle_outcome)

    def cycle_finished(self, timestamp: float, ok: bool) -> None:
        """A pair cycle ended at `timestamp` (Unix seconds)."""
        self.cycles.labels(outcome="ok" if ok else "failed").inc()
        self.last_cycle.set(timestamp)
        if ok:
            self.last_cycle_success.set(timestamp)

    def gate_run_finished(self, timestamp: float, ok: bool) -> None:
        """A gate run ended at `timestamp` (Unix seconds), completed (`ok`) or raised."""
        self.gate_runs.labels(outcome="ok" if ok else "failed").inc()
        if ok:
            self.last_gate_run_success.set(timestamp)

    def heartbeat(self, timestamp: float) -> None:
        """The daemon's heartbeat at `timestamp` (Unix seconds)."""
        self.heartbeat_timestamp.set(timestamp)

    def set_engine_ready(self, arm: str, ready: bool) -> None:
        """Whether `arm`'s engine is loaded and answering."""
        self.engine_ready.labels(arm=self._arm(arm)).set(1 if ready else 0)

    def add_arm(self, arm: str) -> None:
        """Create `arm`'s readiness series, reading 0 until the engine answers."""
        self.engine_ready.labels(arm=arm).set(0)

    def remove_arm(self, arm: str) -> None:
        """Remove the readiness series of an arm no longer configured."""
        self.engine_ready.remove(arm)
