"""An open SQL database: `SqlDatabase`, the plumbing that canaryd's SQL stores share.

This module owns opening a database (URL, engine and schema check, or migrating an empty
database with `create`), the engine and its sessions, transactions, inserts that ignore
a duplicate on either dialect, and turning a lost or unusable database mid-run into
`DatabaseError` with one line that says what failed, and a value it refuses into
`RecordRejectedError`; constraint violations are bugs and keep SQLAlchemy's exception.
The history's queries live in `canaryd.store.sql`, the switch's in
`canaryd.store.switching_sql`; engines in `canaryd.store.database`, migrations in
`canaryd.store.migrations`.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from sqlalchemy import Connection, Engine, Table, event
from sqlalchemy.engine import URL
from sqlalchemy.exc import DataError, DBAPIError, InterfaceError, OperationalError

from canaryd.errors import DatabaseError, RecordRejectedError
from canaryd.store.database import driver_message, make_engine, mask_url, parse_url, sqlite_path
from canaryd.store.migrations import (
    head_revision,
    known_revisions,
    read_revision,
    schema_problem,
    upgrade_engine,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

__all__ = ["SqlDatabase"]


class SqlDatabase:
    """One SQLite or PostgreSQL database, schema managed by Alembic: its engine, sessions
    and error translation. The SQL stores subclass it; one `close` disposes the engine.

    The history's queries run in ORM sessions; the switch's on Core connections
    (`_connection`), so that `canaryd switch` never imports the ORM: the session factory
    and PostgreSQL's dialect are imported on first use."""

    def __init__(self, engine: Engine, url: URL) -> None:
        self._engine = engine
        self._url = url

    @cached_property
    def _sessions(self) -> sessionmaker[Session]:
        from sqlalchemy.orm import sessionmaker

        return sessionmaker(self._engine, expire_on_commit=False)

    @property
    def url(self) -> str:
        """The database URL with its password masked."""
        return mask_url(self._url)

    @classmethod
    def open(cls, url: str, *, create: bool = False, wait_s: float | None = None) -> Self:
        """Connect and check the schema; with `create`, an empty database is migrated to head;
        `wait_s` bounds every wait for the database (`make_engine`).

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
        engine = make_engine(url, create=create, wait_s=wait_s)
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

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Call `callback` at each commit from now on: the kill switch stops saying that
        it waits for the database once its transaction commits."""
        event.listen(self._engine, "commit", lambda _connection: callback())

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

    @contextmanager
    def _connection(self, action: str) -> Iterator[Connection]:
        """A Core connection in a transaction, committed when the block ends."""
        with self._translating(action), self._engine.begin() as connection:
            yield connection

    def _insert_ignoring_duplicates(
        self, model: Table | type[Any], values: dict[str, Any], unique: list[str]
    ) -> Any:
        if self._engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as postgresql_insert

            return (
                postgresql_insert(model)
                .values(values)
                .on_conflict_do_nothing(index_elements=unique)
            )
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(model).values(values).on_conflict_do_nothing(index_elements=unique)
