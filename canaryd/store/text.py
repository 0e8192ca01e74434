"""Text every database backend can store.

`storable` makes a pair's text storable: NUL characters, which PostgreSQL refuses in text
and JSON alike, become U+FFFD on every backend, so both store the same pair. The daemon's
pair writer and the one-shot commands (`once`, `judge`) clean each pair with it before
saving it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gates.records import PairRecord

__all__ = ["storable"]

_NUL = "\x00"
_REPLACEMENT = "\ufffd"


def _clean(value: Any) -> Any:
    """`value` with NUL characters replaced in every string inside it; the very same
    object when there was none, so that callers can tell whether anything changed."""
    if isinstance(value, str):
        return value.replace(_NUL, _REPLACEMENT) if _NUL in value else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for spec in dataclasses.fields(value):
            old = getattr(value, spec.name)
            new = _clean(old)
            if new is not old:
                changes[spec.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, tuple | list):
        items = [_clean(item) for item in value]
        changed = any(new is not old for new, old in zip(items, value, strict=True))
        return type(value)(items) if changed else value
    if isinstance(value, dict):
        pairs = [(_clean(key), _clean(item)) for key, item in value.items()]
        changed = any(
            new_key is not old_key or new is not old
            for (new_key, new), (old_key, old) in zip(pairs, value.items(), strict=True)
        )
        return dict(pairs) if changed else value
    return value


def storable(record: PairRecord) -> tuple[PairRecord, bool]:
    """The pair with every NUL character in its text replaced by U+FFFD, and whether any
    was (the record itself when none was)."""
    cleaned = _clean(record)
    return cleaned, cleaned is not record
