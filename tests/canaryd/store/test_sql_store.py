"""Behaviour of `SqlStore`, run against every backend (SQLite and PostgreSQL)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import Connection, func, select, table, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from canaryd.errors import DatabaseError
from canaryd.store import (
    HistoryStore,
    SqlHistoryStore,
    SqlStore,
    SqlSwitchStore,
    Store,
    SwitchStore,
    head_revision,
    schema_problem,
)
from canaryd.store.database import make_engine
from engine.types import AcceptanceSource, SpeculativeStats
from gates import ReferenceStats
from gates.records import PairRecord, Prompt, RunInfo

T0 = datetime(2025, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)
PairFactory = Callable[..., PairRecord]


@contextmanager
def raw(url: str) -> Iterator[Connection]:
    """A plain connection to the same database, to look at rows behind the store's back."""
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        engine.dispose()


def count(url: str, name: str) -> int:
    with raw(url) as connection:
        return int(connection.execute(select(func.count()).select_from(table(name))).scalar_one())


class TestOpen:
    def test_sqlstore_is_a_store(self, store: SqlStore) -> None:
        """SqlStore satisfies the Store protocol that the daemon depends on."""
        as_protocol: Store = store
        assert as_protocol.categories() == []

    def test_each_half_opens_alone_and_reads_what_sqlstore_wrote(
        self, store: SqlStore, database_url: str
    ) -> None:
        """`SqlHistoryStore` and `SqlSwitchStore` are each their protocol on their own, over
        the same database as the `SqlStore` that joins them."""
        pin = ReferenceStats(2.0, 0.6, 30, 0.6, 0.3)
        store.pin_drift_references({"code": pin}, T0, "arms-a")
        with (
            SqlHistoryStore.open(database_url) as history,
            SqlSwitchStore.open(database_url) as switch,
        ):
            as_history: HistoryStore = history
            as_switch: SwitchStore = switch
            assert [run.info.run_id for run in as_history.runs()] == ["run-1"]
            assert as_switch.drift_references("arms-a") == {"code": pin}
            assert not hasattr(history, "change_switch") and not hasattr(switch, "save_pair")

    def test_empty_database_with_create_is_migrated_to_head(self, database_url: str) -> None:
        """Opening an empty database with create=True creates the schema, as `canaryd once` does."""
        with SqlStore.open(database_url, create=True) as store:
            assert store.pairs() == []
        with raw(database_url) as connection:
            assert connection.execute(text("SELECT version_num FROM alembic_version")).all() == [
                (head_revision(),)
            ]

    def test_empty_database_without_create_is_refused(self, database_url: str) -> None:
        """Without create, an unmigrated database is refused with the command that fixes it."""
        with pytest.raises(DatabaseError, match=r"canaryd db upgrade --url") as caught:
            SqlStore.open(database_url)
        assert "\n" not in str(caught.value)

    def test_newer_revision_is_refused(self, database_url: str) -> None:
        """A database migrated by a newer canaryd is refused, even with create=True."""
        SqlStore.open(database_url, create=True).close()
        with raw(database_url) as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
        with pytest.raises(DatabaseError, match=r"'9999_future', which is newer than this canaryd"):
            SqlStore.open(database_url, create=True)

    def test_password_is_masked_in_the_store_url(self, store: SqlStore) -> None:
        """The URL a store reports never contains the password."""
        assert "canaryd:canaryd@" not in store.url


class TestSchemaProblem:
    def test_older_revision_says_to_upgrade(self) -> None:
        """A known but older revision asks for `canaryd db upgrade` with the URL."""
        problem = schema_problem("0001", "0002", {"0001", "0002"}, "sqlite:////x.db")
        assert problem == (
            "database sqlite:////x.db is at schema revision '0001', but this canaryd needs "
            "'0002'; run `canaryd db upgrade --url sqlite:////x.db`"
        )

    def test_current_revision_is_no_problem(self) -> None:
        """The head revision needs nothing."""
        assert schema_problem("0002", "0002", {"0001", "0002"}, "sqlite:////x.db") is None


class TestSqlitePragmas:
    def test_wal_busy_timeout_and_foreign_keys(self, tmp_path: Path) -> None:
        """SQLite connections use WAL, wait for a busy writer, and enforce foreign keys."""
        url = f"sqlite:///{tmp_path}/pragmas.db"
        engine = make_engine(url, create=True)
        try:
            with engine.connect() as connection:
                assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
                assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        finally:
            engine.dispose()


class TestRuns:
    def test_created_run_round_trips(
        self, store: SqlStore, run_info: Callable[..., RunInfo]
    ) -> None:
        """A created run reads back equal, unfinished."""
        [stored] = store.runs()
        assert stored.info == run_info()
        assert stored.finished_at is None

    def test_finish_run_records_the_time_in_utc(self, store: SqlStore) -> None:
        """finish_run stores the finishing time, which reads back as the same UTC instant."""
        finished = datetime(2025, 11, 29, 14, 30, tzinfo=timezone(timedelta(hours=2)))
        store.finish_run("run-1", finished)
        [stored] = store.runs()
        assert stored.finished_at == finished
        assert stored.finished_at is not None and stored.finished_at.tzinfo is UTC

    def test_finishing_an_unknown_run_is_an_error(self, store: SqlStore) -> None:
        """Finishing a run that was never created raises LookupError."""
        with pytest.raises(LookupError, match="no run 'nope'"):
            store.finish_run("nope", T0)

    def test_runs_are_newest_first_and_limited(
        self, store: SqlStore, run_info: Callable[..., RunInfo]
    ) -> None:
        """runs(limit) returns the most recent runs, newest first."""
        for hour in (1, 2, 3):
            store.create_run(
                run_info(run_id=f"run-later-{hour}", started_at=T0 + timedelta(hours=hour))
            )
        assert [run.info.run_id for run in store.runs(limit=2)] == ["run-later-3", "run-later-2"]

    def test_runs_by_id_reads_only_those_runs(
        self, store: SqlStore, run_info: Callable[..., RunInfo]
    ) -> None:
        """runs_by_id returns the named runs keyed by id; unknown ids are simply absent."""
        for hour in (1, 2, 3):
            store.create_run(
                run_info(run_id=f"run-by-id-{hour}", started_at=T0 + timedelta(hours=hour))
            )
        found = store.runs_by_id(["run-by-id-1", "run-by-id-3", "no-such-run"])
        assert sorted(found) == ["run-by-id-1", "run-by-id-3"]
        assert found["run-by-id-3"].info.started_at == T0 + timedelta(hours=3)
        assert store.runs_by_id([]) == {}

    def test_naive_datetimes_are_refused(self, store: SqlStore) -> None:
        """A naive datetime is a bug: its zone would be a guess."""
        with pytest.raises(ValueError, match="naive"):
            store.finish_run("run-1", datetime(2025, 1, 1))


class TestSavePair:
    def test_complete_pair_round_trips(self, store: SqlStore, pair: PairFactory) -> None:
        """A saved pair reads back equal: texts, token ids, timings, stats, scores, seed."""
        record = pair()
        store.save_pair(record)
        assert store.pairs() == [record]

    def test_teacher_scored_nll_delta_round_trips(self, store: SqlStore, pair: PairFactory) -> None:
        """A sampled pair's likelihood and argmax-share differences are stored; an
        unscored one's stay None."""
        scored = pair(temperature=0.8)
        assert scored.scores is not None
        scored = replace(scored, scores=replace(scored.scores, nll_delta=-0.25, argmax_delta=0.125))
        unscored = pair()
        store.save_pair(scored)
        store.save_pair(unscored)
        assert store.pairs() == [scored, unscored]

    def test_failed_pair_round_trips_with_nothing_reported(
        self, store: SqlStore, failed: PairFactory
    ) -> None:
        """A failed arm keeps its error kind, detail and HTTP status; absent figures stay None."""
        record = failed()
        store.save_pair(record)
        [loaded] = store.pairs()
        assert loaded == record
        assert loaded.scores is None and not loaded.complete
        assert loaded.speculative.speculative is None
        assert loaded.speculative.acceptance_source is AcceptanceSource.NOT_REPORTED

    def test_other_timezones_read_back_as_the_same_utc_instant(
        self, store: SqlStore, pair: PairFactory
    ) -> None:
        """started_at given in another zone reads back as the same instant, in UTC."""
        tokyo = T0.astimezone(timezone(timedelta(hours=9)))
        store.save_pair(pair(started_at=tokyo))
        [loaded] = store.pairs()
        assert loaded.started_at == T0
        assert loaded.started_at.tzinfo is UTC

    def test_stats_with_an_unreported_breakdown_round_trip(
        self, store: SqlStore, pair: PairFactory
    ) -> None:
        """Server-reported stats with no per-position breakdown keep their source and ()."""
        stats = SpeculativeStats(
            verify_steps=3,
            draft_tokens=4,
            accepted_tokens=1,
            accepted_per_position=(),
            source=AcceptanceSource.PER_REQUEST,
        )
        record = pair()
        record = replace(
            record,
            speculative=replace(
                record.speculative,
                speculative=stats,
                acceptance_source=AcceptanceSource.PER_REQUEST,
            ),
        )
        store.save_pair(record)
        assert store.pairs() == [record]

    def test_unreported_drafted_tokens_round_trip_as_none(
        self, store: SqlStore, pair: PairFactory, database_url: str
    ) -> None:
        """Stats without a drafted count store draft_tokens as SQL NULL and read back None,
        in the record and in history's facts, next to the reported steps and accepted."""
        stats = SpeculativeStats(
            verify_steps=2,
            draft_tokens=None,
            accepted_tokens=2,
            accepted_per_position=(),
            source=AcceptanceSource.WINDOW_AGGREGATE,
        )
        record = pair()
        record = replace(
            record,
            speculative=replace(
                record.speculative,
                speculative=stats,
                acceptance_source=AcceptanceSource.WINDOW_AGGREGATE,
            ),
        )
        store.save_pair(record)
        with raw(database_url) as connection:
            row = connection.execute(
                text(
                    "SELECT verify_steps, draft_tokens, accepted_tokens FROM generations "
                    "WHERE arm = 'speculative'"
                )
            ).one()
        assert tuple(row) == (2, None, 2)
        [loaded] = store.pairs()
        assert loaded == record
        assert loaded.speculative.speculative is not None
        assert loaded.speculative.speculative.draft_tokens is None
        assert loaded.speculative.speculative.acceptance_rate is None
        [facts] = store.history(T0 - timedelta(hours=1), T0 + timedelta(hours=1)).pairs
        assert (facts.verify_steps, facts.draft_tokens, facts.accepted_tokens) == (2, None, 2)

    def test_unreported_acceptance_is_null_not_zero(
        self, store: SqlStore, pair: PairFactory, database_url: str
    ) -> None:
        """The baseline arm's acceptance columns are SQL NULL, never 0."""
        store.save_pair(pair())
        with raw(database_url) as connection:
            row = connection.execute(
                text(
                    "SELECT verify_steps, draft_tokens, accepted_tokens, accepted_per_position, "
                    "drafted_per_position, speculative_source FROM generations "
                    "WHERE arm = 'baseline'"
                )
            ).one()
        assert tuple(row) == (None,) * 6

    def test_duplicate_pair_leaves_no_partial_rows(
        self, store: SqlStore, pair: PairFactory, prompt: Callable[..., Prompt], database_url: str
    ) -> None:
        """A save that fails after its prompt was written (duplicate pair_id) leaves nothing."""
        first = pair()
        store.save_pair(first)
        clash = replace(pair(), pair_id=first.pair_id, prompt=prompt(id="new-prompt"))
        with pytest.raises(IntegrityError):
            store.save_pair(clash)
        assert store.pairs() == [first]
        assert count(database_url, "prompts") == 1
        assert count(database_url, "generations") == 2
        assert count(database_url, "pair_scores") == 1

    def test_rejected_generation_rolls_back_the_pair(
        self, store: SqlStore, pair: PairFactory, database_url: str
    ) -> None:
        """A save that fails at the second generation row leaves no pair, prompt or generation."""
        record = pair()
        bad = replace(record, speculative=replace(record.speculative, output_tokens=-1))
        with pytest.raises(IntegrityError):
            store.save_pair(bad)
        assert store.pairs() == []
        for name in ("pairs", "prompts", "generations", "pair_scores"):
            assert count(database_url, name) == 0, name
        store.save_pair(record)
        assert store.pairs() == [record]

    def test_same_prompt_is_stored_once_and_an_edited_prompt_again(
        self, store: SqlStore, pair: PairFactory, prompt: Callable[..., Prompt], database_url: str
    ) -> None:
        """Prompts are keyed by content: reruns share a row, an edit gets a new one."""
        store.save_pair(pair())
        store.save_pair(pair())
        assert count(database_url, "prompts") == 1
        store.save_pair(pair(prompt=prompt(max_tokens=200)))
        assert count(database_url, "prompts") == 2

    def test_pair_for_an_unknown_run_is_refused(self, store: SqlStore, pair: PairFactory) -> None:
        """Foreign keys hold on both backends: a pair needs its run."""
        with pytest.raises(IntegrityError):
            store.save_pair(pair(run_id="no-such-run"))

    def test_recording_a_suite_twice_is_idempotent(
        self, store: SqlStore, database_url: str
    ) -> None:
        """The same suite version is one row; a new sha256 is another."""
        store.record_suite("default", "a" * 64, "prompts/default")
        store.record_suite("default", "a" * 64, "prompts/default")
        store.record_suite("default", "b" * 64, "prompts/default")
        assert count(database_url, "suites") == 2


class TestPairsQuery:
    @pytest.fixture
    def saved(
        self, store: SqlStore, pair: PairFactory, run_info: Callable[..., RunInfo]
    ) -> list[PairRecord]:
        store.create_run(run_info(run_id="run-2"))
        records = [
            pair(started_at=T0 + timedelta(minutes=0), category="math"),
            pair(started_at=T0 + timedelta(minutes=1), category="qa"),
            pair(started_at=T0 + timedelta(minutes=2), category="math", run_id="run-2"),
            pair(started_at=T0 + timedelta(minutes=3), category="qa", run_id="run-2"),
        ]
        for record in reversed(records):
            store.save_pair(record)
        return records

    def test_pairs_are_oldest_first(self, store: SqlStore, saved: list[PairRecord]) -> None:
        """pairs() returns every pair in the order they started."""
        assert store.pairs() == saved

    def test_window_is_half_open(self, store: SqlStore, saved: list[PairRecord]) -> None:
        """since is inclusive and until exclusive, so adjacent windows never double count."""
        window = store.pairs(since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=3))
        assert window == saved[1:3]

    def test_filter_by_category_and_run(self, store: SqlStore, saved: list[PairRecord]) -> None:
        """category and run_id narrow the window."""
        assert store.pairs(category="math") == [saved[0], saved[2]]
        assert store.pairs(run_id="run-2", category="qa") == [saved[3]]

    def test_limit_keeps_the_most_recent(self, store: SqlStore, saved: list[PairRecord]) -> None:
        """limit returns the latest pairs, still oldest first."""
        assert store.pairs(limit=2) == saved[2:]

    def test_categories_are_distinct_and_sorted(
        self, store: SqlStore, saved: list[PairRecord]
    ) -> None:
        """categories() lists each category with pairs once, sorted."""
        assert store.categories() == ["math", "qa"]

    def test_window_in_another_zone_selects_the_same_instants(
        self, store: SqlStore, saved: list[PairRecord]
    ) -> None:
        """Window bounds in another zone compare as instants, not wall-clock text."""
        since = (T0 + timedelta(minutes=2)).astimezone(timezone(timedelta(hours=-5)))
        assert store.pairs(since=since) == saved[2:]


@contextmanager
def _sqlite_writer_lock(url: str) -> Iterator[None]:
    """Another process-like writer holds SQLite's write lock."""
    holder = sqlite3.connect(make_url(url).database or "", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def _save_while_connection_is_killed(url: str, store: SqlStore, record: PairRecord) -> None:
    """Run save_pair while the server terminates its connection mid-transaction.

    The test holds a lock on `pairs`, so the store's INSERT waits on the server; the test
    then terminates exactly the backend blocked behind it, as an admin or a failover would.
    """
    with raw(url) as locker, ThreadPoolExecutor(max_workers=1) as pool:
        locker.execute(text("LOCK TABLE pairs IN ACCESS EXCLUSIVE MODE"))
        saving: Future[None] = pool.submit(store.save_pair, record)
        deadline = time.monotonic() + 10
        while True:
            victims = locker.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
                )
            ).all()
            if victims or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert victims, "save_pair never blocked on the lock"
        saving.result(timeout=10)


class TestDatabaseGoesAway:
    def test_save_raises_database_error_and_the_store_recovers(
        self, database_url: str, pair: PairFactory, run_info: Callable[..., RunInfo]
    ) -> None:
        """A database lost mid-save raises DatabaseError, keeps no partial rows, then recovers."""
        is_sqlite = database_url.startswith("sqlite")
        # SQLite's outage is a writer that never lets go; wait 0.2 s for it, not 30.
        url = f"{database_url}?timeout=0.2" if is_sqlite else database_url
        record, later = pair(), pair()
        with SqlStore.open(url, create=True) as store:
            store.create_run(run_info())
            with pytest.raises(DatabaseError, match=r"saving pair 'pair-\d+' failed on ") as caught:
                if is_sqlite:
                    with _sqlite_writer_lock(database_url):
                        store.save_pair(record)
                else:
                    _save_while_connection_is_killed(database_url, store, record)
            assert caught.value.__cause__ is not None
            assert "canaryd:canaryd@" not in str(caught.value)
            assert store.pairs() == []
            store.save_pair(later)
            assert store.pairs() == [later]

    def test_connections_dropped_while_idle_are_replaced(
        self, database_url: str, store: SqlStore, pair: PairFactory
    ) -> None:
        """After the server drops pooled connections, the next call reconnects (pre-ping)."""
        if database_url.startswith("sqlite"):
            pytest.skip("SQLite has no server to drop connections")
        first, second = pair(), pair()
        store.save_pair(first)
        application_name = make_url(database_url).query["application_name"]
        with raw(database_url) as admin:
            killed = admin.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = :name AND pid <> pg_backend_pid()"
                ),
                {"name": application_name},
            ).all()
        assert killed
        store.save_pair(second)
        assert store.pairs() == [first, second]


class TestDriftPins:
    """Pins are kept, grown only by larger ones, and forgotten per category (issue #23)."""

    def test_a_pin_is_kept_unless_replaced_by_one_from_more_pairs(self, store: SqlStore) -> None:
        young = ReferenceStats(2.0, 0.6, 30, 0.6, 0.3)
        grown = ReferenceStats(2.1, 0.5, 200, 0.65, 0.25)
        store.pin_drift_references({"code": young}, T0, "arms-a")
        store.pin_drift_references({"code": grown}, T0, "arms-a")  # not replace: kept
        assert store.drift_references("arms-a") == {"code": young}
        store.pin_drift_references({"code": grown}, T0, "arms-a", replace=True)
        assert store.drift_references("arms-a") == {"code": grown}
        store.pin_drift_references({"code": young}, T0, "arms-a", replace=True)  # never shrinks
        assert store.drift_references("arms-a") == {"code": grown}
        assert store.drift_references("arms-b") == {}

    def test_repin_forgets_one_category_or_all(self, store: SqlStore) -> None:
        pin = ReferenceStats(2.0, 0.6, 30, 0.6, 0.3)
        store.pin_drift_references({"code": pin, "qa": pin}, T0, "arms-a")
        store.pin_drift_references({"code": pin}, T0, "arms-b")
        assert store.unpin_drift_references(["code"]) == 2
        assert store.drift_references("arms-a") == {"qa": pin}
        assert store.unpin_drift_references() == 1
        assert store.drift_references("arms-a") == {}


class TestRevisionWindows:
    def test_the_first_start_wins_and_the_next_revision_ends_it(self, store: SqlStore) -> None:
        """A revision's window starts once (a second start keeps the first time); starting
        the arm's next revision ends it there; another arm's revisions are its own."""
        t0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
        assert store.revision_window("speculative", "abc") is None
        first = store.start_revision("speculative", "abc", t0)
        assert first.started_at == t0 and first.current
        again = store.start_revision("speculative", "abc", t0 + timedelta(minutes=5))
        assert again == first
        store.start_revision("eagle", "zzz", t0 + timedelta(minutes=1))
        assert store.revision_window("speculative", "abc") == first  # other arm: no end
        store.start_revision("speculative", "def", t0 + timedelta(minutes=10))
        ended = store.revision_window("speculative", "abc")
        assert ended is not None and ended.ended_at == t0 + timedelta(minutes=10)
        assert not ended.current
        latest = store.revision_window("speculative", "def")
        assert latest is not None and latest.current
