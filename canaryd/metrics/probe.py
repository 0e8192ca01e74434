"""The capability-probe series: which capabilities each arm passes, and whether the
speculative arm regressed on any.

`ProbeMetrics` owns the state of each capability on each arm in the latest probe, one
regression flag per capability (capability names capped at 16), the probes run by
outcome, and the time the latest one finished.
"""

from __future__ import annotations

from collections.abc import Iterable

from canaryd.metrics.declare import Declarer
from canaryd.metrics.labels import PROBE_STATES, BoundedLabel


class ProbeMetrics:
    """Capability-probe series; `arm` bounds arm names."""

    def __init__(self, declare: Declarer, *, arm: BoundedLabel) -> None:
        self._arm = arm
        self._capability = BoundedLabel(16)
        self.capability_state = declare.gauge(
            "canaryd_probe_capability_state",
            "1 for each capability's state on each arm in the latest capability probe, 0 "
            "for its other states (pass, fail, unsupported).",
            ("capability", "arm", "state"),
            'canaryd_probe_capability_state{state="pass"} == 0',
        )
        self.regression = declare.gauge(
            "canaryd_probe_regression",
            "1 when the latest capability probe found the speculative arm failing (or not "
            "supporting) a capability the baseline passes, else 0.",
            ("capability",),
            "canaryd_probe_regression == 1",
        )
        self.runs = declare.counter(
            "canaryd_probe_runs_total",
            "Capability probes, by outcome (parity, regression, failed: could not run).",
            ("outcome",),
            'increase(canaryd_probe_runs_total{outcome="failed"}[6h]) > 0',
        )
        self.last_run = declare.gauge(
            "canaryd_last_probe_timestamp_seconds",
            "Unix time the latest capability probe finished (parity or regression).",
            (),
            "time() - canaryd_last_probe_timestamp_seconds > 2 * 3600",
        )
        for probe_outcome in ("parity", "regression", "failed"):
            self.runs.labels(outcome=probe_outcome)

    def finished(
        self,
        timestamp: float,
        states: Iterable[tuple[str, str, str]],
        regressions: Iterable[str],
    ) -> None:
        """A capability probe ended at `timestamp`: `(capability, arm, state)` for each
        cell of its table, and the capabilities the speculative arm regressed on."""
        regressed = set(regressions)
        capabilities = set()
        for capability, arm, state in states:
            label = self._capability(capability)
            capabilities.add(label)
            for candidate in PROBE_STATES:
                self.capability_state.labels(
                    capability=label, arm=self._arm(arm), state=candidate
                ).set(1 if candidate == state else 0)
        for capability in capabilities:
            self.regression.labels(capability=capability).set(1 if capability in regressed else 0)
        self.runs.labels(outcome="regression" if regressed else "parity").inc()
        self.last_run.set(timestamp)

    def failed(self) -> None:
        """A capability probe could not run (an arm away, a baseline failing)."""
        self.runs.labels(outcome="failed").inc()
