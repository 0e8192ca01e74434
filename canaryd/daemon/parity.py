"""The daemon's capability probe: `canaryd probe`'s checklist on a schedule
(`schedule.probe_interval_s`), on the engines the daemon already holds.

Each run is stored as a run of kind `probe` (as the command stores it), exported as
`canaryd_probe_capability_state`, `canaryd_probe_regression` and the probe counters, and
logged: a regression as a warning naming the capabilities. Arms that are not
OpenAI-compatible servers have nothing to probe: the job says so once and skips. A probe
that cannot run (an arm away) is counted and logged, never raised: the soak goes on.
The job holds the daemon's cycle lock, so the run has a deadline (`PROBE_TIMEOUT_S`) and
every answer a byte cap: a dripping or endless server costs one bounded probe, not the
soak. Answers a cap cut short are counted in `canaryd_read_caps_total`; a run the
deadline cut before it showed parity (and found no regression) counts as a failed probe.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

import structlog

from canaryd.config import Settings
from canaryd.errors import DatabaseError, ProbeError
from canaryd.metrics.pairs import PairMetrics
from canaryd.metrics.probe import ProbeMetrics
from canaryd.metrics.store import StoreMetrics
from canaryd.pairs.plan import new_run
from canaryd.parity.checks import Outcome
from canaryd.parity.report import ProbeReport
from canaryd.parity.run import PROBE_TIMEOUT_S, probe_arms, run_probe
from canaryd.store import Store
from engine.base import Engine
from gates.records import BASELINE_ARM

__all__ = ["ParityJob"]

log = structlog.get_logger(__name__)


class ParityJob:
    """Runs the probe and records it; one instance per daemon. The probe's outcome goes
    to `metrics`, the answers a byte cap cut short to `pair_metrics` (which counts the
    generations a read cap cut short too), a run the store refused to `store_metrics`."""

    def __init__(
        self, metrics: ProbeMetrics, *, pair_metrics: PairMetrics, store_metrics: StoreMetrics
    ) -> None:
        self.metrics = metrics
        self.pair_metrics = pair_metrics
        self.store_metrics = store_metrics
        self._skipped_for: str | None = None  # the reason last logged for skipping

    def run(
        self,
        settings: Settings,
        engines: Mapping[str, Engine],
        store: Store,
        on_progress: Callable[[], None] = lambda: None,
    ) -> ProbeReport | None:
        """One probe of the baseline and the switch's arm; `on_progress` after each
        capability on each arm. None when skipped or failed."""
        try:
            probe_arms(settings)
        except ProbeError as exc:
            if self._skipped_for != str(exc):
                log.info("probe.skipped", reason=str(exc))
                self._skipped_for = str(exc)
            return None
        arms = {name: engines[name] for name in (BASELINE_ARM, settings.switch_arm)}
        started_at = datetime.now(UTC)

        def progress(capability: str, arm: str, outcome: Outcome) -> None:
            on_progress()

        try:
            report = run_probe(settings, arms, on_result=progress, timeout_s=PROBE_TIMEOUT_S)
        except ProbeError as exc:
            self.metrics.failed()
            log.error("probe.failed", reason=str(exc))
            return None
        if report.not_run and not report.regressions:  # cut short: no parity shown
            self.metrics.failed()
            log.error("probe.incomplete", not_run=list(report.not_run))
        else:
            self.metrics.finished(
                time.time(),
                [
                    (c.name, arm, outcome.state)
                    for c in report.capabilities
                    for arm, outcome in ((BASELINE_ARM, c.baseline), (report.arm, c.speculative))
                ],
                report.regressions,
            )
        for what, n in report.read_caps.items():
            self.pair_metrics.read_capped(what, n)
        if report.read_caps:
            log.warning("probe.read_capped", read_caps=report.read_caps)
        run = new_run(
            settings, "probe", arms, started_at=started_at, extra_config={"probe": report.to_dict()}
        )
        try:
            store.create_run(run)
            store.finish_run(run.run_id, datetime.now(UTC))
        except DatabaseError as exc:
            self.store_metrics.error("probe_run")
            log.error("probe.not_stored", run_id=run.run_id, reason=str(exc))
        if report.regressions:
            log.warning(
                "probe.regression",
                run_id=run.run_id,
                arm=report.arm,
                capabilities=report.regressions,
                reasons={c.name: c.speculative.reason for c in report.capabilities if c.regressed},
            )
        elif not report.not_run:
            log.info("probe.parity", run_id=run.run_id, elapsed_s=round(report.elapsed_s, 1))
        return report
