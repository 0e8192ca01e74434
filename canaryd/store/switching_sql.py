"""The switch in SQL: `SqlSwitchStore`, the `SwitchStore` half of `SqlStore`.

This module owns the queries behind the durable switch: its state read and changed under
the row lock (SQLite `BEGIN IMMEDIATE`, PostgreSQL `SELECT … FOR UPDATE`), how far it has
been actuated, the leader's completed gate runs, the audit trail, gate evaluations, the
pinned drift references and the evidence windows of revisions. The records are declared
in `canaryd.store.switching` and mapped to rows in `canaryd.store.switching_mapping`.
`SqlStore` is this class and `SqlHistoryStore` by multiple inheritance over the one
`SqlDatabase` base, rather than a composition that forwards each method: every method of
both protocols stays a plain method of `SqlStore` with nothing to keep in step, both
halves share one engine (one pool, one `close`), and neither overrides the other, so the
method resolution order only ever reaches `SqlDatabase` for the shared plumbing. Alone,
`SqlSwitchStore.open(url)` is a `SwitchStore`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from canaryd.store.columns import aware
from canaryd.store.database import SQLITE_DURABLE, SQLITE_IMMEDIATE
from canaryd.store.sql_base import SqlDatabase
from canaryd.store.switching import (
    AuditEntry,
    RevisionWindow,
    SwitchRecord,
    decision_from_dict,
)
from canaryd.store.switching_mapping import (
    audit_entry,
    drift_reference_values,
    gate_decision_rows,
    initial_switch_values,
    reference_from_row,
    refusal_audit_row,
    state_values,
    switch_record,
    transition_audit_row,
)
from canaryd.store.switching_models import (
    DriftReferenceRow,
    GateDecisionRow,
    RevisionRow,
    SwitchAuditRow,
    SwitchStateRow,
)
from gates import Evaluation, ReferenceStats, SwitchOutcome, SwitchState

__all__ = ["SqlSwitchStore"]


class SqlSwitchStore(SqlDatabase):
    """`SwitchStore` on SQLAlchemy: the switch, its audit trail, gate decisions, drift
    references and revision windows."""

    def switch(self) -> SwitchRecord:
        """The stored switch; the initial state (auto, generation 0) if never changed."""
        with self._translating("reading the switch"), self._sessions() as session:
            row = session.get(SwitchStateRow, 1)
            return switch_record(row)

    @contextmanager
    def _switch_locked(self, action: str) -> Iterator[tuple[Session, SwitchStateRow]]:
        """A transaction holding the switch row's lock (created if missing): SQLite
        `BEGIN IMMEDIATE`, PostgreSQL `SELECT … FOR UPDATE`. CLI and daemon serialise here.
        On SQLite its commit is synced (`synchronous=FULL`): a switch transition survives
        a power loss, which the pairs' faster NORMAL level does not promise under WAL."""
        with self._translating(action), self._engine.connect() as connection:
            connection.execution_options(**{SQLITE_IMMEDIATE: True, SQLITE_DURABLE: True})
            with Session(bind=connection) as session, session.begin():
                session.execute(
                    self._insert_ignoring_duplicates(
                        SwitchStateRow, initial_switch_values(), ["id"]
                    )
                )
                row = session.scalars(
                    select(SwitchStateRow).where(SwitchStateRow.id == 1).with_for_update()
                ).one()
                yield session, row

    def change_switch(
        self,
        decide: Callable[[SwitchState, list[Evaluation]], SwitchOutcome],
        *,
        now: datetime,
        history: int,
        actor: str = "",
    ) -> SwitchOutcome:
        """Read-modify-write of the switch under its row lock, in one transaction.

        `decide` gets the stored state and the last `history` evaluations up to `now`
        (oldest first; ones stamped later by a clock that was ahead cannot crowd out
        today's) and returns the policy's outcome; its state is stored, each transition becomes a
        `transition` audit row and each refusal a `refused` row by `actor` (with the
        latest evaluation as evidence). A generation below the stored one is refused.
        """
        aware(now, "switch change time")
        with self._switch_locked("changing the switch") as (session, row):
            current = switch_record(row).state
            evaluations = self._evaluations(session, history, until=now)
            outcome = decide(current, evaluations)
            new = outcome.state
            if new.generation < current.generation:
                raise RuntimeError(
                    f"switch generation would go back from {current.generation} to {new.generation}"
                )
            if new != current:
                session.execute(
                    update(SwitchStateRow)
                    .where(SwitchStateRow.id == 1)
                    .values(state_values(new))
                    .execution_options(synchronize_session=False)
                )
            session.add_all(transition_audit_row(t) for t in outcome.transitions)
            latest = evaluations[-1].decisions if evaluations else ()
            session.add_all(
                refusal_audit_row(new, now, actor, refusal, latest) for refusal in outcome.refused
            )
            return outcome

    def record_actuation(self, generation: int, errors: Mapping[str, str], at: datetime) -> bool:
        """Remember how applying `generation` went (no errors: applied). Ignored, and
        False returned, when the switch has moved past `generation` meanwhile."""
        aware(at, "actuation time")
        with self._switch_locked("recording the switch's actuation") as (session, row):
            if row.generation != generation:
                return False
            values: dict[str, Any] = {"actuator_errors": dict(errors), "actuated_at": at}
            if not errors:
                values["applied_generation"] = generation
            session.execute(
                update(SwitchStateRow)
                .where(SwitchStateRow.id == 1)
                .values(values)
                .execution_options(synchronize_session=False)
            )
            return True

    def record_gate_run(self, at: datetime) -> None:
        """Remember that the leader's gate run of `at` completed (the switch row is created
        if missing; a time older than the stored one is ignored)."""
        aware(at, "gate run time")
        with self._switch_locked("recording a completed gate run") as (session, row):
            if row.gates_completed_at is not None and row.gates_completed_at >= at:
                return
            session.execute(
                update(SwitchStateRow)
                .where(SwitchStateRow.id == 1)
                .values(gates_completed_at=at)
                .execution_options(synchronize_session=False)
            )

    def audit(self, *, since: datetime | None = None, limit: int | None = None) -> list[AuditEntry]:
        """Audit rows at or after `since`, oldest first; with `limit`, the most recent."""
        query = select(SwitchAuditRow)
        if since is not None:
            query = query.where(SwitchAuditRow.at >= aware(since, "since"))
        query = query.order_by(SwitchAuditRow.at.desc(), SwitchAuditRow.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._translating("reading the audit trail"), self._sessions() as session:
            return [audit_entry(row) for row in reversed(session.scalars(query).all())]

    def save_evaluation(self, evaluation: Evaluation, *, comparison_arm: str | None = None) -> None:
        """Store one evaluation: a row per gate decision, all at `evaluation.at`; of the
        comparison arm `comparison_arm` (never read by the switch), else of the switch's
        arm."""
        aware(evaluation.at, "evaluation time")
        with self._transaction("saving gate decisions") as session:
            session.add_all(gate_decision_rows(evaluation, comparison_arm))

    def _evaluations(
        self,
        session: Session,
        limit: int,
        *,
        until: datetime | None = None,
        comparison_arm: str | None = None,
    ) -> list[Evaluation]:
        if limit < 1:
            return []
        of_arm = (
            GateDecisionRow.comparison_arm.is_(None)
            if comparison_arm is None
            else GateDecisionRow.comparison_arm == comparison_arm
        )
        times_query = select(GateDecisionRow.evaluated_at).where(of_arm).distinct()
        rows_query = select(GateDecisionRow).where(of_arm)
        if until is not None:
            times_query = times_query.where(GateDecisionRow.evaluated_at <= until)
            rows_query = rows_query.where(GateDecisionRow.evaluated_at <= until)
        times = list(
            session.scalars(times_query.order_by(GateDecisionRow.evaluated_at.desc()).limit(limit))
        )
        if not times:
            return []
        rows = session.scalars(
            rows_query.where(GateDecisionRow.evaluated_at >= min(times)).order_by(
                GateDecisionRow.evaluated_at, GateDecisionRow.id
            )
        )
        grouped: dict[datetime, list[Any]] = {}
        for row in rows:
            grouped.setdefault(row.evaluated_at, []).append(decision_from_dict(row.decision))
        return [Evaluation(at, tuple(decisions)) for at, decisions in grouped.items()]

    def evaluations(self, limit: int, *, comparison_arm: str | None = None) -> list[Evaluation]:
        """The last `limit` evaluations of the switch's arm (or of `comparison_arm`),
        oldest first."""
        with self._translating("reading gate decisions"), self._sessions() as session:
            return self._evaluations(session, limit, comparison_arm=comparison_arm)

    def latest_evaluation(self, *, comparison_arm: str | None = None) -> Evaluation | None:
        found = self.evaluations(1, comparison_arm=comparison_arm)
        return found[0] if found else None

    def prune_gate_decisions(self, before: datetime) -> int:
        """Delete gate decisions evaluated before `before`; returns how many."""
        with self._transaction("pruning gate decisions") as session:
            result = session.execute(
                delete(GateDecisionRow).where(
                    GateDecisionRow.evaluated_at < aware(before, "before")
                )
            )
            return int(getattr(result, "rowcount", 0))

    def drift_references(self, arms: str) -> dict[str, ReferenceStats]:
        """The pinned acceptance-length reference of each category under the arms
        configuration keyed `arms` (another draft length or drafter has its own)."""
        query = select(DriftReferenceRow).where(DriftReferenceRow.arms == arms)
        with self._translating("reading drift references"), self._sessions() as session:
            return {row.category: reference_from_row(row) for row in session.scalars(query)}

    def pin_drift_references(
        self,
        references: Mapping[str, ReferenceStats],
        at: datetime,
        arms: str,
        *,
        replace: bool = False,
    ) -> None:
        """Pin references for categories that have none under `arms`; an existing pin is
        kept, unless `replace` (a pin grown from more pairs) — and even then only by one
        measured from more pairs, so two daemons growing the same pin cannot shrink it."""
        aware(at, "pin time")
        with self._transaction("pinning drift references") as session:
            for category, stats in sorted(references.items()):
                if replace:
                    session.execute(
                        delete(DriftReferenceRow).where(
                            DriftReferenceRow.arms == arms,
                            DriftReferenceRow.category == category,
                            DriftReferenceRow.n < stats.n,
                        )
                    )
                values = drift_reference_values(category, stats, at, arms)
                session.execute(
                    self._insert_ignoring_duplicates(
                        DriftReferenceRow, values, ["arms", "category"]
                    )
                )

    def unpin_drift_references(self, categories: Collection[str] = ()) -> int:
        """Forget the pinned references of `categories` under every arms configuration
        (all when empty); they are pinned again from healthy pairs."""
        query = delete(DriftReferenceRow)
        if categories:
            query = query.where(DriftReferenceRow.category.in_(list(categories)))
        with self._transaction("unpinning drift references") as session:
            return int(getattr(session.execute(query), "rowcount", 0))

    def revision_window(self, arm: str, revision: str) -> RevisionWindow | None:
        """The evidence window of `revision` of `arm`; None when no request named it yet."""
        with self._translating("reading a revision window"), self._sessions() as session:
            return self._revision_window(session, arm, revision)

    def _revision_window(self, session: Session, arm: str, revision: str) -> RevisionWindow | None:
        started = session.scalars(
            select(RevisionRow.started_at).where(
                RevisionRow.arm == arm, RevisionRow.revision == revision
            )
        ).one_or_none()
        if started is None:
            return None
        ended = session.scalars(
            select(func.min(RevisionRow.started_at)).where(
                RevisionRow.arm == arm, RevisionRow.started_at > started
            )
        ).one_or_none()
        return RevisionWindow(arm, revision, started, ended)

    def start_revision(
        self, arm: str, revision: str, at: datetime, *, keep: int | None = None
    ) -> RevisionWindow:
        """Start the window of `revision` of `arm` at `at`, ending the arm's latest one;
        a revision already started keeps its window (idempotent, also between daemons).
        With `keep`, only the arm's `keep` newest windows stay; older ones are forgotten
        (a window ends where the next starts, so the newer ones do not change)."""
        values = {"arm": arm, "revision": revision, "started_at": aware(at, "revision start")}
        with self._transaction(f"starting revision {revision!r}") as session:
            session.execute(
                self._insert_ignoring_duplicates(RevisionRow, values, ["arm", "revision"])
            )
            if keep is not None:
                oldest_kept = session.scalars(
                    select(RevisionRow.started_at)
                    .where(RevisionRow.arm == arm)
                    .order_by(RevisionRow.started_at.desc())
                    .offset(keep - 1)
                    .limit(1)
                ).one_or_none()
                if oldest_kept is not None:
                    session.execute(
                        delete(RevisionRow).where(
                            RevisionRow.arm == arm,
                            RevisionRow.started_at < oldest_kept,
                            RevisionRow.revision != revision,
                        )
                    )
            window = self._revision_window(session, arm, revision)
        assert window is not None  # inserted above or before
        return window
