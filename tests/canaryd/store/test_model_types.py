"""The schema's column types: JSON columns are JSONB on PostgreSQL and JSON elsewhere,
chosen when a dialect compiles them (declaring them imports no PostgreSQL dialect), and
store Python `None` as SQL NULL on both."""

from __future__ import annotations

import subprocess
import sys

from sqlalchemy import Column, MetaData, Table, create_engine, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.schema import CreateTable

from canaryd.store.model_types import json_column_type


class TestJsonColumn:
    def test_is_jsonb_on_postgresql_and_json_on_sqlite(self) -> None:
        """The DDL is what the migrations create: JSONB on PostgreSQL, JSON on SQLite."""
        table = Table("t", MetaData(), Column("data", json_column_type()))
        assert "data JSONB" in str(CreateTable(table).compile(dialect=postgresql.dialect()))
        on_sqlite = str(CreateTable(table).compile(dialect=sqlite.dialect()))
        assert "data JSON" in on_sqlite
        assert "JSONB" not in on_sqlite

    def test_declaring_one_imports_no_postgresql_dialect(self) -> None:
        """A fresh interpreter that declares a JSON column has not imported PostgreSQL's
        dialect (the kill switch on SQLite never needs it)."""
        code = (
            "import sys\n"
            "from sqlalchemy import Column, MetaData, Table\n"
            "from canaryd.store.model_types import json_column_type\n"
            "Table('t', MetaData(), Column('data', json_column_type()))\n"
            "print('sqlalchemy.dialects.postgresql' in sys.modules)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
        )
        assert done.stdout.strip() == "False"

    def test_none_is_stored_as_sql_null(self) -> None:
        """Python `None` becomes SQL NULL, not the JSON text `null`."""
        table = Table("t", MetaData(), Column("data", json_column_type()))
        engine = create_engine("sqlite://")
        with engine.begin() as connection:
            table.create(connection)
            connection.execute(insert(table), [{"data": None}, {"data": {"a": [1]}}])
            raw = connection.exec_driver_sql("SELECT data FROM t ORDER BY rowid").all()
            assert [r[0] for r in raw] == [None, '{"a": [1]}']
            assert connection.scalars(select(table.c.data)).all() == [None, {"a": [1]}]
        engine.dispose()
