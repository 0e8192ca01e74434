"""Record fields <-> columns of the same name: the generic half of the store's mapping.

This module owns the rule every mapping in `canaryd.store.mapping` and
`canaryd.store.switching_mapping` builds on: a dataclass field stored in a column of the
same name (or a `renamed` one) is written and read without being spelled out, enums by
value and tuples as JSON lists, with `convert` for the fields whose column holds another
shape; and `aware`, which refuses a naive datetime before it reaches a row.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import fields
from datetime import datetime
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Table, inspect

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from sqlalchemy.orm import DeclarativeBase

__all__ = ["Convert", "aware", "column_value", "from_row", "row_values"]

R = TypeVar("R", bound="DataclassInstance")
Convert = Callable[[Any], Any]
_NONE: Mapping[str, Any] = MappingProxyType({})


def aware(value: datetime, what: str) -> datetime:
    """`value` itself; `ValueError` when it is naive (its zone would be a guess)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} {value!r} is naive; canaryd stores timezone-aware UTC")
    return value


@cache
def _model_columns(model: type[DeclarativeBase]) -> frozenset[str]:
    return frozenset(attribute.key for attribute in inspect(model).column_attrs)


def _columns(model: Table | type[DeclarativeBase]) -> frozenset[str]:
    """The columns of a Core table, or the column attributes of an ORM model."""
    if isinstance(model, Table):
        return frozenset(model.c.keys())
    return _model_columns(model)


def _row_columns(row: Any) -> frozenset[str]:
    """The columns of a Core `Row` (its fields) or of an ORM model's instance."""
    fields_of_row: tuple[str, ...] | None = getattr(row, "_fields", None)
    return frozenset(fields_of_row) if fields_of_row is not None else _columns(type(row))


def column_value(value: Any) -> Any:
    """`value` as a column stores it: enums by value, tuples as lists, dicts copied."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def row_values(
    record: DataclassInstance,
    model: Table | type[DeclarativeBase],
    *,
    renamed: Mapping[str, str] = _NONE,
    convert: Mapping[str, Convert] = _NONE,
) -> dict[str, Any]:
    """The fields of `record` that `model` (a Core table or an ORM model) has a column for
    (of the same name unless `renamed`), as the column stores them: through `convert`,
    else enums by value and tuples as lists. Fields without a column (nested records) are
    left to the caller."""
    columns = _columns(model)
    values: dict[str, Any] = {}
    for spec in fields(record):
        column = renamed.get(spec.name, spec.name)
        if column in columns:
            value = getattr(record, spec.name)
            values[column] = (
                convert[spec.name](value) if spec.name in convert else (column_value(value))
            )
    return values


def from_row(
    record_type: type[R],
    row: Any,
    *,
    renamed: Mapping[str, str] = _NONE,
    convert: Mapping[str, Convert] = _NONE,
    **nested: Any,
) -> R:
    """A `record_type` read from the columns of `row` (a Core `Row` or an ORM model's
    instance) named like its fields (or `renamed`), through `convert`; fields without a
    column are given as `nested`."""
    columns = _row_columns(row)
    values = dict(nested)
    for spec in fields(record_type):
        column = renamed.get(spec.name, spec.name)
        if spec.name not in nested and column in columns:
            value = getattr(row, column)
            values[spec.name] = convert[spec.name](value) if spec.name in convert else value
    return record_type(**values)
