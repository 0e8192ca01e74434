"""The SQL store: canaryd's history in SQLite (default) or PostgreSQL, behind `Store`.

This module owns turning a database URL into a configured engine (SQLite: WAL, busy
timeout, foreign keys, transactional DDL; PostgreSQL: pre-ping, connect timeout), the
schema check against Alembic's head revision, programmatic migrations, and the mapping
between domain records (`RunInfo`, `PairRecord`) and rows. Every failure a person can fix
(bad URL, unreachable server, schema not current, database gone mid-run) is raised as
`DatabaseError` with one line that says what to do; constraint violations are bugs and
keep SQLAlchemy's exception.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, Self, cast

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    Connection,
    Engine,
    Select,
    and_,
    create_engine,
    delete,
    event,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, aliased, sessionmaker

from canaryd.errors import DatabaseError
from canaryd.paths import alembic_dir, default_database_url
from canaryd.records import ARMS, Arm, Check, CheckKind, PairRecord, PairScores, Prompt, RunInfo
from canaryd.store.models import (
    DriftReferenceRow,
    GateDecisionRow,
    GenerationRow,
    PairRollupRow,
    PairRow,
    PairScoresRow,
    PromptRow,
    RunRow,
    SuiteRow,
    SwitchAuditRow,
    SwitchStateRow,
)
from canaryd.store.rollup import (
    ACCEPTANCE_LENGTH_BOUNDS,
    LATENCY_BOUNDS_S,
    SPEEDUP_BOUNDS,
    ArmFacts,
    ArmRollup,
    PairFacts,
    PairRollup,
    rollups_by_hour,
)
from canaryd.store.switching import AuditEntry, SwitchRecord, decision_from_dict
from engine.types import (
    AcceptanceSource,
    ErrorKind,
    GenerationResult,
    Message,
    Role,
    SpeculativeStats,
)
from gates import (
    Control,
    Evaluation,
    ReferenceStats,
    SwitchMode,
    SwitchOutcome,
    SwitchState,
)

__all__ = [
    "EXPECTED_URL_FORMS",
    "RETENTION_BATCH_PAIRS",
    "SQLITE_BUSY_TIMEOUT_S",
    "History",
    "RetentionReport",
    "SqlStore",
    "Store",
    "StoredRun",
    "alembic_config",
    "current_revision",
    "head_revision",
    "known_revisions",
    "make_engine",
    "mask_url",
    "resolve_database_url",
    "schema_problem",
    "upgrade",
]

EXPECTED_URL_FORMS = "sqlite:///path or postgresql+psycopg://user:pass@host/db"
SQLITE_BUSY_TIMEOUT_S = 30.0  # a writer waits this long for another writer; `?timeout=` overrides
POSTGRESQL_CONNECT_TIMEOUT_S = 10  # `?connect_timeout=` overrides
# Pairs rolled up per retention transaction: a months-long backlog never holds one giant
# transaction (or SQLite's single write lock) while the daemon wants to save a pair.
RETENTION_BATCH_PAIRS = 1000
SQLITE_IMMEDIATE = "canaryd_sqlite_immediate"  # execution option read by _sqlite_on_begin
_SUPPORTED_DRIVERS = {
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite+pysqlite",
    # Plain `postgresql://` would mean psycopg2, which canaryd does not ship.
    "postgresql": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}


@dataclass(frozen=True, slots=True)
class StoredRun:
    """A run as stored: what it was started with, and when it finished (None: still running
    or killed)."""

    info: RunInfo
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What one `apply_retention` did: pairs rolled up (each then deleted with its
    generations and scores), and roll-up rows deleted for being past their own cut-off."""

    rolled_up_pairs: int
    deleted_pairs: int
    deleted_rollups: int


@dataclass(frozen=True, slots=True)
class History:
    """A time window of history read in one snapshot: the raw pairs still stored, and the
    roll-ups of the hours whose start lies in the window. A pair is in one or the other,
    never both (retention moves it in one transaction)."""

    pairs: list[PairFacts]
    rollups: list[PairRollup]


class Store(Protocol):
    """Where pair records and runs are kept; every implementation passes the same suite."""

    def create_run(self, run: RunInfo) -> None: ...

    def finish_run(self, run_id: str, finished_at: datetime) -> None: ...

    def record_suite(self, name: str, sha256: str, path: str) -> None: ...

    def save_pair(self, record: PairRecord) -> None: ...

    def pairs(
        self,
        *,
        run_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        category: str | None = None,
        limit: int | None = None,
    ) -> list[PairRecord]: ...

    def runs(self, limit: int | None = 20) -> list[StoredRun]: ...

    def runs_by_id(self, run_ids: Collection[str]) -> dict[str, StoredRun]: ...

    def categories(self) -> list[str]: ...

    def apply_retention(
        self,
        now: datetime,
        raw_retention_days: float,
        rollup_retention_days: float,
        *,
        batch_pairs: int = RETENTION_BATCH_PAIRS,
    ) -> RetentionReport: ...

    def history(self, since: datetime, until: datetime) -> History: ...

    def rollups(
        self, *, since: datetime | None = None, until: datetime | None = None
    ) -> list[PairRollup]: ...

    def latest_pair_started_at(self) -> datetime | None: ...

    def latest_rollup_hour(self) -> datetime | None: ...

    def close(self) -> None: ...


# --- URLs and engines -----------------------------------------------------------------


def resolve_database_url(explicit: str | None = None) -> str:
    """`explicit` (e.g. `--url`), else env CANARYD_DATABASE_URL, else the default SQLite file."""
    return explicit or os.environ.get("CANARYD_DATABASE_URL") or default_database_url()


def mask_url(url: str | URL) -> str:
    """The URL with its password replaced by `***`, even when it does not parse."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def _parse_url(url: str) -> URL:
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise DatabaseError(
            f"cannot parse database URL {mask_url(url)!r}; expected {EXPECTED_URL_FORMS}"
        ) from None
    driver = _SUPPORTED_DRIVERS.get(parsed.drivername)
    if driver is None:
        raise DatabaseError(
            f"unsupported database driver {parsed.drivername!r} in URL {mask_url(parsed)!r}; "
            f"expected {EXPECTED_URL_FORMS}"
        )
    parsed = parsed.set(drivername=driver)
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise DatabaseError(
            f"database URL {mask_url(parsed)!r} is an in-memory SQLite database, which "
            f"would lose the history; expected {EXPECTED_URL_FORMS}"
        )
    return parsed


def _sqlite_path(url: URL) -> Path | None:
    if url.get_backend_name() != "sqlite" or url.database is None:
        return None
    return Path(url.database)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite defers BEGIN to the first DML and commits before DDL, which would make a
    # migration or a save half-apply; take over transactions (see `_sqlite_on_begin`).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable enough under WAL, much faster
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _sqlite_on_begin(connection: Connection) -> None:
    # `sqlite_immediate` (the switch's read-modify-write) takes the write lock at BEGIN,
    # so a second writer waits for the busy timeout instead of reading a stale row.
    immediate = connection.get_execution_options().get(SQLITE_IMMEDIATE, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_engine(url: str, *, create: bool = False) -> Engine:
    """A configured engine for `url`; `create` makes a SQLite file's directory."""
    parsed = _parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = _sqlite_path(parsed)
        if create and path is not None:
            path.expanduser().parent.mkdir(parents=True, exist_ok=True)
        connect_args: dict[str, Any] = {"check_same_thread": False}
        if "timeout" not in parsed.query:
            connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
        engine = create_engine(parsed, connect_args=connect_args)
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    connect_args = {}
    if "connect_timeout" not in parsed.query:
        connect_args["connect_timeout"] = POSTGRESQL_CONNECT_TIMEOUT_S
    if "application_name" not in parsed.query:
        connect_args["application_name"] = "canaryd"
    # pre-ping: a connection the server dropped while idle in the pool is replaced at
    # checkout instead of failing the next save.
    return create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)


def _reason(exc: DBAPIError) -> str:
    """The driver's message on one line."""
    return " ".join(str(exc.orig).split()) or type(exc.orig).__name__


def _unreachable(url: URL, exc: DBAPIError) -> DatabaseError:
    if url.get_backend_name() == "sqlite":
        return DatabaseError(
            f"cannot open SQLite database {url.database!r}: {_reason(exc)}; check that the "
            f"directory exists and is writable by this user"
        )
    host = f"{url.host or 'localhost'}:{url.port or 5432}"
    return DatabaseError(
        f"cannot connect to PostgreSQL at {host} (database {url.database!r}, user "
        f"{url.username!r}): {_reason(exc)}; check that the server is running and reachable "
        f"from here, and the user, password and database name in {mask_url(url)!r}"
    )


@contextmanager
def _connecting(url: URL) -> Iterator[None]:
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        raise _unreachable(url, exc) from exc


# --- schema revisions -----------------------------------------------------------------


def alembic_config() -> Config:
    """Alembic's configuration for canaryd's migrations, independent of any ini file."""
    config = Config()
    # ConfigParser interpolates `%`; a path containing one must be escaped.
    config.set_main_option("script_location", str(alembic_dir()).replace("%", "%%"))
    return config


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The schema revision this canaryd needs."""
    head = _script().get_current_head()
    if head is None:  # pragma: no cover - the package always ships migrations
        raise RuntimeError(f"no migrations under {alembic_dir()}")
    return head


def known_revisions() -> set[str]:
    """Every schema revision this canaryd ships a migration for."""
    return {script.revision for script in _script().walk_revisions()}


def schema_problem(current: str | None, head: str, known: set[str], url: str) -> str | None:
    """What is wrong with a database at revision `current`, and what to run; None if current."""
    if current == head:
        return None
    fix = f"`canaryd db upgrade --url {shlex.quote(url)}`"
    if current is None:
        return f"database {url} has no canaryd schema; create it with {fix}"
    if current not in known:
        return (
            f"database {url} is at schema revision {current!r}, which is newer than this "
            f"canaryd (it knows up to {head!r}); upgrade canaryd, or use another database"
        )
    return (
        f"database {url} is at schema revision {current!r}, but this canaryd needs "
        f"{head!r}; run {fix}"
    )


def _read_revision(engine: Engine, url: URL) -> str | None:
    with _connecting(url), engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def _upgrade_engine(engine: Engine, url: URL) -> None:
    config = alembic_config()
    with _connecting(url):
        connection = engine.connect()
    # One transaction for the whole upgrade: DDL is transactional on both backends.
    with connection, connection.begin():
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def current_revision(url: str) -> str | None:
    """The schema revision of the database at `url`; None when it has no canaryd schema.

    A SQLite file that does not exist is reported as None and is not created.
    """
    parsed = _parse_url(url)
    path = _sqlite_path(parsed)
    if path is not None and not path.expanduser().exists():
        return None
    engine = make_engine(url)
    try:
        return _read_revision(engine, parsed)
    finally:
        engine.dispose()


def upgrade(url: str) -> str:
    """Migrate the database at `url` to this canaryd's head revision and return it.

    An empty database (or a SQLite file that does not exist yet) is created from scratch;
    a database newer than this canaryd is refused, never downgraded.
    """
    parsed = _parse_url(url)
    engine = make_engine(url, create=True)
    try:
        current = _read_revision(engine, parsed)
        head = head_revision()
        if current is not None and current not in known_revisions():
            raise DatabaseError(cast(str, schema_problem(current, head, set(), mask_url(parsed))))
        if current != head:
            _upgrade_engine(engine, parsed)
        return head
    finally:
        engine.dispose()


# --- records <-> rows -----------------------------------------------------------------


def _aware(value: datetime, what: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} {value!r} is naive; canaryd stores timezone-aware UTC")
    return value


def _check_to_json(check: Check | None) -> dict[str, Any] | None:
    if check is None:
        return None
    return {"kind": check.kind, "value": check.value, "tolerance": check.tolerance}


def _check_from_json(data: dict[str, Any] | None) -> Check | None:
    if data is None:
        return None
    return Check(
        kind=cast(CheckKind, data["kind"]), value=data["value"], tolerance=float(data["tolerance"])
    )


def prompt_content_hash(prompt: Prompt) -> str:
    """sha256 over everything that changes what a prompt asks (not where it is defined)."""
    content = {
        "suite": prompt.suite,
        "id": prompt.id,
        "category": prompt.category,
        "messages": [{"role": m.role, "content": m.content} for m in prompt.messages],
        "max_tokens": prompt.max_tokens,
        "reference": prompt.reference,
        "check": _check_to_json(prompt.check),
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _prompt_from_row(row: PromptRow) -> Prompt:
    return Prompt(
        id=row.prompt_id,
        category=row.category,
        messages=tuple(
            Message(role=cast(Role, m["role"]), content=m["content"]) for m in row.messages
        ),
        max_tokens=row.max_tokens,
        reference=row.reference,
        check=_check_from_json(row.answer_check),
        suite=row.suite,
        source=row.source,
    )


def _generation_row(arm: Arm, result: GenerationResult) -> GenerationRow:
    stats = result.speculative
    return GenerationRow(
        arm=arm,
        text=result.text,
        token_ids=list(result.token_ids),
        finish_reason=result.finish_reason,
        prompt_tokens=result.prompt_tokens,
        output_tokens=result.output_tokens,
        ttft_s=result.ttft_s,
        tpot_s=result.tpot_s,
        e2e_s=result.e2e_s,
        error=result.error.value,
        error_detail=result.error_detail,
        http_status=result.http_status,
        acceptance_source=result.acceptance_source.value,
        speculative_source=None if stats is None else stats.source.value,
        verify_steps=None if stats is None else stats.verify_steps,
        draft_tokens=None if stats is None else stats.draft_tokens,
        accepted_tokens=None if stats is None else stats.accepted_tokens,
        accepted_per_position=None if stats is None else list(stats.accepted_per_position),
        drafted_per_position=None if stats is None else list(stats.drafted_per_position),
    )


def _generation_from_row(row: GenerationRow) -> GenerationResult:
    stats = None
    if row.verify_steps is not None:
        stats = SpeculativeStats(
            verify_steps=row.verify_steps,
            draft_tokens=row.draft_tokens,  # NULL: the engine did not report it
            accepted_tokens=cast(int, row.accepted_tokens),
            accepted_per_position=tuple(row.accepted_per_position or ()),
            drafted_per_position=tuple(row.drafted_per_position or ()),
            source=AcceptanceSource(row.speculative_source or AcceptanceSource.DECODING_LOOP),
        )
    return GenerationResult(
        text=row.text,
        token_ids=tuple(row.token_ids),
        finish_reason=row.finish_reason,
        prompt_tokens=row.prompt_tokens,
        output_tokens=row.output_tokens,
        ttft_s=row.ttft_s,
        tpot_s=row.tpot_s,
        e2e_s=row.e2e_s,
        error=ErrorKind(row.error),
        error_detail=row.error_detail,
        http_status=row.http_status,
        speculative=stats,
        acceptance_source=AcceptanceSource(row.acceptance_source),
    )


def _scores_row(scores: PairScores) -> PairScoresRow:
    return PairScoresRow(
        exact_match=scores.exact_match,
        first_divergence=scores.first_divergence,
        token_edit_similarity=scores.token_edit_similarity,
        rouge_l=scores.rouge_l,
        chrf=scores.chrf,
        length_ratio=scores.length_ratio,
        baseline_loop=scores.baseline_loop,
        speculative_loop=scores.speculative_loop,
        baseline_task_score=scores.baseline_task_score,
        speculative_task_score=scores.speculative_task_score,
        task_score_delta=scores.task_score_delta,
    )


def _scores_from_row(row: PairScoresRow) -> PairScores:
    return PairScores(
        exact_match=row.exact_match,
        first_divergence=row.first_divergence,
        token_edit_similarity=row.token_edit_similarity,
        rouge_l=row.rouge_l,
        chrf=row.chrf,
        length_ratio=row.length_ratio,
        baseline_loop=row.baseline_loop,
        speculative_loop=row.speculative_loop,
        baseline_task_score=row.baseline_task_score,
        speculative_task_score=row.speculative_task_score,
        task_score_delta=row.task_score_delta,
    )


def _arm_order(stored: Sequence[str]) -> tuple[Arm, Arm]:
    first, second = stored
    if first not in ARMS or second not in ARMS:  # pragma: no cover - schema written by us
        raise ValueError(f"stored arm order {stored!r} is not two of {ARMS}")
    return first, second


def _record_from_row(row: PairRow) -> PairRecord:
    by_arm = {generation.arm: generation for generation in row.generations}
    return PairRecord(
        pair_id=row.pair_id,
        run_id=row.run_id,
        prompt=_prompt_from_row(row.prompt),
        started_at=row.started_at,
        arm_order=_arm_order(row.arm_order),
        baseline=_generation_from_row(by_arm["baseline"]),
        speculative=_generation_from_row(by_arm["speculative"]),
        scores=None if row.scores is None else _scores_from_row(row.scores),
        sampling_seed=row.seed,
        temperature=row.temperature,
    )


def _run_from_row(row: RunRow) -> StoredRun:
    info = RunInfo(
        run_id=row.run_id,
        kind=cast(Literal["once", "daemon", "bench"], row.kind),
        started_at=row.started_at,
        config=row.config,
        config_hash=row.config_hash,
        baseline_identity=row.baseline_identity,
        speculative_identity=row.speculative_identity,
        software=row.software,
    )
    return StoredRun(info=info, finished_at=row.finished_at)


# --- facts and roll-ups <-> rows ------------------------------------------------------

_BASELINE = aliased(GenerationRow, name="baseline_generation")
_SPECULATIVE = aliased(GenerationRow, name="speculative_generation")


def _facts_query() -> Select[Any]:
    """Pairs with both generations and their scores, as the columns `PairFacts` needs."""
    return (
        select(
            PairRow.pair_id,
            PairRow.category,
            PairRow.started_at,
            *(
                getattr(arm, column)
                for arm in (_BASELINE, _SPECULATIVE)
                for column in ("error", "output_tokens", "e2e_s", "ttft_s", "tpot_s")
            ),
            _SPECULATIVE.verify_steps,
            _SPECULATIVE.draft_tokens,
            _SPECULATIVE.accepted_tokens,
            _SPECULATIVE.accepted_per_position,
            _SPECULATIVE.drafted_per_position,
            PairScoresRow.exact_match,
            PairScoresRow.task_score_delta,
        )
        .join(_BASELINE, and_(_BASELINE.pair_id == PairRow.pair_id, _BASELINE.arm == "baseline"))
        .join(
            _SPECULATIVE,
            and_(_SPECULATIVE.pair_id == PairRow.pair_id, _SPECULATIVE.arm == "speculative"),
        )
        .outerjoin(PairScoresRow, PairScoresRow.pair_id == PairRow.pair_id)
    )


def _facts_from_columns(row: Sequence[Any]) -> PairFacts:
    (pair_id, category, started_at, *arms) = row[:13]
    verify, drafted, accepted, per_position, drafted_per_position, exact, delta = row[13:]
    return PairFacts(
        pair_id=pair_id,
        category=category,
        started_at=started_at,
        baseline=ArmFacts(*arms[0:5]),
        speculative=ArmFacts(*arms[5:10]),
        verify_steps=verify,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        accepted_per_position=None if per_position is None else tuple(per_position),
        drafted_per_position=None if drafted_per_position is None else tuple(drafted_per_position),
        exact_match=exact,
        task_score_delta=delta,
    )


def _json_safe(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _rollup_values(rollup: PairRollup) -> dict[str, Any]:
    """The `pair_rollups` columns of a roll-up: arm fields are prefixed with the arm."""
    values: dict[str, Any] = {}
    for spec in fields(PairRollup):
        value = getattr(rollup, spec.name)
        if isinstance(value, ArmRollup):
            for arm_spec in fields(ArmRollup):
                values[f"{spec.name}_{arm_spec.name}"] = _json_safe(getattr(value, arm_spec.name))
        else:
            values[spec.name] = _json_safe(value)
    return values


_HISTOGRAM_BUCKETS = {
    "speedup_histogram": len(SPEEDUP_BOUNDS) + 1,
    "acceptance_length_histogram": len(ACCEPTANCE_LENGTH_BOUNDS) + 1,
    "e2e_histogram": len(LATENCY_BOUNDS_S) + 1,
    "ttft_histogram": len(LATENCY_BOUNDS_S) + 1,
    "tpot_histogram": len(LATENCY_BOUNDS_S) + 1,
}


def _stored(name: str, value: Any) -> Any:
    if isinstance(value, list):
        buckets = _HISTOGRAM_BUCKETS.get(name)
        if buckets is not None and len(value) != buckets:
            raise ValueError(
                f"stored {name} has {len(value)} buckets, this canaryd uses {buckets}; the "
                f"bucket bounds changed without a migration"
            )
        return tuple(value)
    if isinstance(value, dict):
        return {str(k): int(v) for k, v in sorted(value.items())}
    return value


def _rollup_from_row(row: PairRollupRow) -> PairRollup:
    arms = {
        arm: ArmRollup(
            **{
                spec.name: _stored(spec.name, getattr(row, f"{arm}_{spec.name}"))
                for spec in fields(ArmRollup)
            }
        )
        for arm in ("baseline", "speculative")
    }
    plain: dict[str, Any] = {
        spec.name: _stored(spec.name, getattr(row, spec.name))
        for spec in fields(PairRollup)
        if spec.name not in arms
    }
    return PairRollup(**plain, baseline=arms["baseline"], speculative=arms["speculative"])


# --- the store ------------------------------------------------------------------------


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
        parsed = _parse_url(url)
        path = _sqlite_path(parsed)
        if not create and path is not None and not path.expanduser().exists():
            raise DatabaseError(
                f"no database file at {str(path)!r}; create it with "
                f"`canaryd db upgrade --url {shlex.quote(mask_url(parsed))}`"
            )
        engine = make_engine(url, create=create)
        try:
            current = _read_revision(engine, parsed)
            if current is None and create:
                _upgrade_engine(engine, parsed)
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
        """A lost or unusable database becomes `DatabaseError`; the caller may buffer."""
        try:
            yield
        except (OperationalError, InterfaceError) as exc:
            raise DatabaseError(f"{action} failed on {self.url}: {_reason(exc)}") from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise DatabaseError(f"{action} failed on {self.url}: {_reason(exc)}") from exc
            raise

    @contextmanager
    def _transaction(self, action: str) -> Iterator[Session]:
        with self._translating(action), self._sessions.begin() as session:
            yield session

    def create_run(self, run: RunInfo) -> None:
        _aware(run.started_at, "run started_at")
        with self._transaction(f"creating run {run.run_id!r}") as session:
            session.add(
                RunRow(
                    run_id=run.run_id,
                    kind=run.kind,
                    started_at=run.started_at,
                    finished_at=None,
                    config=run.config,
                    config_hash=run.config_hash,
                    baseline_identity=run.baseline_identity,
                    speculative_identity=run.speculative_identity,
                    software=run.software,
                )
            )

    def finish_run(self, run_id: str, finished_at: datetime) -> None:
        _aware(finished_at, "run finished_at")
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
        content_hash = prompt_content_hash(prompt)
        values = {
            "content_hash": content_hash,
            "suite": prompt.suite,
            "prompt_id": prompt.id,
            "category": prompt.category,
            "messages": [{"role": m.role, "content": m.content} for m in prompt.messages],
            "max_tokens": prompt.max_tokens,
            "reference": prompt.reference,
            "answer_check": _check_to_json(prompt.check),
            "source": prompt.source,
        }
        # Insert first: a write as the transaction's first statement takes SQLite's write
        # lock up front, so the busy timeout applies instead of a read-to-write deadlock.
        session.execute(self._insert_ignoring_duplicates(PromptRow, values, ["content_hash"]))
        return session.scalars(
            select(PromptRow.id).where(PromptRow.content_hash == content_hash)
        ).one()

    def save_pair(self, record: PairRecord) -> None:
        """Store the pair, both generations and the scores in one transaction, or nothing."""
        _aware(record.started_at, "pair started_at")
        with self._transaction(f"saving pair {record.pair_id!r}") as session:
            pair = PairRow(
                pair_id=record.pair_id,
                run_id=record.run_id,
                prompt_ref=self._prompt_ref(session, record.prompt),
                category=record.prompt.category,
                started_at=record.started_at,
                arm_order=list(record.arm_order),
                seed=record.sampling_seed,
                temperature=record.temperature,
                complete=record.complete,
                generations=[
                    _generation_row("baseline", record.baseline),
                    _generation_row("speculative", record.speculative),
                ],
                scores=None if record.scores is None else _scores_row(record.scores),
            )
            session.add(pair)

    def pairs(
        self,
        *,
        run_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        category: str | None = None,
        limit: int | None = None,
    ) -> list[PairRecord]:
        """Pairs started in [since, until), oldest first; with `limit`, the most recent ones."""
        query = select(PairRow)
        if run_id is not None:
            query = query.where(PairRow.run_id == run_id)
        if since is not None:
            query = query.where(PairRow.started_at >= _aware(since, "since"))
        if until is not None:
            query = query.where(PairRow.started_at < _aware(until, "until"))
        if category is not None:
            query = query.where(PairRow.category == category)
        query = query.order_by(PairRow.started_at.desc(), PairRow.pair_id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._translating("reading pairs"), self._sessions() as session:
            rows = session.scalars(query).unique().all()
            return [_record_from_row(row) for row in reversed(rows)]

    def runs(self, limit: int | None = 20) -> list[StoredRun]:
        """The most recent runs, newest first."""
        query = select(RunRow).order_by(RunRow.started_at.desc(), RunRow.run_id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._translating("reading runs"), self._sessions() as session:
            return [_run_from_row(row) for row in session.scalars(query)]

    def runs_by_id(self, run_ids: Collection[str]) -> dict[str, StoredRun]:
        """The runs with these ids (missing ids are absent from the result)."""
        if not run_ids:
            return {}
        query = select(RunRow).where(RunRow.run_id.in_(sorted(set(run_ids))))
        with self._translating("reading runs"), self._sessions() as session:
            return {row.run_id: _run_from_row(row) for row in session.scalars(query)}

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
        entirely raw, so re-running never counts a pair twice. Prompts stay (they are
        small and shared). Raises `ValueError` for a naive `now` or a policy where
        roll-ups would not outlive the raw rows they summarise.
        """
        _aware(now, "retention now")
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
            rolled_up_pairs=rolled_up, deleted_pairs=rolled_up, deleted_rollups=deleted_rollups
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
                _facts_from_columns(row)
                for row in session.execute(_facts_query().where(PairRow.pair_id.in_(pair_ids)))
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
        key = {"hour_start": rollup.hour_start, "category": rollup.category}
        # Create the row if missing without racing a concurrent creator, then lock it.
        empty = PairRollup(hour_start=rollup.hour_start, category=rollup.category)
        session.execute(
            self._insert_ignoring_duplicates(
                PairRollupRow, _rollup_values(empty), ["hour_start", "category"]
            )
        )
        stored = session.scalars(
            select(PairRollupRow)
            .where(
                PairRollupRow.hour_start == key["hour_start"],
                PairRollupRow.category == key["category"],
            )
            .with_for_update()
        ).one()
        merged = _rollup_from_row(stored).merge(rollup)
        session.execute(
            update(PairRollupRow)
            .where(PairRollupRow.id == stored.id)
            .values(_rollup_values(merged))
            .execution_options(synchronize_session=False)
        )

    def _rollups_query(self, since: datetime | None, until: datetime | None) -> Select[Any]:
        query = select(PairRollupRow)
        if since is not None:
            query = query.where(PairRollupRow.hour_start >= _aware(since, "since"))
        if until is not None:
            query = query.where(PairRollupRow.hour_start < _aware(until, "until"))
        return query.order_by(PairRollupRow.hour_start, PairRollupRow.category)

    def rollups(
        self, *, since: datetime | None = None, until: datetime | None = None
    ) -> list[PairRollup]:
        """Roll-ups of the hours starting in [since, until), oldest first, by category."""
        with self._translating("reading roll-ups"), self._sessions() as session:
            return [
                _rollup_from_row(row) for row in session.scalars(self._rollups_query(since, until))
            ]

    def history(self, since: datetime, until: datetime) -> History:
        """Raw pairs started in [since, until) and roll-ups of hours starting in it, read in
        one snapshot so that a retention batch committing meanwhile is not counted twice."""
        pairs_query = (
            _facts_query()
            .where(PairRow.started_at >= _aware(since, "since"))
            .where(PairRow.started_at < _aware(until, "until"))
            .order_by(PairRow.started_at, PairRow.pair_id)
        )
        bind = self._engine
        if bind.dialect.name == "postgresql":
            # SQLite's explicit BEGIN already gives one snapshot per transaction.
            bind = bind.execution_options(isolation_level="REPEATABLE READ")
        with self._translating("reading history"), Session(bind) as session:
            pairs = [_facts_from_columns(row) for row in session.execute(pairs_query)]
            rollups = [
                _rollup_from_row(row) for row in session.scalars(self._rollups_query(since, until))
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
            return _switch_record(row)

    @contextmanager
    def _switch_locked(self, action: str) -> Iterator[tuple[Session, SwitchStateRow]]:
        """A transaction holding the switch row's lock (created if missing): SQLite
        `BEGIN IMMEDIATE`, PostgreSQL `SELECT … FOR UPDATE`. CLI and daemon serialise here."""
        with self._translating(action), self._engine.connect() as connection:
            connection.execution_options(**{SQLITE_IMMEDIATE: True})
            with Session(bind=connection) as session, session.begin():
                session.execute(
                    self._insert_ignoring_duplicates(SwitchStateRow, _initial_row(), ["id"])
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

        `decide` gets the stored state and the last `history` evaluations (oldest first)
        and returns the policy's outcome; its state is stored, each transition becomes a
        `transition` audit row and each refusal a `refused` row by `actor` (with the
        latest evaluation as evidence). A generation below the stored one is refused.
        """
        _aware(now, "switch change time")
        with self._switch_locked("changing the switch") as (session, row):
            current = _switch_record(row).state
            evaluations = self._evaluations(session, history)
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
                    .values(_state_values(new))
                    .execution_options(synchronize_session=False)
                )
            for transition in outcome.transitions:
                session.add(
                    SwitchAuditRow(
                        at=transition.at,
                        kind="transition",
                        generation=transition.generation,
                        previous=transition.previous.value,
                        target=transition.target.value,
                        control=transition.control.value,
                        actor=transition.actor,
                        reason=transition.reason,
                        evidence=[d.to_dict() for d in transition.evidence],
                    )
                )
            latest = evaluations[-1].decisions if evaluations else ()
            for refusal in outcome.refused:
                session.add(
                    SwitchAuditRow(
                        at=now,
                        kind="refused",
                        generation=new.generation,
                        previous=new.mode.value,
                        target=new.mode.value,
                        control=new.control.value,
                        actor=actor,
                        reason=refusal,
                        evidence=[d.to_dict() for d in latest],
                    )
                )
            return outcome

    def record_actuation(self, generation: int, errors: Mapping[str, str], at: datetime) -> bool:
        """Remember how applying `generation` went (no errors: applied). Ignored, and
        False returned, when the switch has moved past `generation` meanwhile."""
        _aware(at, "actuation time")
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

    def audit(self, *, since: datetime | None = None, limit: int | None = None) -> list[AuditEntry]:
        """Audit rows at or after `since`, oldest first; with `limit`, the most recent."""
        query = select(SwitchAuditRow)
        if since is not None:
            query = query.where(SwitchAuditRow.at >= _aware(since, "since"))
        query = query.order_by(SwitchAuditRow.at.desc(), SwitchAuditRow.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._translating("reading the audit trail"), self._sessions() as session:
            return [_audit_entry(row) for row in reversed(session.scalars(query).all())]

    def save_evaluation(self, evaluation: Evaluation) -> None:
        """Store one evaluation: a row per gate decision, all at `evaluation.at`."""
        _aware(evaluation.at, "evaluation time")
        with self._transaction("saving gate decisions") as session:
            session.add_all(
                GateDecisionRow(
                    evaluated_at=evaluation.at,
                    gate=d.name,
                    state=d.state.value,
                    mode=d.mode.value,
                    critical=d.critical,
                    decision=d.to_dict(),
                )
                for d in evaluation.decisions
            )

    def _evaluations(self, session: Session, limit: int) -> list[Evaluation]:
        if limit < 1:
            return []
        times = list(
            session.scalars(
                select(GateDecisionRow.evaluated_at)
                .distinct()
                .order_by(GateDecisionRow.evaluated_at.desc())
                .limit(limit)
            )
        )
        if not times:
            return []
        rows = session.scalars(
            select(GateDecisionRow)
            .where(GateDecisionRow.evaluated_at >= min(times))
            .order_by(GateDecisionRow.evaluated_at, GateDecisionRow.id)
        )
        grouped: dict[datetime, list[Any]] = {}
        for row in rows:
            grouped.setdefault(row.evaluated_at, []).append(decision_from_dict(row.decision))
        return [Evaluation(at, tuple(decisions)) for at, decisions in grouped.items()]

    def evaluations(self, limit: int) -> list[Evaluation]:
        """The last `limit` evaluations, oldest first."""
        with self._translating("reading gate decisions"), self._sessions() as session:
            return self._evaluations(session, limit)

    def latest_evaluation(self) -> Evaluation | None:
        found = self.evaluations(1)
        return found[0] if found else None

    def prune_gate_decisions(self, before: datetime) -> int:
        """Delete gate decisions evaluated before `before`; returns how many."""
        with self._transaction("pruning gate decisions") as session:
            result = session.execute(
                delete(GateDecisionRow).where(
                    GateDecisionRow.evaluated_at < _aware(before, "before")
                )
            )
            return int(getattr(result, "rowcount", 0))

    def drift_references(self) -> dict[str, ReferenceStats]:
        """The pinned acceptance-length reference of each category."""
        with self._translating("reading drift references"), self._sessions() as session:
            return {
                row.category: ReferenceStats(mean=row.mean, sd=row.sd, n=row.n)
                for row in session.scalars(select(DriftReferenceRow))
            }

    def pin_drift_references(self, references: Mapping[str, ReferenceStats], at: datetime) -> None:
        """Pin references for categories that have none; an existing pin is kept."""
        _aware(at, "pin time")
        with self._transaction("pinning drift references") as session:
            for category, stats in sorted(references.items()):
                values = {
                    "category": category,
                    "mean": stats.mean,
                    "sd": stats.sd,
                    "n": stats.n,
                    "pinned_at": at,
                }
                session.execute(
                    self._insert_ignoring_duplicates(DriftReferenceRow, values, ["category"])
                )

    def unpin_drift_references(self) -> int:
        """Forget every pinned reference (they are pinned again from healthy pairs)."""
        with self._transaction("unpinning drift references") as session:
            return int(getattr(session.execute(delete(DriftReferenceRow)), "rowcount", 0))


def _initial_row() -> dict[str, Any]:
    return {"id": 1, **_state_values(SwitchState())}


def _state_values(state: SwitchState) -> dict[str, Any]:
    return {
        "mode": state.mode.value,
        "control": state.control.value,
        "generation": state.generation,
        "since": state.since,
        "actor": state.actor,
        "reason": state.reason,
        "latched": state.latched,
        "cooldown_until": state.cooldown_until,
        "recent_trips": [t.isoformat() for t in state.recent_trips],
    }


def _switch_record(row: SwitchStateRow | None) -> SwitchRecord:
    if row is None:
        return SwitchRecord(SwitchState())
    state = SwitchState(
        mode=SwitchMode(row.mode),
        control=Control(row.control),
        generation=row.generation,
        since=row.since,
        actor=row.actor,
        reason=row.reason,
        latched=row.latched,
        cooldown_until=row.cooldown_until,
        recent_trips=tuple(datetime.fromisoformat(t) for t in row.recent_trips),
    )
    return SwitchRecord(
        state=state,
        applied_generation=row.applied_generation,
        actuator_errors=dict(row.actuator_errors or {}),
        actuated_at=row.actuated_at,
    )


def _audit_entry(row: SwitchAuditRow) -> AuditEntry:
    return AuditEntry(
        at=row.at,
        kind=row.kind,
        generation=row.generation,
        previous=row.previous,
        target=row.target,
        control=row.control,
        actor=row.actor,
        reason=row.reason,
        evidence=list(row.evidence),
    )
