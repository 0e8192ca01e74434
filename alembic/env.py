"""Alembic environment for canaryd: where the database URL and connection come from.

`canaryd db upgrade` (canaryd.store.migrations.upgrade) hands over an open connection in
`config.attributes["connection"]`, already configured by canaryd (SQLite pragmas,
transactional DDL). The plain Alembic CLI takes the URL from `-x url=…`, else
CANARYD_DATABASE_URL, else `sqlalchemy.url` in the ini file, else canaryd's default.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from canaryd.paths import default_database_url
from canaryd.store.database import make_engine
from canaryd.store.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return (
        context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get("CANARYD_DATABASE_URL")
        or config.get_main_option("sqlalchemy.url")
        or default_database_url()
    )


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _configure(given)
        return
    if config.config_file_name is not None:
        fileConfig(config.config_file_name)
    engine = make_engine(_url(), create=True)
    try:
        with engine.begin() as connection:
            _configure(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
