"""The building blocks of canaryd's SQL schema, in SQLAlchemy Core: the one `metadata`
(with deterministic constraint names), `UTCDateTime` and `json_column_type`.

Apart from `canaryd.store.models` (the ORM models and their declarative `Base`, which
shares this `metadata`) so that the switch's tables (`canaryd.store.switching_tables`) can
be declared and queried without the ORM, and without PostgreSQL's dialect on SQLite: the
kill switch imports only what it queries. `canaryd.store.models` re-exports all of them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, MetaData
from sqlalchemy.engine import Dialect
from sqlalchemy.types import DateTime, TypeDecorator, TypeEngine

__all__ = ["NAMING_CONVENTION", "JsonColumn", "UTCDateTime", "json_column_type", "metadata"]

# Deterministic constraint names, so later migrations (and SQLite batch mode) can refer
# to them by name on both backends.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime that round-trips on SQLite and PostgreSQL.

    PostgreSQL stores `timestamptz`; SQLite has no time zones, so the value is stored as
    naive UTC text (which sorts correctly) and re-attached to UTC when read. A naive
    datetime is refused: its zone would be a guess.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: canaryd stores timezone-aware UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class JsonColumn(TypeDecorator[Any]):
    """JSON that stores Python `None` as SQL NULL; JSONB on PostgreSQL.

    A decorator rather than `JSON().with_variant(JSONB(), "postgresql")`: the variant
    needs a JSONB instance when the column is declared, which imports PostgreSQL's
    dialect (tens of milliseconds) into every command, the kill switch's on SQLite
    included; here it is imported when a PostgreSQL engine first compiles the type.
    """

    impl = JSON(none_as_null=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB(none_as_null=True))
        return dialect.type_descriptor(JSON(none_as_null=True))


def json_column_type() -> TypeEngine[Any]:
    """JSON that stores Python `None` as SQL NULL; JSONB on PostgreSQL."""
    return JsonColumn()
