"""Schema revisions: which Alembic revision a database is at, what is wrong with it, and
migrating it to the head revision this canaryd ships.

This module owns Alembic's configuration (independent of any ini file), the head and
known revisions, the one-line explanation of a database that is not current (no schema,
older, or newer than this canaryd) with the command that fixes it, and upgrading in one
transaction. A database is never downgraded.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from canaryd.errors import DatabaseError
from canaryd.paths import alembic_dir
from canaryd.store.database import (
    SQLITE_IMMEDIATE,
    connecting,
    make_engine,
    mask_url,
    parse_url,
    sqlite_path,
    unusable_database,
)

__all__ = [
    "alembic_config",
    "current_revision",
    "head_revision",
    "known_revisions",
    "read_revision",
    "schema_problem",
    "upgrade",
    "upgrade_engine",
]

# Held until the upgrade's transaction ends; keyed by schema, like the schema itself.
_MIGRATION_LOCK = text(
    "SELECT pg_advisory_xact_lock(hashtextextended("
    "'canaryd.migrate:' || coalesce(current_schema(), ''), 0))"
)


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


def read_revision(engine: Engine, url: URL) -> str | None:
    """The revision of the database behind `engine`; None when it has no canaryd schema."""
    try:
        with connecting(url), engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    except SQLAlchemyError as exc:  # it answered, but cannot be used (a corrupt file)
        raise DatabaseError(unusable_database(url, exc)) from exc


@contextmanager
def _unusable(url: URL) -> Iterator[None]:
    try:
        yield
    except SQLAlchemyError as exc:
        raise DatabaseError(unusable_database(url, exc)) from exc


def upgrade_engine(engine: Engine, url: URL) -> None:
    """Migrate the database behind `engine` to head, all of it or nothing."""
    config = alembic_config()
    with connecting(url):
        # SQLite: the write lock from BEGIN on, so a second migrator waits for the first
        # and then reads its revision, instead of failing on a stale snapshot.
        connection = engine.connect().execution_options(**{SQLITE_IMMEDIATE: True})
    # One transaction for the whole upgrade: DDL is transactional on both backends.
    with _unusable(url), connection, connection.begin():
        if url.get_backend_name() == "postgresql":
            # Daemons started together on an empty database migrate one after the other
            # (the later ones then find it at head) instead of colliding on CREATE TABLE.
            connection.execute(_MIGRATION_LOCK)
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def current_revision(url: str) -> str | None:
    """The schema revision of the database at `url`; None when it has no canaryd schema.

    A SQLite file that does not exist is reported as None and is not created.
    """
    parsed = parse_url(url)
    path = sqlite_path(parsed)
    if path is not None and not path.expanduser().exists():
        return None
    engine = make_engine(url)
    try:
        return read_revision(engine, parsed)
    finally:
        engine.dispose()


def upgrade(url: str) -> str:
    """Migrate the database at `url` to this canaryd's head revision and return it.

    An empty database (or a SQLite file that does not exist yet) is created from scratch;
    a database newer than this canaryd is refused, never downgraded.
    """
    parsed = parse_url(url)
    engine = make_engine(url, create=True)
    try:
        current = read_revision(engine, parsed)
        head = head_revision()
        if current is not None and current not in known_revisions():
            raise DatabaseError(cast(str, schema_problem(current, head, set(), mask_url(parsed))))
        if current != head:
            upgrade_engine(engine, parsed)
        return head
    finally:
        engine.dispose()
