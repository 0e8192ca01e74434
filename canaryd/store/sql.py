"""The SQL store: `SqlStore`, canaryd's history and switch in SQLite (default) or
PostgreSQL, behind `canaryd.store.abc.Store`.

This module owns the `HistoryStore` half, `SqlHistoryStore`: the transactions and
queries behind runs, suites, pairs and their reads, retention (roll-up batches, then the
prompts, runs, switch audit rows and revisions that only history kept) and the roll-ups'
reads. `SqlStore` joins it with `canaryd.store.switching_sql.SqlSwitchStore` and
`canaryd.store.telemetry_sql.SqlTelemetryStore` by multiple inheritance (why, in
switching_sql); all share `canaryd.store.sql_base.SqlDatabase`, which opens
the database and translates its errors. The mapping between records and rows is in
`canaryd.store.mapping`.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Delete, Select, delete, exists, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from canaryd.store.abc import RETENTION_BATCH_PAIRS, History, RetentionReport, StoredRun
from canaryd.store.calibration_sql import SqlCalibrationStore
from canaryd.store.columns import aware
from canaryd.store.mapping import (
    facts_from_columns,
    facts_query,
    pair_from_row,
    pair_row,
    prompt_values,
    rollup_from_row,
    rollup_values,
    run_from_row,
    run_row,
)
from canaryd.store.models import (
    GenerationRow,
    PairRollupRow,
    PairRow,
    PairScoresRow,
    PromptRow,
    RevisionRow,
    RunRow,
    SuiteRow,
    SwitchAuditRow,
)
from canaryd.store.rollup import PairRollup, rollups_by_hour
from canaryd.store.serving import (
    SERVING_ROW_LIMIT,
    ServingFacts,
    serving_from_columns,
    serving_query,
)
from canaryd.store.sql_base import SqlDatabase
from canaryd.store.switching_sql import SqlSwitchStore
from canaryd.store.telemetry_sql import SqlTelemetryStore
from gates.records import PairRecord, Prompt, RunInfo

__all__ = ["SqlHistoryStore", "SqlStore"]


class SqlHistoryStore(SqlDatabase):
    """`HistoryStore` on SQLAlchemy: runs, suites, pairs, retention and roll-ups."""

    def create_run(self, run: RunInfo) -> None:
        aware(run.started_at, "run started_at")
        with self._transaction(f"creating run {run.run_id!r}") as session:
            session.add(run_row(run))

    def finish_run(self, run_id: str, finished_at: datetime) -> None:
        aware(finished_at, "run finished_at")
        with self._transaction(f"finishing run {run_id!r}") as session:
            result = session.execute(
                update(RunRow).where(RunRow.run_id == run_id).values(finished_at=finished_at)
            )
            if getattr(result, "rowcount", 0) != 1:
                raise LookupError(f"no run {run_id!r} in {self.url}")

    def record_suite(self, name: str, sha256: str, path: str) -> None:
        """Remember a version of a suite file (idempotent per name and sha256)."""
        values = {"name": name, "sha256": sha256, "path": path, "recorded_at": datetime.now(UTC)}
        with self._transaction(f"recording suite {name!r}") as session:
            session.execute(self._insert_ignoring_duplicates(SuiteRow, values, ["name", "sha256"]))

    def _prompt_ref(self, session: Session, prompt: Prompt) -> int:
        values = prompt_values(prompt)
        # Insert first: a write as the transaction's first statement takes SQLite's write
        # lock up front, so the busy timeout applies instead of a read-to-write deadlock.
        session.execute(self._insert_ignoring_duplicates(PromptRow, values, ["content_hash"]))
        return session.scalars(
            select(PromptRow.id).where(PromptRow.content_hash == values["content_hash"])
        ).one()

    def save_pair(self, record: PairRecord) -> None:
        """Store the pair, both generations and the scores in one transaction, or nothing."""
        aware(record.started_at, "pair started_at")
        with self._transaction(f"saving pair {record.pair_id!r}") as session:
            session.add(pair_row(record, self._prompt_ref(session, record.prompt)))

    def pairs(
        self,
        *,
        run_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        category: str | None = None,
        limit: int | None = None,
        arm: str | None = None,
    ) -> list[PairRecord]:
        """Pairs started in [since, until), oldest first; with `limit`, the most recent
        ones; with `arm`, only those of that speculative arm."""
        query = select(PairRow)
        if run_id is not None:
            query = query.where(PairRow.run_id == run_id)
        if since is not None:
            query = query.where(PairRow.started_at >= aware(since, "since"))
        if until is not None:
            query = query.where(PairRow.started_at < aware(until, "until"))
        if category is not None:
            query = query.where(PairRow.category == category)
        if arm is not None:
            query = query.where(PairRow.arm == arm)
        query = query.order_by(PairRow.started_at.desc(), PairRow.pair_id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._translating("reading pairs"), self._sessions() as session:
            rows = session.scalars(query).unique().all()
            return [pair_from_row(row) for row in reversed(rows)]

    def runs(self, limit: int | None = 20, *, kind: str | None = None) -> list[StoredRun]:
        """The most recent runs, newest first; with `kind`, only runs of that kind."""
        query = select(RunRow).order_by(RunRow.started_at.desc(), RunRow.run_id.desc())
        if kind is not None:
            query = query.where(RunRow.kind == kind)
        if limit is not None:
            query = query.limit(limit)
        with self._translating("reading runs"), self._sessions() as session:
            return [run_from_row(row) for row in session.scalars(query)]

    def runs_by_id(self, run_ids: Collection[str]) -> dict[str, StoredRun]:
        """The runs with these ids (missing ids are absent from the result)."""
        if not run_ids:
            return {}
        query = select(RunRow).where(RunRow.run_id.in_(sorted(set(run_ids))))
        with self._translating("reading runs"), self._sessions() as session:
            return {row.run_id: run_from_row(row) for row in session.scalars(query)}

    def categories(self) -> list[str]:
        """Every category that has at least one pair, sorted."""
        query = select(PairRow.category).distinct().order_by(PairRow.category)
        with self._translating("reading categories"), self._sessions() as session:
            return list(session.scalars(query))

    # --- retention and roll-ups ---------------------------------------------------------

    def apply_retention(
        self,
        now: datetime,
        raw_retention_days: float,
        rollup_retention_days: float,
        *,
        batch_pairs: int = RETENTION_BATCH_PAIRS,
    ) -> RetentionReport:
        """Roll up and delete raw pairs started before `now - raw_retention_days`, then
        delete roll-up hours that ended before `now - rollup_retention_days`.

        Each batch of at most `batch_pairs` pairs is one transaction: read, merge into the
        `pair_rollups` rows of their (hour, category), delete exactly those pairs with their
        generations and scores. A crash or a lost database mid-batch leaves the batch
        entirely raw, so re-running never counts a pair twice. Then the rows only raw
        pairs or history kept go: prompts no pair refers to, finished runs without pairs
        that ended before the roll-up cut-off, and switch audit rows older than it (the
        newest transition is always kept: it says why the switch is where it is). Raises
        `ValueError` for a naive `now` or a policy where roll-ups would not outlive the
        raw rows they summarise.
        """
        aware(now, "retention now")
        if raw_retention_days <= 0 or rollup_retention_days < raw_retention_days:
            raise ValueError(
                f"retention of raw pairs {raw_retention_days!r} days and of roll-ups "
                f"{rollup_retention_days!r} days: both must be positive, and roll-ups "
                f"kept at least as long as raw pairs"
            )
        if batch_pairs < 1:
            raise ValueError(f"batch_pairs={batch_pairs!r} must be at least 1")
        raw_cutoff = now - timedelta(days=raw_retention_days)
        rolled_up = 0
        while True:
            batch = self._roll_up_batch(raw_cutoff, batch_pairs)
            rolled_up += batch
            if batch == 0:
                break
        rollup_cutoff = now - timedelta(days=rollup_retention_days)
        with self._transaction("deleting old roll-ups") as session:
            # An hour is deleted once all of it is older than the cut-off.
            result = session.execute(
                delete(PairRollupRow).where(
                    PairRollupRow.hour_start <= rollup_cutoff - timedelta(hours=1)
                )
            )
            deleted_rollups = int(getattr(result, "rowcount", 0))
        return RetentionReport(
            rolled_up_pairs=rolled_up,
            deleted_pairs=rolled_up,
            deleted_rollups=deleted_rollups,
            deleted_prompts=self._prune("unused prompts", self._unused_prompts()),
            deleted_runs=self._prune("old runs", self._old_runs(rollup_cutoff)),
            deleted_audit_rows=self._prune("old switch audit rows", self._old_audit(rollup_cutoff)),
            deleted_revisions=self._prune("old revisions", self._old_revisions(rollup_cutoff)),
        )

    def erase_live_text(self, before: datetime) -> int:
        """Erase the text that `traffic.store_text` kept of live pairs started before
        `before`: both outputs, their token ids and error details, and the messages of
        live prompts that no newer pair refers to; hashes, figures and scores stay. How
        many generations lost text."""
        aware(before, "erase live text before")
        old_live = select(PairRow.pair_id).where(
            PairRow.source == "live", PairRow.started_at < before
        )
        with self._transaction("erasing old live text") as session:
            result = session.execute(
                update(GenerationRow)
                .where(
                    GenerationRow.pair_id.in_(old_live),
                    (GenerationRow.text != "") | (GenerationRow.error_detail != ""),
                )
                .values(text="", token_ids=[], error_detail="")
            )
            session.execute(
                update(PromptRow)
                .where(
                    PromptRow.id.in_(
                        select(PairRow.prompt_ref).where(PairRow.pair_id.in_(old_live))
                    ),
                    ~exists().where(
                        PairRow.prompt_ref == PromptRow.id, PairRow.started_at >= before
                    ),
                )
                .values(messages=[])
            )
            return int(getattr(result, "rowcount", 0))

    def _prune(self, what: str, statement: Delete) -> int:
        """Run one retention deletion in its own transaction; how many rows went. A pair
        saved meanwhile that refers to a row being deleted (PostgreSQL: a prompt picked
        up again) wins: the deletion fails on the foreign key, is rolled back whole, and
        the rows wait for the next run."""
        try:
            with self._transaction(f"deleting {what}") as session:
                return int(getattr(session.execute(statement), "rowcount", 0))
        except IntegrityError:
            return 0

    @staticmethod
    def _unused_prompts() -> Delete:
        # Only raw pairs refer to prompts; roll-ups are per category and keep none.
        return delete(PromptRow).where(~exists().where(PairRow.prompt_ref == PromptRow.id))

    @staticmethod
    def _old_runs(cutoff: datetime) -> Delete:
        # A run still running (or killed: never finished) is kept, and so is any run
        # with pairs: its rows are what the pairs were measured under.
        return delete(RunRow).where(
            RunRow.finished_at.is_not(None),
            RunRow.finished_at < cutoff,
            ~exists().where(PairRow.run_id == RunRow.run_id),
        )

    @staticmethod
    def _old_audit(cutoff: datetime) -> Delete:
        newest_transition = (
            select(func.max(SwitchAuditRow.id))
            .where(SwitchAuditRow.kind == "transition")
            .scalar_subquery()
        )
        return delete(SwitchAuditRow).where(
            SwitchAuditRow.at < cutoff, SwitchAuditRow.id != func.coalesce(newest_transition, 0)
        )

    @staticmethod
    def _old_revisions(cutoff: datetime) -> Delete:
        # A revision whose window ended (its arm's next one started) before the cut-off
        # has no pairs left to judge it by; an arm's latest revision is always kept. A
        # pruned name that comes back starts a new window, as a new revision does.
        later = aliased(RevisionRow)
        return delete(RevisionRow).where(
            exists().where(
                later.arm == RevisionRow.arm,
                later.started_at > RevisionRow.started_at,
                later.started_at < cutoff,
            )
        )

    def _roll_up_batch(self, cutoff: datetime, batch_pairs: int) -> int:
        postgresql = self._engine.dialect.name == "postgresql"
        with self._transaction("rolling up old pairs") as session:
            if not postgresql:
                # Take SQLite's write lock before reading, so a concurrent writer makes us
                # wait (busy timeout) instead of failing on a stale read snapshot.
                session.execute(text("UPDATE pair_rollups SET pairs = pairs WHERE 1 = 0"))
            oldest = (
                select(PairRow.pair_id)
                .where(PairRow.started_at < cutoff)
                .order_by(PairRow.started_at, PairRow.pair_id)
                .limit(batch_pairs)
            )
            if postgresql:
                # A concurrent retention (daemon and a manual run) takes other pairs.
                oldest = oldest.with_for_update(skip_locked=True)
            pair_ids = list(session.scalars(oldest))
            if not pair_ids:
                return 0
            facts = [
                facts_from_columns(row)
                for row in session.execute(facts_query().where(PairRow.pair_id.in_(pair_ids)))
            ]
            if len(facts) != len(pair_ids):  # pragma: no cover - save_pair writes both arms
                raise RuntimeError(f"{len(pair_ids) - len(facts)} pairs lack a generation")
            for rollup in rollups_by_hour(facts).values():
                self._merge_into_stored(session, rollup)
            for model in (PairScoresRow, GenerationRow):
                session.execute(delete(model).where(model.pair_id.in_(pair_ids)))
            deleted = session.execute(delete(PairRow).where(PairRow.pair_id.in_(pair_ids)))
            if getattr(deleted, "rowcount", 0) != len(pair_ids):  # pragma: no cover
                # Rolls the batch back: its pairs are counted only if exactly they go.
                raise RuntimeError("pairs being rolled up were deleted by someone else")
            return len(pair_ids)

    def _merge_into_stored(self, session: Session, rollup: PairRollup) -> None:
        # Create the row if missing without racing a concurrent creator, then lock it.
        empty = PairRollup(hour_start=rollup.hour_start, category=rollup.category, arm=rollup.arm)
        session.execute(
            self._insert_ignoring_duplicates(
                PairRollupRow, rollup_values(empty), ["hour_start", "category", "arm"]
            )
        )
        stored = session.scalars(
            select(PairRollupRow)
            .where(
                PairRollupRow.hour_start == rollup.hour_start,
                PairRollupRow.category == rollup.category,
                PairRollupRow.arm == rollup.arm,
            )
            .with_for_update()
        ).one()
        merged = rollup_from_row(stored).merge(rollup)
        session.execute(
            update(PairRollupRow)
            .where(PairRollupRow.id == stored.id)
            .values(rollup_values(merged))
            .execution_options(synchronize_session=False)
        )

    def _rollups_query(self, since: datetime | None, until: datetime | None) -> Select[Any]:
        query = select(PairRollupRow)
        if since is not None:
            query = query.where(PairRollupRow.hour_start >= aware(since, "since"))
        if until is not None:
            query = query.where(PairRollupRow.hour_start < aware(until, "until"))
        return query.order_by(PairRollupRow.hour_start, PairRollupRow.category, PairRollupRow.arm)

    def rollups(
        self, *, since: datetime | None = None, until: datetime | None = None
    ) -> list[PairRollup]:
        """Roll-ups of the hours starting in [since, until), oldest first, by category and
        arm."""
        with self._translating("reading roll-ups"), self._sessions() as session:
            return [
                rollup_from_row(row) for row in session.scalars(self._rollups_query(since, until))
            ]

    def pair_count(self, arm: str, since: datetime, until: datetime) -> int:
        """How many pairs of `arm` started in [since, until): raw pairs plus those rolled up
        in hours starting in it, counted in the database in one snapshot (as `history`)."""
        raw = (
            select(func.count())
            .select_from(PairRow)
            .where(PairRow.arm == arm)
            .where(PairRow.started_at >= aware(since, "since"))
            .where(PairRow.started_at < aware(until, "until"))
        )
        rolled = (
            select(func.coalesce(func.sum(PairRollupRow.pairs), 0))
            .where(PairRollupRow.arm == arm)
            .where(PairRollupRow.hour_start >= aware(since, "since"))
            .where(PairRollupRow.hour_start < aware(until, "until"))
        )
        with self._translating("counting pairs"), Session(self._snapshot_bind()) as session:
            return int(session.scalar(raw) or 0) + int(session.scalar(rolled) or 0)

    def _snapshot_bind(self) -> Any:
        """The engine, reading in one snapshot per transaction (SQLite's explicit BEGIN
        already gives one; PostgreSQL needs REPEATABLE READ)."""
        if self._engine.dialect.name == "postgresql":
            return self._engine.execution_options(isolation_level="REPEATABLE READ")
        return self._engine

    def history(self, since: datetime, until: datetime) -> History:
        """Raw pairs started in [since, until) and roll-ups of hours starting in it, read in
        one snapshot so that a retention batch committing meanwhile is not counted twice."""
        pairs_query = (
            facts_query()
            .where(PairRow.started_at >= aware(since, "since"))
            .where(PairRow.started_at < aware(until, "until"))
            .order_by(PairRow.started_at, PairRow.pair_id)
        )
        with self._translating("reading history"), Session(self._snapshot_bind()) as session:
            pairs = [facts_from_columns(row) for row in session.execute(pairs_query)]
            rollups = [
                rollup_from_row(row) for row in session.scalars(self._rollups_query(since, until))
            ]
        return History(pairs=pairs, rollups=rollups)

    def serving(
        self, since: datetime, until: datetime, *, limit: int = SERVING_ROW_LIMIT
    ) -> list[ServingFacts]:
        """The ITL summaries and fallback counts of the generations of raw pairs started
        in [since, until), newest first, at most `limit` rows (both arms' rows of a pair
        count)."""
        query = serving_query(aware(since, "since"), aware(until, "until"), limit)
        with self._translating("reading serving figures"), self._sessions() as session:
            return [serving_from_columns(row) for row in session.execute(query)]

    def latest_pair_started_at(self) -> datetime | None:
        """When the most recent raw pair started; None when no raw pair is stored."""
        with self._translating("reading the latest pair"), self._sessions() as session:
            return session.scalars(
                select(PairRow.started_at).order_by(PairRow.started_at.desc()).limit(1)
            ).first()

    def latest_rollup_hour(self) -> datetime | None:
        """The start of the most recent rolled-up hour; None when there are no roll-ups."""
        with self._translating("reading the latest roll-up"), self._sessions() as session:
            return session.scalars(select(func.max(PairRollupRow.hour_start))).one()


class SqlStore(SqlHistoryStore, SqlSwitchStore, SqlTelemetryStore, SqlCalibrationStore):
    """`Store` on SQLAlchemy: SQLite or PostgreSQL, schema managed by Alembic."""
