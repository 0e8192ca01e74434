"""The SQL store: `SqlStore`, canaryd's history and switch in SQLite (default) or
PostgreSQL, behind `canaryd.store.abc.Store`.

This module owns opening a store (URL, engine and schema check, or migrating an empty
database with `create`), the transactions and queries behind every `Store` method
(retention batches, the switch's locked read-modify-write), and turning a lost or
unusable database mid-run into `DatabaseError` with one line that says what failed, and
a value it refuses into `RecordRejectedError`; constraint violations are bugs and keep
SQLAlchemy's exception. Engines live in
`canaryd.store.database`, migrations in `canaryd.store.migrations`, and the mapping
between records and rows in `canaryd.store.mapping`.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Self

from sqlalchemy import Delete, Engine, Select, delete, exists, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
)
from sqlalchemy.orm import Session, aliased, sessionmaker

from canaryd.errors import DatabaseError, RecordRejectedError
from canaryd.store.abc import RETENTION_BATCH_PAIRS, History, RetentionReport, StoredRun
from canaryd.store.database import (
    SQLITE_DURABLE,
    SQLITE_IMMEDIATE,
    driver_message,
    make_engine,
    mask_url,
    parse_url,
    sqlite_path,
)
from canaryd.store.mapping import (
    audit_entry,
    aware,
    drift_reference_values,
    facts_from_columns,
    facts_query,
    gate_decision_rows,
    initial_switch_values,
    pair_from_row,
    pair_row,
    prompt_values,
    reference_from_row,
    refusal_audit_row,
    rollup_from_row,
    rollup_values,
    run_from_row,
    run_row,
    state_values,
    switch_record,
    transition_audit_row,
)
from canaryd.store.migrations import (
    head_revision,
    known_revisions,
    read_revision,
    schema_problem,
    upgrade_engine,
)
from canaryd.store.models import (
    DriftReferenceRow,
    GateDecisionRow,
    GenerationRow,
    PairRollupRow,
    PairRow,
    PairScoresRow,
    PromptRow,
    RevisionRow,
    RunRow,
    SuiteRow,
    SwitchAuditRow,
    SwitchStateRow,
)
from canaryd.store.rollup import PairRollup, rollups_by_hour
from canaryd.store.switching import (
    AuditEntry,
    RevisionWindow,
    SwitchRecord,
    decision_from_dict,
)
from gates import Evaluation, ReferenceStats, SwitchOutcome, SwitchState
from gates.records import PairRecord, Prompt, RunInfo

__all__ = ["SqlStore"]


class SqlStore:
    """`Store` on SQLAlchemy: SQLite or PostgreSQL, schema managed by Alembic."""

    def __init__(self, engine: Engine, url: URL) -> None:
        self._engine = engine
        self._url = url
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @property
    def url(self) -> str:
        """The database URL with its password masked."""
        return mask_url(self._url)

    @classmethod
    def open(cls, url: str, *, create: bool = False) -> SqlStore:
        """Connect and check the schema; with `create`, an empty database is migrated to head.

        Raises `DatabaseError` for a bad URL, an unreachable server, a database without
        the schema (and `create` false), an older schema, or one newer than this canaryd.
        """
        parsed = parse_url(url)
        path = sqlite_path(parsed)
        if not create and path is not None and not path.expanduser().exists():
            raise DatabaseError(
                f"no database file at {str(path)!r}; create it with "
                f"`canaryd db upgrade --url {shlex.quote(mask_url(parsed))}`"
            )
        engine = make_engine(url, create=create)
        try:
            current = read_revision(engine, parsed)
            if current is None and create:
                upgrade_engine(engine, parsed)
            else:
                problem = schema_problem(
                    current, head_revision(), known_revisions(), mask_url(parsed)
                )
                if problem is not None:
                    raise DatabaseError(problem)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, parsed)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._engine.dispose()

    @contextmanager
    def _translating(self, action: str) -> Iterator[None]:
        """A lost or unusable database becomes `DatabaseError`; the caller may buffer. A
        value the database refuses (NUL in text, an integer out of range) becomes
        `RecordRejectedError`, which buffering cannot cure."""
        try:
            yield
        except DataError as exc:
            raise RecordRejectedError(f"{action} on {self.url}", driver_message(exc)) from exc
        except OverflowError as exc:  # SQLite's driver: an integer beyond 64 bits
            raise RecordRejectedError(f"{action} on {self.url}", str(exc)) from exc
        except (OperationalError, InterfaceError) as exc:
            raise DatabaseError(f"{action} failed on {self.url}: {driver_message(exc)}") from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise DatabaseError(
                    f"{action} failed on {self.url}: {driver_message(exc)}"
                ) from exc
            raise

    @contextmanager
    def _transaction(self, action: str) -> Iterator[Session]:
        with self._translating(action), self._sessions.begin() as session:
            yield session

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

    def _insert_ignoring_duplicates(
        self, model: type[Any], values: dict[str, Any], unique: list[str]
    ) -> Any:
        if self._engine.dialect.name == "postgresql":
            return (
                postgresql_insert(model)
                .values(values)
                .on_conflict_do_nothing(index_elements=unique)
            )
        return sqlite_insert(model).values(values).on_conflict_do_nothing(index_elements=unique)

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

    def history(self, since: datetime, until: datetime) -> History:
        """Raw pairs started in [since, until) and roll-ups of hours starting in it, read in
        one snapshot so that a retention batch committing meanwhile is not counted twice."""
        pairs_query = (
            facts_query()
            .where(PairRow.started_at >= aware(since, "since"))
            .where(PairRow.started_at < aware(until, "until"))
            .order_by(PairRow.started_at, PairRow.pair_id)
        )
        bind = self._engine
        if bind.dialect.name == "postgresql":
            # SQLite's explicit BEGIN already gives one snapshot per transaction.
            bind = bind.execution_options(isolation_level="REPEATABLE READ")
        with self._translating("reading history"), Session(bind) as session:
            pairs = [facts_from_columns(row) for row in session.execute(pairs_query)]
            rollups = [
                rollup_from_row(row) for row in session.scalars(self._rollups_query(since, until))
            ]
        return History(pairs=pairs, rollups=rollups)

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

    # --- the rollback switch, its audit trail, gate decisions ---------------------------

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

    def start_revision(self, arm: str, revision: str, at: datetime) -> RevisionWindow:
        """Start the window of `revision` of `arm` at `at`, ending the arm's latest one;
        a revision already started keeps its window (idempotent, also between daemons)."""
        values = {"arm": arm, "revision": revision, "started_at": aware(at, "revision start")}
        with self._transaction(f"starting revision {revision!r}") as session:
            session.execute(
                self._insert_ignoring_duplicates(RevisionRow, values, ["arm", "revision"])
            )
            window = self._revision_window(session, arm, revision)
        assert window is not None  # inserted above or before
        return window
