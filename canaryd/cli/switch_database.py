"""How a `canaryd switch` command holds the database: opened without creating one, every
wait bounded (`DATABASE_WAIT_S`, like the state file's lock: SQLite's busy timeout,
PostgreSQL's connect, lock and statement timeouts), a line on stderr as soon as it has
to wait, and every failure as the one-line `DatabaseError` that sends the kill switch
down its emergency path.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from canaryd.errors import DatabaseError
from canaryd.store.database import driver_message, mask_url
from canaryd.store.switching_sql import SqlSwitchStore  # the switch half: no history mapping
from canaryd.switch.statefile import LOCK_WAIT_S

__all__ = ["DATABASE_WAIT_S", "database_failures", "switch_database"]

# The database's waits are bounded like the state file's lock: a lock another writer
# holds (SQLite's busy timeout, PostgreSQL's lock timeout), a slow connect or statement.
DATABASE_WAIT_S = LOCK_WAIT_S
# Past this, the command says it is waiting; an uncontended database answers sooner.
SPEAK_AFTER_S = 0.3


def _database_error(exc: Exception, url: str) -> DatabaseError:
    """Any failure of the database as the one-line `DatabaseError` the CLI prints."""
    if isinstance(exc, DatabaseError):
        return exc
    detail = driver_message(exc) if isinstance(exc, DBAPIError) else f"{exc}"
    return DatabaseError(f"the database {mask_url(url)} failed: {type(exc).__name__}: {detail}")


@contextmanager
def database_failures(url: str) -> Iterator[None]:
    """Every failure of the database (not only an unreachable one: a corrupt file, a
    read-only standby, a refused privilege, a lock held too long) as `DatabaseError`."""
    try:
        yield
    except (DatabaseError, SQLAlchemyError, OSError) as exc:
        raise _database_error(exc, url) from exc


@contextmanager
def _spoken_wait(url: str, then: str) -> Iterator[threading.Timer]:
    """A line on stderr once the database has kept the command waiting `SPEAK_AFTER_S`,
    saying for what, for how long at most, and what follows; cancel the timer it yields
    when the database has answered."""

    def speak() -> None:
        typer.echo(
            f"canaryd: waiting for the database {mask_url(url)} (a lock another writer "
            f"holds, or a slow server): at most {DATABASE_WAIT_S:g} s, then {then}",
            err=True,
        )

    timer = threading.Timer(SPEAK_AFTER_S, speak)
    timer.daemon = True
    timer.start()
    try:
        yield timer
    finally:
        timer.cancel()


@contextmanager
def switch_database(url: str, then: str) -> Iterator[SqlSwitchStore]:
    """The switch's store at `url` (never created: a missing database is a wrong URL far
    more often than a new box), its waits bounded and spoken (`then`: what follows when
    the wait runs out), its failures as `DatabaseError`. The line is no longer spoken
    once a transaction commits: the hooks that follow have their own timeouts."""
    with (
        _spoken_wait(url, then) as waiting,
        database_failures(url),
        SqlSwitchStore.open(url, wait_s=DATABASE_WAIT_S) as store,
    ):
        store.on_commit(waiting.cancel)
        yield store
