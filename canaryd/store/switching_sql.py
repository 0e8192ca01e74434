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

from sqlalchemy import Connection, Row, delete, func, insert, select, update

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
    gate_decision_values,
    initial_switch_values,
    reference_from_row,
    refusal_audit_values,
    state_values,
    switch_record,
    transition_audit_values,
)
from canaryd.store.switching_tables import (
    drift_references,
    gate_decisions,
    revisions,
    switch_audit,
    switch_state,
)
from gates import Evaluation, ReferenceStats, SwitchOutcome, SwitchState

__all__ = ["SqlSwitchStore"]


class SqlSwitchStore(SqlDatabase):
    """`SwitchStore` on SQLAlchemy Core: the switch, its audit trail, gate decisions, drift
    references and revision windows. Core rather than ORM sessions: `canaryd switch`
    starts in an incident, and the ORM is most of SQLAlchemy's import time."""

    def switch(self) -> SwitchRecord:
        """The stored switch; the initial state (auto, generation 0) if never changed."""
        query = select(switch_state).where(switch_state.c.id == 1)
        with self._connection("reading the switch") as connection:
            return switch_record(connection.execute(query).one_or_none())

    @contextmanager
    def _switch_locked(self, action: str) -> Iterator[tuple[Connection, Row[Any]]]:
        """A transaction holding the switch row's lock (created if missing): SQLite
        `BEGIN IMMEDIATE`, PostgreSQL `SELECT … FOR UPDATE`. CLI and daemon serialise here.
        On SQLite its commit is synced (`synchronous=FULL`): a switch transition survives
        a power loss, which the pairs' faster NORMAL level does not promise under WAL."""
        with self._translating(action), self._engine.connect() as connection:
            connection.execution_options(**{SQLITE_IMMEDIATE: True, SQLITE_DURABLE: True})
            with connection.begin():
                connection.execute(
                    self._insert_ignoring_duplicates(switch_state, initial_switch_values(), ["id"])
                )
                row = connection.execute(
                    select(switch_state).where(switch_state.c.id == 1).with_for_update()
                ).one()
                yield connection, row

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
        with self._switch_locked("changing the switch") as (connection, row):
            current = switch_record(row).state
            evaluations = self._evaluations(connection, history, until=now)
            outcome = decide(current, evaluations)
            new = outcome.state
            if new.generation < current.generation:
                raise RuntimeError(
                    f"switch generation would go back from {current.generation} to {new.generation}"
                )
            if new != current:
                connection.execute(
                    update(switch_state).where(switch_state.c.id == 1).values(state_values(new))
                )
            latest = evaluations[-1].decisions if evaluations else ()
            audit_rows = [transition_audit_values(t) for t in outcome.transitions] + [
                refusal_audit_values(new, now, actor, refusal, latest)
                for refusal in outcome.refused
            ]
            for values in audit_rows:  # one by one: in order, and rows may differ in keys
                connection.execute(insert(switch_audit).values(values))
            return outcome

    def record_actuation(self, generation: int, errors: Mapping[str, str], at: datetime) -> bool:
        """Remember how applying `generation` went (no errors: applied). Ignored, and
        False returned, when the switch has moved past `generation` meanwhile."""
        aware(at, "actuation time")
        with self._switch_locked("recording the switch's actuation") as (connection, row):
            if row.generation != generation:
                return False
            values: dict[str, Any] = {"actuator_errors": dict(errors), "actuated_at": at}
            if not errors:
                values["applied_generation"] = generation
            connection.execute(update(switch_state).where(switch_state.c.id == 1).values(values))
            return True

    def record_gate_run(self, at: datetime) -> None:
        """Remember that the leader's gate run of `at` completed (the switch row is created
        if missing; a time older than the stored one is ignored)."""
        aware(at, "gate run time")
        with self._switch_locked("recording a completed gate run") as (connection, row):
            if row.gates_completed_at is not None and row.gates_completed_at >= at:
                return
            connection.execute(
                update(switch_state).where(switch_state.c.id == 1).values(gates_completed_at=at)
            )

    def audit(self, *, since: datetime | None = None, limit: int | None = None) -> list[AuditEntry]:
        """Audit rows at or after `since`, oldest first; with `limit`, the most recent."""
        query = select(switch_audit)
        if since is not None:
            query = query.where(switch_audit.c.at >= aware(since, "since"))
        query = query.order_by(switch_audit.c.at.desc(), switch_audit.c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._connection("reading the audit trail") as connection:
            return [audit_entry(row) for row in reversed(connection.execute(query).all())]

    def save_evaluation(self, evaluation: Evaluation, *, comparison_arm: str | None = None) -> None:
        """Store one evaluation: a row per gate decision, all at `evaluation.at`; of the
        comparison arm `comparison_arm` (never read by the switch), else of the switch's
        arm."""
        aware(evaluation.at, "evaluation time")
        rows = gate_decision_values(evaluation, comparison_arm)
        with self._connection("saving gate decisions") as connection:
            if rows:
                connection.execute(insert(gate_decisions), rows)

    def _evaluations(
        self,
        connection: Connection,
        limit: int,
        *,
        until: datetime | None = None,
        comparison_arm: str | None = None,
    ) -> list[Evaluation]:
        if limit < 1:
            return []
        table = gate_decisions
        of_arm = (
            table.c.comparison_arm.is_(None)
            if comparison_arm is None
            else table.c.comparison_arm == comparison_arm
        )
        times_query = select(table.c.evaluated_at).where(of_arm).distinct()
        rows_query = select(table.c.evaluated_at, table.c.decision).where(of_arm)
        if until is not None:
            times_query = times_query.where(table.c.evaluated_at <= until)
            rows_query = rows_query.where(table.c.evaluated_at <= until)
        times = list(
            connection.scalars(times_query.order_by(table.c.evaluated_at.desc()).limit(limit))
        )
        if not times:
            return []
        rows = connection.execute(
            rows_query.where(table.c.evaluated_at >= min(times)).order_by(
                table.c.evaluated_at, table.c.id
            )
        )
        grouped: dict[datetime, list[Any]] = {}
        for row in rows:
            grouped.setdefault(row.evaluated_at, []).append(decision_from_dict(row.decision))
        return [Evaluation(at, tuple(decisions)) for at, decisions in grouped.items()]

    def evaluations(self, limit: int, *, comparison_arm: str | None = None) -> list[Evaluation]:
        """The last `limit` evaluations of the switch's arm (or of `comparison_arm`),
        oldest first."""
        with self._connection("reading gate decisions") as connection:
            return self._evaluations(connection, limit, comparison_arm=comparison_arm)

    def latest_evaluation(self, *, comparison_arm: str | None = None) -> Evaluation | None:
        found = self.evaluations(1, comparison_arm=comparison_arm)
        return found[0] if found else None

    def prune_gate_decisions(self, before: datetime) -> int:
        """Delete gate decisions evaluated before `before`; returns how many."""
        query = delete(gate_decisions).where(
            gate_decisions.c.evaluated_at < aware(before, "before")
        )
        with self._connection("pruning gate decisions") as connection:
            return int(getattr(connection.execute(query), "rowcount", 0))

    def drift_references(self, arms: str) -> dict[str, ReferenceStats]:
        """The pinned acceptance-length reference of each category under the arms
        configuration keyed `arms` (another draft length or drafter has its own)."""
        query = select(drift_references).where(drift_references.c.arms == arms)
        with self._connection("reading drift references") as connection:
            return {row.category: reference_from_row(row) for row in connection.execute(query)}

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
        table = drift_references
        with self._connection("pinning drift references") as connection:
            for category, stats in sorted(references.items()):
                if replace:
                    connection.execute(
                        delete(table).where(
                            table.c.arms == arms,
                            table.c.category == category,
                            table.c.n < stats.n,
                        )
                    )
                values = drift_reference_values(category, stats, at, arms)
                connection.execute(
                    self._insert_ignoring_duplicates(table, values, ["arms", "category"])
                )

    def unpin_drift_references(self, categories: Collection[str] = ()) -> int:
        """Forget the pinned references of `categories` under every arms configuration
        (all when empty); they are pinned again from healthy pairs."""
        query = delete(drift_references)
        if categories:
            query = query.where(drift_references.c.category.in_(list(categories)))
        with self._connection("unpinning drift references") as connection:
            return int(getattr(connection.execute(query), "rowcount", 0))

    def revision_window(self, arm: str, revision: str) -> RevisionWindow | None:
        """The evidence window of `revision` of `arm`; None when no request named it yet."""
        with self._connection("reading a revision window") as connection:
            return self._revision_window(connection, arm, revision)

    def _revision_window(
        self, connection: Connection, arm: str, revision: str
    ) -> RevisionWindow | None:
        row = connection.execute(
            select(revisions).where(revisions.c.arm == arm, revisions.c.revision == revision)
        ).one_or_none()
        return None if row is None else self._window_of(connection, row)

    @staticmethod
    def _window_of(connection: Connection, row: Row[Any]) -> RevisionWindow:
        """The window of a `revisions` row: it ends where the arm's next one starts."""
        ended = connection.scalars(
            select(func.min(revisions.c.started_at)).where(
                revisions.c.arm == row.arm, revisions.c.started_at > row.started_at
            )
        ).one_or_none()
        return RevisionWindow(
            row.arm,
            row.revision,
            row.started_at,
            ended,
            failed_at=row.failed_at,
            failure=row.failure or "",
            restored_at=row.restored_at,
            restore=row.restore or "",
            increased_at=row.increased_at,
        )

    def current_revision(self, arm: str) -> RevisionWindow | None:
        """The window of the revision `arm` serves now (its latest); None when no request
        named one yet."""
        query = (
            select(revisions)
            .where(revisions.c.arm == arm)
            .order_by(revisions.c.started_at.desc())
            .limit(1)
        )
        with self._connection("reading the current revision") as connection:
            row = connection.execute(query).one_or_none()
            return None if row is None else self._window_of(connection, row)

    def latch_revision(self, arm: str, revision: str, at: datetime, failure: str) -> bool:
        """Latch the FAIL of `revision` of `arm` judged at `at`, because of `failure`; the
        first FAIL stands (a later one changes nothing), and one judged before the
        operator's last restore is not latched. True when this call latched it."""
        aware(at, "failure time")
        table = revisions
        query = (
            update(table)
            .where(
                table.c.arm == arm,
                table.c.revision == revision,
                table.c.failed_at.is_(None),
                (table.c.restored_at.is_(None)) | (table.c.restored_at <= at),
            )
            .values(failed_at=at, failure=failure)
        )
        with self._connection(f"latching the FAIL of revision {revision!r}") as connection:
            return bool(getattr(connection.execute(query), "rowcount", 0))

    def restore_revisions(self, at: datetime, restore: str) -> list[RevisionWindow]:
        """An operator's restore at `at` (`restore`: who and why) clears the latched FAIL
        of every arm's current revision, whose evidence restarts at `at`; returns the
        windows as they were before (those latched are the ones it cleared)."""
        aware(at, "restore time")
        table = revisions
        later = table.alias("later")
        latest = ~(
            select(later.c.arm)
            .where(later.c.arm == table.c.arm, later.c.started_at > table.c.started_at)
            .exists()
        )
        with self._connection("restoring the current revisions") as connection:
            rows = connection.execute(select(table).where(latest)).all()
            before = [self._window_of(connection, row) for row in rows]
            for window in before:
                connection.execute(
                    update(table)
                    .where(table.c.arm == window.arm, table.c.revision == window.revision)
                    .values(failed_at=None, failure=None, restored_at=at, restore=restore)
                )
        return before

    def mark_increase(self, arm: str, revision: str, at: datetime) -> None:
        """Remember that a traffic increase of `revision` of `arm` was confirmed at `at`."""
        aware(at, "increase time")
        query = (
            update(revisions)
            .where(revisions.c.arm == arm, revisions.c.revision == revision)
            .values(increased_at=at)
        )
        with self._connection(f"marking a traffic increase of {revision!r}") as connection:
            connection.execute(query)

    def start_revision(
        self, arm: str, revision: str, at: datetime, *, keep: int | None = None
    ) -> RevisionWindow:
        """Start the window of `revision` of `arm` at `at`, ending the arm's latest one;
        a revision already started keeps its window (idempotent, also between daemons).
        With `keep`, only the arm's `keep` newest windows stay; older ones are forgotten
        (a window ends where the next starts, so the newer ones do not change)."""
        values = {"arm": arm, "revision": revision, "started_at": aware(at, "revision start")}
        with self._connection(f"starting revision {revision!r}") as connection:
            connection.execute(
                self._insert_ignoring_duplicates(revisions, values, ["arm", "revision"])
            )
            if keep is not None:
                oldest_kept = connection.scalars(
                    select(revisions.c.started_at)
                    .where(revisions.c.arm == arm)
                    .order_by(revisions.c.started_at.desc())
                    .offset(keep - 1)
                    .limit(1)
                ).one_or_none()
                if oldest_kept is not None:
                    connection.execute(
                        delete(revisions).where(
                            revisions.c.arm == arm,
                            revisions.c.started_at < oldest_kept,
                            revisions.c.revision != revision,
                        )
                    )
            window = self._revision_window(connection, arm, revision)
        assert window is not None  # inserted above or before
        return window
