"""Database URLs and engines: where canaryd's history lives and how to connect to it.

This module owns parsing and masking the URL (which URL: `StorageConfig.resolved_url`),
the supported drivers, and turning it into a
configured engine (SQLite: WAL, busy timeout, foreign keys, transactional DDL, synced
commits for the switch;
PostgreSQL: pre-ping, connect timeout). It also turns a driver failure into the one-line
`DatabaseError` a person can act on (unreachable server, unwritable SQLite directory).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)

from canaryd.errors import DatabaseError

__all__ = [
    "EXPECTED_URL_FORMS",
    "POSTGRESQL_CONNECT_TIMEOUT_S",
    "SQLITE_BUSY_TIMEOUT_S",
    "SQLITE_DURABLE",
    "SQLITE_IMMEDIATE",
    "connecting",
    "driver_message",
    "make_engine",
    "mask_url",
    "parse_url",
    "sqlite_path",
]

EXPECTED_URL_FORMS = "sqlite:///path or postgresql+psycopg://user:pass@host/db"
SQLITE_BUSY_TIMEOUT_S = 30.0  # a writer waits this long for another writer; `?timeout=` overrides
POSTGRESQL_CONNECT_TIMEOUT_S = 10  # `?connect_timeout=` overrides
# Server-side limits (one named in `?options=-c name=value` overrides its default): a
# held row lock, a stuck query or a session left idle in a transaction fails instead of
# hanging the daemon or the kill switch, which then takes its emergency path.
POSTGRESQL_STATEMENT_TIMEOUT_MS = 30_000
POSTGRESQL_LOCK_TIMEOUT_MS = 10_000
POSTGRESQL_IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
SQLITE_IMMEDIATE = "canaryd_sqlite_immediate"  # execution option read by _sqlite_on_begin
SQLITE_DURABLE = "canaryd_sqlite_durable"  # likewise: this transaction's commit is synced
_SUPPORTED_DRIVERS = {
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite+pysqlite",
    # Plain `postgresql://` would mean psycopg2, which canaryd does not ship.
    "postgresql": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}


_SECRET_QUERY_KEYS = {"password", "passwd", "sslpassword", "passfile", "sslkey"}


def mask_url(url: str | URL) -> str:
    """The URL with its password — in the netloc or as a query parameter such as
    `?password=` — replaced by `***`, even when it does not parse."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except (ArgumentError, ValueError):
        text = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", str(url))
        keys = "|".join(sorted(_SECRET_QUERY_KEYS))
        return re.sub(rf"([?&](?:{keys})=)[^&]*", r"\1***", text, flags=re.IGNORECASE)
    secret = [k for k in parsed.query if k.lower() in _SECRET_QUERY_KEYS]
    if secret:
        parsed = parsed.update_query_dict({k: "***" for k in secret})
    return parsed.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def parse_url(url: str) -> URL:
    """`url` parsed, with its driver made the one canaryd ships; `DatabaseError` for a URL
    that does not parse, an unsupported driver, or an in-memory SQLite database."""
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


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL; None for any other backend."""
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
    options = connection.get_execution_options()
    immediate = options.get(SQLITE_IMMEDIATE, False)
    # Under WAL, NORMAL may lose the last commits to a power cut (never corrupts); a
    # switch transition must not be lost, so its transaction syncs the log at commit.
    # The level is per connection and the pool shares them: every BEGIN sets its own.
    durable = options.get(SQLITE_DURABLE, False)
    connection.exec_driver_sql(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_engine(url: str, *, create: bool = False, wait_s: float | None = None) -> Engine:
    """A configured engine for `url`; `create` makes a SQLite file's directory. `wait_s`
    bounds every wait for the database whatever the URL says (SQLite's busy timeout;
    PostgreSQL's connect, lock and statement timeouts): the kill switch's, which must
    give up and take its emergency path in seconds."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_path(parsed)
        if create and path is not None:
            path.expanduser().parent.mkdir(parents=True, exist_ok=True)
        connect_args: dict[str, Any] = {"check_same_thread": False}
        if wait_s is not None:
            connect_args["timeout"] = wait_s  # connect_args win over the URL's query
        elif "timeout" not in parsed.query:
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
    limits = _postgresql_limits(str(parsed.query.get("options", "")))
    if wait_s is not None:
        connect_args["connect_timeout"] = max(1, math.ceil(wait_s))  # libpq: whole seconds
        # After the URL's own: the last `-c` of a name wins.
        wait_ms = max(1, round(wait_s * 1000))
        limits = f"{limits} -c lock_timeout={wait_ms} -c statement_timeout={2 * wait_ms}"
    if limits:
        connect_args["options"] = " ".join(
            [*([str(parsed.query["options"])] if "options" in parsed.query else []), limits]
        )
    # pre-ping: a connection the server dropped while idle in the pool is replaced at
    # checkout instead of failing the next save.
    return create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)


def _postgresql_limits(user_options: str) -> str:
    """`-c` options for the default limits the URL's own `options` does not set."""
    defaults = {
        "statement_timeout": POSTGRESQL_STATEMENT_TIMEOUT_MS,
        "lock_timeout": POSTGRESQL_LOCK_TIMEOUT_MS,
        "idle_in_transaction_session_timeout": POSTGRESQL_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    }
    return " ".join(
        f"-c {name}={value}" for name, value in defaults.items() if name not in user_options
    )


def driver_message(exc: DBAPIError) -> str:
    """The driver's message on one line."""
    return " ".join(str(exc.orig).split()) or type(exc.orig).__name__


def unusable_database(url: URL, exc: SQLAlchemyError) -> str:
    """One line on a database that answered but cannot be used (a corrupt SQLite file,
    a refused query at open), naming it and what to do."""
    reason = driver_message(exc) if isinstance(exc, DBAPIError) else str(exc).split("\n")[0]
    if url.get_backend_name() == "sqlite":
        return (
            f"SQLite database {url.database!r} cannot be used: {reason}; if the file is "
            "corrupt, move it away (keep it for inspection) or restore it from a backup, "
            f"then `canaryd db upgrade --url {mask_url(url)}` creates a new one"
        )
    return (
        f"database {mask_url(url)!r} cannot be used: {reason}; check the server's log "
        "and that this user may read the schema (`canaryd db current`)"
    )


def _unreachable(url: URL, exc: DBAPIError) -> DatabaseError:
    if url.get_backend_name() == "sqlite":
        return DatabaseError(
            f"cannot open SQLite database {url.database!r}: {driver_message(exc)}; check "
            f"that the directory exists and is writable by this user"
        )
    host = f"{url.host or 'localhost'}:{url.port or 5432}"
    return DatabaseError(
        f"cannot connect to PostgreSQL at {host} (database {url.database!r}, user "
        f"{url.username!r}): {driver_message(exc)}; check that the server is running and "
        f"reachable from here, and the user, password and database name in {mask_url(url)!r}"
    )


@contextmanager
def connecting(url: URL) -> Iterator[None]:
    """Around opening a connection: a database that cannot be reached becomes
    `DatabaseError` saying what to check."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        raise _unreachable(url, exc) from exc
