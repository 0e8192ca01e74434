"""The switch service: changes the switch through the policy and applies the result.

The database row is the truth; everything else mirrors it, in a fixed order: the policy's
outcome is committed under the row lock first, then the state file production reads is
rewritten atomically, then the optional hooks run (command, webhook, Alertmanager), each
retried with exponential back-off and delivered in generation order. A failed actuator
is counted, logged and recorded on the row (`canaryd switch status` shows it); it never
changes or reverts the state, and `SwitchService.ensure_applied()` (the daemon at start
and on every gate run) re-applies a generation whose last application failed and, for the
daemon, refreshes the state file's `confirmed_at`. A pending emergency rollback in the
state file is adopted under the row lock before anything else. CLI and daemon both go
through it; a daemon that does not lead the gates only adopts and mirrors (`follow()`).
An operator's top-level restore that the policy does not refuse also restores the
revisions being judged (`SwitchStore.restore_revisions`): their latched FAIL is cleared
and their evidence restarts at the restore, even when speculation was on already (a
rollout tool's FAIL that never tripped the switch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from canaryd.config import SwitchConfig
from canaryd.logs import get_logger
from canaryd.store.switching import RevisionWindow, SwitchRecord
from canaryd.switch.actuators import Actuator, build_actuators, utcnow
from canaryd.switch.delivery import deliver, newest
from canaryd.switch.emergency import pending_adoption
from canaryd.switch.statefile import (
    CONFIRMED_AT,
    ROUTE_TO_BASELINE,
    STATE_FILE_ACTUATOR,
    file_generation,
    file_object,
    is_pending,
    read_state_file,
    remove_leftover_temps,
    shows,
    state_object,
    without_freshness,
    write_state_file,
)
from gates import (
    Evaluation,
    SwitchEvent,
    SwitchMode,
    SwitchOutcome,
    SwitchPolicyConfig,
    SwitchState,
    Transition,
    step,
)

if TYPE_CHECKING:
    from canaryd.metrics.switch import SwitchMetrics
    from canaryd.store import SwitchStore

__all__ = ["ApplyReport", "SwitchChange", "SwitchService"]

log = get_logger("canaryd.switch")


@dataclass(frozen=True, slots=True)
class ApplyReport:
    """How applying one generation went: failures by actuator name (empty: all applied)."""

    generation: int
    failures: dict[str, str] = field(default_factory=dict)
    file_skipped: bool = False  # a newer generation was already in the state file

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass(frozen=True, slots=True)
class SwitchChange:
    """A command's or a gate run's result: the policy outcome and, when it changed the
    state (or the state was not yet applied), how applying it went."""

    outcome: SwitchOutcome
    report: ApplyReport | None
    adopted: Transition | None = None  # a pending emergency rollback it synced first
    # The revisions an operator's restore restored, as they were (a latched FAIL cleared).
    restored: tuple[RevisionWindow, ...] = ()

    @property
    def state(self) -> SwitchState:
        return self.outcome.state


def _actor_kind(actor: str) -> str:
    return "user" if actor.startswith("user:") else "gate"


class SwitchService:
    """Changes the switch through the policy, under the database row lock, and applies
    the result: state file, then hooks. Used by the daemon's gate hook and by the CLI."""

    def __init__(
        self,
        store: SwitchStore,
        config: SwitchConfig,
        policy: SwitchPolicyConfig,
        *,
        metrics: SwitchMetrics | None = None,
        actuators: Sequence[Actuator] | None = None,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.config = config
        self.policy = policy
        self.metrics = metrics
        self.clock = clock
        self.sleep = sleep
        self.state_file = config.resolved_state_file()
        # Why the last write of the state file failed; None after one succeeded.
        self.state_file_problem: str | None = None
        # The state file's `route_to_baseline` (None: none); until `set_routes`, each
        # write keeps the file's own (a CLI command knows no probe).
        self._routes: dict[str, Any] | None = None
        self._routes_set = False
        self.actuators = (
            list(actuators) if actuators is not None else build_actuators(config, clock)
        )

    def _history(self) -> int:
        # The policy reads at most the last trip_m (trip) or restore_passes (auto-restore)
        # evaluations since the last transition; a few more cost nothing.
        return max(self.policy.trip_m, self.policy.restore_passes) + 5

    def record(self) -> SwitchRecord:
        return self.store.switch()

    def set_routes(self, routes: Mapping[str, Any] | None) -> None:
        """What the state file's `route_to_baseline` says from the next write on (None:
        the file has none): the daemon's gate job sets it from the latest probe."""
        self._routes = dict(routes) if routes is not None else None
        self._routes_set = True

    def _change(
        self,
        events: Sequence[SwitchEvent],
        now: datetime,
        actor: str = "",
    ) -> SwitchChange:
        adoption: Transition | None = None

        def decide(state: SwitchState, history: list[Evaluation]) -> SwitchOutcome:
            nonlocal adoption
            # Under the row lock: an emergency rollback written while the database was
            # down is adopted first, so neither a command nor the gates can revert it.
            start, adoption = pending_adoption(self.state_file, state, now)
            # A state file from an earlier database may carry a higher generation:
            # continue above it so the file never goes back.
            floor = file_generation(self.state_file)
            if adoption is None and floor > start.generation:
                start = replace(start, generation=floor)
            outcome = step(start, history, self.policy, now=now, events=events)
            transitions = (
                outcome.transitions if adoption is None else (adoption, *outcome.transitions)
            )
            if not transitions:
                # Only the policy's clock repair (a `since` ahead of `now`) is kept; the
                # file's generation floor is for the next transition to build on.
                kept = replace(outcome.state, generation=state.generation)
                if kept != state:
                    log.warning(
                        "switch.clock_behind",
                        since=state.since.isoformat() if state.since else None,
                        now=now.isoformat(),
                        reason="the last transition is stamped after now; its times are "
                        "re-based on now so that new evidence counts",
                    )
                return SwitchOutcome(kept, (), outcome.refused)
            if adoption is not None and not outcome.transitions:
                # The adopted state exactly as the operator's file holds it, so that the
                # file's rewrite without the mark is not refused; any clock repair of its
                # times waits for the next run.
                return SwitchOutcome(start, transitions, outcome.refused)
            return SwitchOutcome(outcome.state, transitions, outcome.refused)

        outcome = self.store.change_switch(decide, now=now, history=self._history(), actor=actor)
        self._log(outcome, adoption)
        report = self.apply(outcome.state) if outcome.transitions else self.ensure_applied()
        self.export_metrics(outcome.state)
        return SwitchChange(outcome, report, adoption)

    def adopt_pending(self) -> SwitchChange | None:
        """Adopt a `pending_sync` state file (an emergency rollback written while the
        database was down) into the database as a transition at its generation, then
        apply it (the file is rewritten without the mark); None when there is none."""
        if not is_pending(read_state_file(self.state_file)):
            return None  # the common case costs one file read, no database lock
        now = self.clock()
        adoption: Transition | None = None

        def decide(state: SwitchState, history: list[Evaluation]) -> SwitchOutcome:
            nonlocal adoption
            adopted, adoption = pending_adoption(self.state_file, state, now)
            return SwitchOutcome(adopted, () if adoption is None else (adoption,))

        outcome = self.store.change_switch(decide, now=now, history=0)
        if adoption is None:
            return None
        self._log(outcome, adoption)
        report = self.apply(outcome.state)
        self.export_metrics(outcome.state)
        return SwitchChange(outcome, report, adoption)

    def _log(self, outcome: SwitchOutcome, adoption: Transition | None) -> None:
        if adoption is not None:
            log.warning(
                "switch.adopted_state_file",
                generation=adoption.generation,
                actor=adoption.actor,
                path=str(self.state_file),
            )
        for transition in outcome.transitions:
            log.warning(
                "switch.transition",
                generation=transition.generation,
                previous=transition.previous.value,
                target=transition.target.value,
                control=transition.control.value,
                actor=transition.actor,
                reason=transition.reason,
            )
            if self.metrics is not None:
                self.metrics.transition(transition.target.value, _actor_kind(transition.actor))
        for refusal in outcome.refused:
            log.warning("switch.refused", reason=refusal)

    def command(self, event: SwitchEvent) -> SwitchChange:
        """A human's rollback, restore or auto, as the policy allows it, then applied. A
        top-level restore that is not refused clears the latched FAIL of every arm's
        current revision and restarts its evidence at the restore."""
        now = self.clock()
        change = self._change([event], now, actor=f"user:{event.user}")
        if event.action == "restore" and event.category is None and not change.outcome.refused:
            restore = f"user:{event.user}: {event.reason}"
            restored = tuple(self.store.restore_revisions(now, restore))
            for window in restored:
                log.warning(
                    "switch.revision_restored",
                    arm=window.arm,
                    revision=window.revision,
                    cleared_failure=window.failure or None,
                    restore=restore,
                )
            change = replace(change, restored=restored)
        return change

    def step_gates(self, now: datetime) -> SwitchChange:
        """Let the policy act on the stored evaluations at `now`, then apply. The state
        file's `confirmed_at` moves only when the whole gate run completed
        (`complete_gate_run`), not here."""
        return self._change([], now)

    def complete_gate_run(self, now: datetime) -> None:
        """The leader's gate run of `now` completed: store that, then confirm the state
        file at `now` (the only place a file is confirmed without a transition)."""
        self.store.record_gate_run(now)
        self._confirm(self.record().state, now)

    def follow(self) -> SwitchChange | None:
        """A gate run of a daemon that does not lead: adopt a pending emergency rollback,
        else write the stored state to this host's state file, confirmed at the leader's
        last completed gate run (stored in the database), never at this host's clock: a
        frozen leader lets every file age. No policy step, no hooks, no actuation
        record: those are the leader's."""
        adopted = self.adopt_pending()
        if adopted is not None:
            return adopted
        record = self.record()
        self._carry_confirmation(record)
        self.export_metrics(record.state)
        return None

    def start(self, *, lead: bool = True) -> ApplyReport | None:
        """The daemon's start, before anything slow: remove temp files a killed writer
        left, adopt a pending emergency rollback, write the stored state to the state
        file (confirmed at the last completed gate run, as stored) and, when it leads
        (`lead`), re-run hooks whose last attempt failed."""
        try:
            removed = remove_leftover_temps(self.state_file)
        except OSError as exc:
            log.warning("switch.temp_cleanup_failed", path=str(self.state_file), error=str(exc))
        else:
            if removed:
                log.warning("switch.temp_files_removed", files=[str(p) for p in removed])
        if not lead:
            change = self.follow()
            return None if change is None else change.report
        report = self.ensure_applied()
        self.export_metrics(self.record().state)
        return report

    def export_metrics(self, state: SwitchState) -> None:
        if self.metrics is not None:
            self.metrics.set_state(
                rolled_back=state.mode is SwitchMode.ROLLED_BACK,
                generation=state.generation,
                latched=state.latched,
                categories=[
                    (name, own.mode is SwitchMode.ROLLED_BACK, own.latched)
                    for name, own in state.categories
                ],
            )

    def _latest(self) -> dict[str, Any] | None:
        """The newest state a hook may be sent, read again just before sending: the
        database's, or a pending emergency rollback in the state file above it."""
        on_disk = read_state_file(self.state_file)
        pending = without_freshness(on_disk) if is_pending(on_disk) and on_disk else None
        try:
            stored: dict[str, Any] | None = state_object(self.store.switch().state)
        except Exception as exc:  # the re-read only improves the order; never stop a hook
            log.warning("switch.hook_reread_failed", error=f"{type(exc).__name__}: {exc}")
            stored = None
        return newest(pending, stored)

    def _attempt(
        self, actuator: Actuator, state: dict[str, Any], *, again: bool = False
    ) -> str | None:
        return deliver(
            actuator,
            state,
            state_file=self.state_file,
            latest=self._latest,
            metrics=self.metrics,
            sleep=self.sleep,
            again=again,
        )

    def _write_file(self, state: SwitchState, confirmed_at: datetime | None) -> bool:
        """Write `state` to the state file, confirmed at `confirmed_at`; False when a
        newer (or the operator's pending) file was left in place. Raises OSError."""
        written = write_state_file(
            self.state_file,
            file_object(state, confirmed_at, self._routes),
            keep_routes=not self._routes_set,
        )
        self.state_file_problem = None
        return written

    def apply(
        self, state: SwitchState, *, hooks: bool = True, reapplied: SwitchRecord | None = None
    ) -> ApplyReport:
        """Mirror `state` to the state file, then run the hooks; record the result on the
        switch row. Failures are returned and recorded, never raised. A transition is
        confirmed now; a re-application of the stored `reapplied` is confirmed only as
        far as its last completed gate run says (no `confirmed_at` before the first)."""
        obj = state_object(state)
        failures: dict[str, str] = {}
        skipped = False
        confirmed_at = self.clock() if reapplied is None else reapplied.gates_completed_at
        try:
            skipped = not self._write_file(state, confirmed_at)
        except OSError as exc:
            failures[STATE_FILE_ACTUATOR] = f"cannot write {str(self.state_file)!r}: {exc}"
            self.state_file_problem = failures[STATE_FILE_ACTUATOR]
            if self.metrics is not None:
                self.metrics.actuator_failed(STATE_FILE_ACTUATOR)
            log.error("switch.state_file_failed", path=str(self.state_file), error=str(exc))
        if hooks:
            for actuator in self.actuators:
                error = self._attempt(actuator, obj)
                if error is not None:
                    failures[actuator.name] = error
        self.store.record_actuation(state.generation, failures, self.clock())
        return ApplyReport(state.generation, failures, skipped)

    def ensure_applied(self) -> ApplyReport | None:
        """Re-apply the stored state when its last application failed or the state file
        does not show it (a restart, a CLI whose hook failed, a file deleted by hand);
        None when nothing was needed. Alertmanager is re-pushed while rolled back. A
        pending emergency rollback in the state file is adopted first, never overwritten.
        A file that shows the state carries the stored last completed gate run forward
        as its `confirmed_at` when that is newer (same generation)."""
        adopted = self.adopt_pending()
        if adopted is not None:
            return adopted.report
        record = self.store.switch()
        state = record.state
        on_disk = read_state_file(self.state_file)
        if not record.applied or not shows(on_disk, state):
            return self.apply(state, hooks=not record.applied, reapplied=record)
        self._carry_confirmation(record, on_disk)
        now = self.clock()
        obj = state_object(state)
        failures: dict[str, str] = {}
        for actuator in self.actuators:
            if actuator.keepalive(obj, now):
                error = self._attempt(actuator, obj, again=True)
                if error is not None:
                    failures[actuator.name] = error
        if failures:
            self.store.record_actuation(state.generation, failures, now)
            return ApplyReport(state.generation, failures)
        return None

    @staticmethod
    def _parsed(value: Any) -> datetime | None:
        try:
            return datetime.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            return None

    def _carry_confirmation(
        self, record: SwitchRecord, on_disk: dict[str, Any] | None = None
    ) -> None:
        """Rewrite the file with the stored last completed gate run as its `confirmed_at`
        when that is newer than the file's own, or when its `route_to_baseline` is not
        the one set (nothing else changes)."""
        completed = record.gates_completed_at
        if completed is None:
            return
        on_disk = on_disk if on_disk is not None else read_state_file(self.state_file)
        current = self._parsed(on_disk.get(CONFIRMED_AT)) if on_disk else None
        stale_routes = (
            self._routes_set
            and on_disk is not None
            and on_disk.get(ROUTE_TO_BASELINE) != self._routes
        )
        if (
            current is None
            or current < completed
            or not shows(on_disk, record.state)
            or stale_routes
        ):
            self._confirm(record.state, completed)

    def _confirm(self, state: SwitchState, at: datetime) -> None:
        # A failed refresh leaves the file correct but ageing: a router reading it falls
        # back to its safe default once `confirmed_at` is too old, which is the point.
        try:
            self._write_file(state, at)
        except OSError as exc:
            self.state_file_problem = f"cannot write {str(self.state_file)!r}: {exc}"
            if self.metrics is not None:
                self.metrics.actuator_failed(STATE_FILE_ACTUATOR)
            log.error("switch.state_file_failed", path=str(self.state_file), error=str(exc))
