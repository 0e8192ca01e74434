"""Which of several daemons on one database leads: runs the gates and writes the switch.

Every daemon on a database shares its one switch row, so the switch target is the
database (on PostgreSQL, the schema that holds the switch): one leader per database,
whatever state files the daemons write. All daemons measure and store pairs; only the
leader evaluates the gates and steps the switch. `Leadership` is that seam: `acquire()`
takes leadership or re-checks that it is still held, without waiting (every gate run
calls it, so a follower takes over within one gate interval of the leader's death),
`release()` gives it up, and `holder()` says which instance leads now.
`leadership_for(url)` builds it for a database URL:

- PostgreSQL: a session-level advisory lock (`pg_try_advisory_lock`) held on a dedicated
  autocommit connection, keyed by a hash of the schema. The server frees it when the
  session ends: the process died, or the connection dropped (TCP keepalives, set on both
  ends, bound how long a vanished host keeps it). A connection that no longer answers
  is leadership lost, and a new connection tries again at once. The connection's
  `application_name` names the instance, which `holder()` reads from `pg_locks`.
- SQLite: an exclusive non-blocking `flock` on `<database>.leader.lock` beside the
  database file, which the kernel frees when the process dies; the holder writes its
  instance and since into the file for `holder()`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import structlog
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from canaryd.errors import DatabaseError
from canaryd.redact import redact_text
from canaryd.store.database import make_engine, parse_url, sqlite_path
from canaryd.switch.statefile import open_lock_file

__all__ = [
    "APPLICATION_PREFIX",
    "FileLeadership",
    "Holder",
    "Leadership",
    "PostgresLeadership",
    "advisory_key",
    "instance_id",
    "leadership_for",
    "lock_file_for",
]

log = structlog.get_logger(__name__)

APPLICATION_PREFIX = "canaryd leader "  # the leadership session's application_name
_APPLICATION_NAME_MAX = 63  # PostgreSQL truncates application_name to NAMEDATALEN - 1
# Client keepalives notice a dead server or network; the server's (session settings)
# end a vanished leader's session, freeing the lock, in about idle + count x interval.
_CLIENT_KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}
_SERVER_KEEPALIVES = (
    "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"
)


def instance_id() -> str:
    """This process as the other daemons see it: `hostname:pid`."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Holder:
    """Who leads: the leader's instance (`hostname:pid`) and since when (None: unknown)."""

    instance: str
    since: datetime | None

    def as_json(self) -> dict[str, str | None]:
        return {"instance": self.instance, "since": self.since.isoformat() if self.since else None}


class Leadership(Protocol):
    """Leadership of the gates and the switch among the daemons on one database."""

    @property
    def instance(self) -> str: ...

    def acquire(self) -> bool:
        """Take leadership, or check that it is still held; never waits, never raises.
        False: another instance leads, or the lock cannot be reached now."""
        ...

    def release(self) -> None:
        """Give leadership up (idempotent); another daemon can take it at once."""
        ...

    def holder(self) -> Holder | None:
        """Who leads now; None when nobody does. Raises `DatabaseError`."""
        ...

    def close(self) -> None:
        """Release, and free the connection or file this holds."""
        ...


def advisory_key(schema: str) -> int:
    """The advisory lock key of the switch in `schema`: a positive 63-bit hash."""
    digest = hashlib.sha256(f"canaryd.switch-leader:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def _one_line(exc: SQLAlchemyError) -> str:
    cause = exc.orig if isinstance(exc, DBAPIError) else exc
    return redact_text(" ".join(str(cause).split()) or type(cause).__name__)


class PostgresLeadership:
    """Leadership as a session-level advisory lock on a connection of its own."""

    def __init__(self, url: URL, instance: str) -> None:
        self._instance = instance
        options = " ".join(filter(None, [str(url.query.get("options", "")), _SERVER_KEEPALIVES]))
        name = f"{APPLICATION_PREFIX}{instance}"[:_APPLICATION_NAME_MAX]
        url = url.update_query_dict(
            {**_CLIENT_KEEPALIVES, "application_name": name, "options": options}
        )
        self._engine: Engine = make_engine(url.render_as_string(hide_password=False))
        self._lock = threading.Lock()
        self._connection: Connection | None = None
        self._since: datetime | None = None

    @property
    def instance(self) -> str:
        return self._instance

    def _key(self, connection: Connection) -> int:
        schema = connection.execute(text("SELECT current_schema()")).scalar()
        return advisory_key(str(schema or ""))

    def acquire(self) -> bool:
        with self._lock:
            if self._connection is not None:
                try:
                    self._connection.execute(text("SELECT 1"))
                    return True
                except SQLAlchemyError as exc:
                    log.warning("leader.lost", instance=self._instance, reason=_one_line(exc))
                    self._drop()
            connection: Connection | None = None
            try:
                # AUTOCOMMIT: the session idles between gate runs, and idling inside a
                # transaction would get it killed by idle_in_transaction_session_timeout.
                connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                key = self._key(connection)
                taken = connection.execute(
                    text("SELECT pg_try_advisory_lock(:key)"), {"key": key}
                ).scalar()
            except SQLAlchemyError as exc:
                log.warning("leader.unavailable", instance=self._instance, reason=_one_line(exc))
                if connection is not None:
                    _discard(connection)
                return False
            if not taken:
                _discard(connection)
                return False
            self._connection, self._since = connection, datetime.now(UTC)
            return True

    def _drop(self) -> None:
        if self._connection is not None:
            _discard(self._connection)
        self._connection, self._since = None, None

    def release(self) -> None:
        with self._lock:
            self._drop()

    def holder(self) -> Holder | None:
        with self._lock:
            if self._connection is not None and self._since is not None:
                return Holder(self._instance, self._since)
        try:
            with self._engine.connect() as connection:
                key = self._key(connection)
                row = connection.execute(
                    text(
                        "SELECT l.pid, a.application_name, a.backend_start FROM pg_locks l "
                        "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
                        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                        "AND l.database = (SELECT oid FROM pg_database "
                        "WHERE datname = current_database()) "
                        "AND CAST(l.classid AS bigint) = :high "
                        "AND CAST(l.objid AS bigint) = :low"
                    ),
                    {"high": key >> 32, "low": key & 0xFFFF_FFFF},
                ).first()
        except SQLAlchemyError as exc:
            raise DatabaseError(f"cannot read the switch leader: {_one_line(exc)}") from exc
        if row is None:
            return None
        pid, application, started = row
        if isinstance(application, str) and application.startswith(APPLICATION_PREFIX):
            return Holder(application.removeprefix(APPLICATION_PREFIX), started)
        # Another role's sessions may hide their application_name from this one.
        return Holder(f"PostgreSQL backend {pid}", started)

    def close(self) -> None:
        self.release()
        self._engine.dispose()


def _discard(connection: Connection) -> None:
    """Close the DBAPI connection itself: returned to a pool, the session (and the lock
    it holds) would live on."""
    with contextlib.suppress(SQLAlchemyError):
        connection.invalidate()
    with contextlib.suppress(SQLAlchemyError):
        connection.close()


class FileLeadership:
    """Leadership as an exclusive `flock` on a lock file (SQLite: beside the database)."""

    def __init__(self, path: Path, instance: str) -> None:
        self.path = path
        self._instance = instance
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._since: datetime | None = None

    @property
    def instance(self) -> str:
        return self._instance

    def _still_ours(self, fd: int) -> bool:
        # A lock file deleted or replaced by hand leaves this lock on an inode nobody
        # else will ever open: another daemon locks the new file and leads too.
        try:
            held, named = os.fstat(fd), self.path.stat()
        except OSError:
            return False
        return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)

    def acquire(self) -> bool:
        with self._lock:
            if self._fd is not None:
                if self._still_ours(self._fd):
                    return True
                log.warning(
                    "leader.lost",
                    instance=self._instance,
                    reason=f"the lock file {str(self.path)!r} was removed or replaced",
                )
                self._drop()
            try:
                fd = open_lock_file(self.path)
            except OSError as exc:
                log.error("leader.unavailable", instance=self._instance, reason=str(exc))
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return False
            self._fd, self._since = fd, datetime.now(UTC)
            self._write_holder(fd)
            return True

    def _write_holder(self, fd: int) -> None:
        body = json.dumps(Holder(self._instance, self._since).as_json()).encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, body, 0)
        except OSError:  # a lock file another user created read-only: holder unknown
            return

    def _drop(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
        self._fd, self._since = None, None

    def release(self) -> None:
        with self._lock:
            self._drop()

    def holder(self) -> Holder | None:
        with self._lock:
            if self._fd is not None:
                return Holder(self._instance, self._since)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DatabaseError(f"cannot read the leader lock file: {exc}") from exc
        try:
            try:
                # A shared lock is granted only while nobody holds the exclusive one.
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return _recorded_holder(fd)
            return None
        finally:
            os.close(fd)

    def close(self) -> None:
        self.release()


def _recorded_holder(fd: int) -> Holder:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = datetime.fromisoformat(data["since"]) if data.get("since") else None
        return Holder(str(data.get("instance") or "unknown"), since)
    except (OSError, ValueError, TypeError, AttributeError):
        return Holder("unknown", None)


def lock_file_for(database: Path) -> Path:
    """The SQLite leader lock file of `database`."""
    return database.with_name(f"{database.name}.leader.lock")


def leadership_for(url: str, *, instance: str | None = None) -> Leadership:
    """The leadership of the switch in the database at `url` (`DatabaseError` for a URL
    that does not parse)."""
    parsed = parse_url(url)
    who = instance or instance_id()
    path = sqlite_path(parsed)
    if path is not None:
        return FileLeadership(lock_file_for(path.expanduser()), who)
    return PostgresLeadership(parsed, who)
