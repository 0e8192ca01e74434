"""The daemon's gate job: read the window, run the gates, step the switch policy, apply.

`SwitchGates` implements the daemon's `GateHook`. On each `evaluate(now)` it reads from
the store the evidence on the switch's arm (`switch.arm`) in one `canaryd.judging.reader.
gather`: the pairs that cover the longest configured gate window, and with `[telemetry]`
both arms' stored scrape intervals, pinning drift references for categories that
have none yet (from the window, only while speculative decoding is on); judges it
(`gates.cycle.judge`, the telemetry gates with it), stores the decisions
(one evaluation), exports the gate metrics, and lets `SwitchService` step the policy
under the switch's row lock and apply the outcome. Every comparison arm is gated the
same way on its own pairs and references, with every gate in `warn` mode, and its
evaluation is stored under its name, where the switch never reads it: comparison arms
are judged and reported, never switch. The parity gate judges the latest stored
capability probe of the switch's arm (canaryd.parity.stored) beside the pair gates, and
that probe's regressions a router can match per request become the state file's
`route_to_baseline`, on the leader and the followers alike. `start()` (the daemon calls
it before loading engines) or else the first run re-applies the last stored state, so a
restarted daemon rewrites the state file from the database even when its engines then
fail to load, and re-runs hooks whose last attempt failed; only a run that completed
refreshes the file's `confirmed_at` (and stores its time, which the followers carry
forward). After a completed run the leader latches the FAIL of the revision its arm
serves (`VerdictService.latch_current`): judged on the revision's own evidence, its own
judgement's FAIL when all of its evidence lies in the revision's, or the switch's
rollback while the revision was judged, so that a FAIL outlives the next run's judgement.
At start and on every run, an emergency rollback the CLI wrote to the state file while
the database was down (`pending_sync`) is adopted into the database, never reverted. Of
several daemons on one database only the leader (`canaryd.judging.leader`, taken or re-checked
at start and on every run) evaluates and steps the switch; the others only adopt and
mirror the stored state into their state file (`SwitchService.follow`), and take over
when the leader is gone. A telemetry gate whose evidence stopped (`gates.telemetry.silence`:
NODATA) is logged once when it stops, and once when it flows again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog

from canaryd.config import Settings
from canaryd.errors import CannotJudgeError, DatabaseError
from canaryd.judging.leader import Leadership, leadership_for
from canaryd.judging.rate import RATE_HORIZON, RATE_REFRESH, pair_rate
from canaryd.judging.reader import gather
from canaryd.judging.verdict import MAX_REVISIONS, VerdictService
from canaryd.metrics.switch import SwitchMetrics
from canaryd.parity.routing import route_object
from canaryd.parity.stored import latest_probe
from canaryd.store import SqlStore, Store
from canaryd.switch import SwitchService
from gates import Evaluation
from gates.core import GateDecision, checks
from gates.cycle import TELEMETRY_GATES, Judgement, advisory, judge
from gates.parity import ProbeEvidence
from gates.stats.budget import design_pairs_per_minute
from gates.telemetry.silence import silent

__all__ = ["PRUNE_EVERY", "SwitchGates"]

log = structlog.get_logger(__name__)

PRUNE_EVERY = timedelta(hours=1)  # how often old gate decisions are deleted
CLOSE_WAIT_S = 2.0  # how long shutdown waits for a gate run in flight
REBUDGET_LOG_EVERY = timedelta(hours=1)  # how often an unchanged re-budget is logged again


def _routes(probe: ProbeEvidence | None) -> dict[str, Any] | None:
    """The state file's `route_to_baseline` from the latest probe (None: no probe)."""
    return None if probe is None else route_object(probe)


class SwitchGates:
    """The `GateHook` that gates and flips the rollback switch.

    `settings` is the daemon's `Settings` or a callable returning the current ones (so a
    SIGHUP reload's gate thresholds apply; the database URL and state file are bound at
    first use). `store` is opened from `storage.url` on first use when not given, and
    closed by `close()` only if it was opened here; `leadership` likewise (built for
    `storage.url`), released by `close()` either way.
    """

    def __init__(
        self,
        settings: Settings | Callable[[], Settings],
        *,
        metrics: SwitchMetrics | None = None,
        store: Store | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self._settings = settings
        self.metrics = metrics
        self._store = store
        self._owns_store = store is None
        self._leadership = leadership
        self._leading: bool | None = None  # None: not tried yet
        self._service: SwitchService | None = None
        self._verdicts: VerdictService | None = None  # latches the current revision's FAIL
        self._lock = threading.Lock()  # one evaluation at a time
        self._pruned_at: datetime | None = None
        self._rebudget_logged: tuple[float, datetime] | None = None  # (ratio, when)
        self._rate: tuple[datetime, float] | None = None  # (measured at, pairs a minute)
        self._silent: set[tuple[str, str]] = set()  # (arm, gate) whose evidence stopped
        # The largest progress (CUSUM / h) of an enforce detector that has not decided,
        # at the last gate run this daemon led; None while it follows (the pace of pairs).
        self.suspicion: float | None = None

    @property
    def settings(self) -> Settings:
        return self._settings() if callable(self._settings) else self._settings

    @property
    def service(self) -> SwitchService:
        """The switch service (opening the store and re-applying the state on first use)."""
        if self._service is None:
            settings = self.settings
            if self._store is None:
                self._store = SqlStore.open(settings.storage.resolved_url())
            service = SwitchService(
                self._store, settings.switch, settings.gates.policy, metrics=self.metrics
            )
            service.set_routes(_routes(latest_probe(self._store, settings)))
            leading = self._leading if self._leading is not None else self._lead()
            report = service.start(lead=leading)
            record = service.record()
            log.info(
                "switch.started",
                leader=leading,
                mode=record.state.mode.value,
                generation=record.state.generation,
                state_file=str(service.state_file),
                reapplied=report is not None,
                failures=report.failures if report else {},
            )
            self._service = service
        return self._service

    def start(self) -> None:
        """Try to lead, open the store and write the last stored state to the state file
        now (and, leading, re-run failed hooks) instead of at the first run; idempotent."""
        with self._lock:
            if self._service is None:
                self._lead()
            _ = self.service

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Release leadership and the store; a gate run stuck on a frozen database holds
        the lock, and then this gives up after `wait_s` (the process is exiting)."""
        if not self._lock.acquire(timeout=wait_s):
            log.warning(
                "gates.close_skipped",
                reason=f"a gate run still holds the gates after {wait_s:g} s (a database "
                "that does not answer); leadership ends with the process",
            )
            return
        try:
            if self._leadership is not None:
                self._leadership.close()
            self._leading = None
            if self._store is not None and self._owns_store:
                self._store.close()
            self._store = None
            self._service = None
            self._verdicts = None
        finally:
            self._lock.release()

    def evaluate(self, now: datetime) -> None:
        with self._lock:
            if self._lead():
                self._evaluate(now)
            else:
                self.suspicion = None
                service = self.service
                assert self._store is not None  # opened by `self.service`
                service.set_routes(_routes(latest_probe(self._store, self.settings)))
                service.follow()

    @property
    def leadership(self) -> Leadership:
        if self._leadership is None:
            self._leadership = leadership_for(self.settings.storage.resolved_url())
        return self._leadership

    def state_file_problem(self) -> str | None:
        """Why the state file could not be written at the last attempt; None when it was
        (or the switch is not started yet)."""
        return None if self._service is None else self._service.state_file_problem

    def role(self) -> str:
        """This daemon's part in the fleet: `leader` or `follower` (also before the
        first attempt to lead)."""
        return "leader" if self._leading else "follower"

    def _lead(self) -> bool:
        """Take leadership or re-check it; a change of role is logged and exported."""
        leading = self.leadership.acquire()
        if leading != self._leading:
            if leading:
                log.info("leader.acquired", instance=self.leadership.instance)
            else:
                (log.warning if self._leading else log.info)(
                    "leader.following",
                    instance=self.leadership.instance,
                    reason="another daemon on this database leads the gates and the "
                    "switch (or the lock cannot be reached); this one only measures",
                )
        self._leading = leading
        if self.metrics is not None:
            self.metrics.set_leader(leading)
        return leading

    def _evaluate_comparison_arms(self, store: Store, now: datetime) -> None:
        """Gate every comparison arm (all gates `warn`) and store its evaluation under its
        name, out of the switch's reach."""
        config = advisory(self.settings.gates)
        for arm in self.settings.comparison_arms:
            evidence = gather(store, self.settings, arm, now, config=config, pin=True)
            decisions = judge(evidence, config, now).decisions
            store.save_evaluation(Evaluation(now, decisions), comparison_arm=arm)
            self._note_silence(arm, decisions)
            log.info(
                "gates.compared",
                arm=arm,
                pairs=len(evidence.records),
                states={d.name: d.state.value for d in decisions},
            )

    def _note_silence(self, arm: str, decisions: Sequence[GateDecision]) -> None:
        """Log once when a telemetry gate's evidence stops (`gates.telemetry.silence`: the
        gate reads NODATA until it flows again), and once when it flows again."""
        for decision in decisions:
            if decision.name not in TELEMETRY_GATES:
                continue
            key = (arm, decision.name)
            if silent(decision.detail):
                if key not in self._silent:
                    self._silent.add(key)
                    log.warning(
                        "telemetry.evidence_stopped",
                        arm=arm,
                        gate=decision.name,
                        reason=decision.detail,
                        state=decision.state.value,
                    )
            elif key in self._silent:
                self._silent.discard(key)
                log.info("telemetry.evidence_resumed", arm=arm, gate=decision.name)

    def _pair_rate(self, store: Store, arm: str, now: datetime) -> float:
        """The switch arm's pairs a minute on the database, measured again every
        `RATE_REFRESH`."""
        if self._rate is None or not timedelta(0) <= now - self._rate[0] < RATE_REFRESH:
            self._rate = (now, pair_rate(store, arm, now))
        return self._rate[1]

    def _report_rate(self, rate: float, ratio: float, now: datetime) -> None:
        """Export the pair rate's ratio to the design rate; log a re-budget when it starts,
        moves by a tenth or more, ends, and hourly while it lasts."""
        design = design_pairs_per_minute(self.settings.gates)
        if self.metrics is not None:
            self.metrics.pair_rate_ratio.set(rate / design)
        logged = self._rebudget_logged
        if ratio <= 1.0:
            if logged is not None:
                log.info("gates.rebudget_ended", pairs_per_minute=round(rate, 3), design=design)
                self._rebudget_logged = None
            return
        if (
            logged is not None
            and abs(ratio / logged[0] - 1.0) < 0.1
            and now - logged[1] < REBUDGET_LOG_EVERY
        ):
            return
        log.warning(
            "gates.rebudgeted",
            pairs_per_minute=round(rate, 3),
            design=design,
            ratio=round(ratio, 3),
            horizon_h=RATE_HORIZON.total_seconds() / 3600,
            reason="the database holds more pairs than gates.budget.design_pair_interval_s "
            "is sized for (pairs_per_cycle, several daemons measuring): every detector is "
            "judged at the measured rate, its threshold log(ratio) higher",
        )
        self._rebudget_logged = (ratio, now)

    def _evaluate(self, now: datetime) -> None:
        service = self.service
        store = self._store
        assert store is not None  # opened by `self.service`
        config = self.settings.gates
        service.policy = config.policy
        # Before the drift pins, which read the mode: a pending emergency rollback counts.
        service.adopt_pending()
        arm = self.settings.switch_arm
        revision = self.settings.switch.revision
        if revision is not None and store.revision_window(arm, revision) is None:
            # The configured revision is an explicit write: its evidence window opens here.
            store.start_revision(arm, revision, now, keep=MAX_REVISIONS)
            log.info("verdict.revision_started", arm=arm, revision=revision, by="switch.revision")
        # Evidence restarts at every switch transition: a restore rests only on pairs
        # measured after the trip, and a restored switch is not re-tripped by old ones.
        # A category's own move restarts the evidence of its per-category checks.
        evidence = gather(
            store,
            self.settings,
            arm,
            now,
            config=config,
            state=service.record().state,
            pin=True,
            probe=True,
            control=True,
            rate=self._pair_rate,
        )
        judged = judge(evidence, config, now)
        assert evidence.pair_rate is not None  # read by `self._pair_rate`
        self._report_rate(evidence.pair_rate, judged.rate_ratio, now)
        decisions = judged.decisions
        service.set_routes(_routes(evidence.probe))
        store.save_evaluation(Evaluation(now, decisions))
        self._note_silence(arm, decisions)
        if self.metrics is not None:
            self.metrics.observe_gates((d.name, d.state.value) for d in decisions)
            self.metrics.observe_detectors(
                (check.name, check.detector.progress)
                for check in checks(decisions)
                if check.detector is not None
            )
        log.info(
            "gates.evaluated",
            arm=arm,
            pairs=len(evidence.records),
            states={d.name: d.state.value for d in decisions},
        )
        self.suspicion = judged.suspicion
        service.step_gates(now)
        self._evaluate_comparison_arms(store, now)
        if self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY:
            keep = timedelta(days=self.settings.storage.raw_retention_days)
            store.prune_gate_decisions(now - keep)
            self._pruned_at = now
        # Last: a run that raised anywhere above leaves the file's `confirmed_at` to age.
        service.complete_gate_run(now)
        self._latch(store, now, judged, evidence.start)

    def _latch(
        self, store: Store, now: datetime, judged: Judgement, since: datetime | None
    ) -> None:
        """Latch the FAIL of the revision the arm serves (after the run completed: a
        failure here is logged and tried again at the next run, never a failed run)."""
        if self._verdicts is None:
            self._verdicts = VerdictService(self._settings, store=store)
        try:
            self._verdicts.latch_current(now, judged, since)
        except (DatabaseError, CannotJudgeError) as exc:
            log.warning("verdict.latch_failed", reason=str(exc))
