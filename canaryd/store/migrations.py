"""Schema revisions: which Alembic revision a database is at, what is wrong with it, and
migrating it to the head revision this canaryd ships.

This module owns Alembic's configuration (independent of any ini file), the head and
known revisions, the one-line explanation of a database that is not current (no schema,
older, or newer than this canaryd) with the command that fixes it, and upgrading in one
transaction. A database is never downgraded. Only upgrading imports Alembic: the revisions
this canaryd ships are read from the migration files' names (`NNNN_what.py` defines
revision `NNNN`, each revising the one before; a test holds them to Alembic's reading), and a
database's revision from its `alembic_version` table, so that checking the schema (every
command that opens the database, the kill switch among them) costs no Alembic import.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

from sqlalchemy import Engine, inspect, text
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

if TYPE_CHECKING:
    from alembic.config import Config

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
# A migration file's name: its revision, then what it changes (`0007_arms.py`).
_MIGRATION_FILE = re.compile(r"(\d{4})_\w+\.py")
# Alembic's table of the revision a database is at (its default name and one column).
_VERSION_TABLE = "alembic_version"
_READ_VERSION = text(f"SELECT version_num FROM {_VERSION_TABLE}")  # noqa: S608 - a constant


def alembic_config() -> Config:
    """Alembic's configuration for canaryd's migrations, independent of any ini file."""
    from alembic.config import Config

    config = Config()
    # ConfigParser interpolates `%`; a path containing one must be escaped.
    config.set_main_option("script_location", str(alembic_dir()).replace("%", "%%"))
    return config


def known_revisions() -> set[str]:
    """Every schema revision this canaryd ships a migration for."""
    versions = alembic_dir() / "versions"
    return {
        match.group(1)
        for path in versions.iterdir()
        if (match := _MIGRATION_FILE.fullmatch(path.name)) is not None
    }


def head_revision() -> str:
    """The schema revision this canaryd needs: the highest numbered migration."""
    known = known_revisions()
    if not known:  # pragma: no cover - the package always ships migrations
        raise RuntimeError(f"no migrations under {alembic_dir()}")
    return max(known)


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
            if not inspect(connection).has_table(_VERSION_TABLE):
                return None
            rows = connection.execute(_READ_VERSION)
            revisions = list(rows.scalars())
    except SQLAlchemyError as exc:  # it answered, but cannot be used (a corrupt file)
        raise DatabaseError(unusable_database(url, exc)) from exc
    if len(revisions) > 1:  # canaryd's migrations are one line: never two heads
        raise DatabaseError(
            f"database {mask_url(url)} has {len(revisions)} schema revisions "
            f"({', '.join(sorted(revisions))}) in {_VERSION_TABLE}; canaryd expects one"
        )
    return revisions[0] if revisions else None


@contextmanager
def _unusable(url: URL) -> Iterator[None]:
    try:
        yield
    except SQLAlchemyError as exc:
        raise DatabaseError(unusable_database(url, exc)) from exc


def upgrade_engine(engine: Engine, url: URL) -> None:
    """Migrate the database behind `engine` to head, all of it or nothing."""
    from alembic import command

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
