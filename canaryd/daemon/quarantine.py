"""Pairs the database cannot store as they are.

`storable` makes a pair's text storable: NUL characters, which PostgreSQL refuses in text
and JSON alike, become U+FFFD on every backend, so both store the same pair. `Quarantine`
keeps the pairs the database still refuses (a number out of range from a garbage server,
a value it cannot hold) in a JSON-lines file under the data directory, one object per
pair with the reason, readable only by canaryd's user (the pairs hold prompt and output
text). The file is bounded: past `QUARANTINE_MAX_BYTES` it is rotated to one `.1` file,
so at most about twice that is kept.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from canaryd import paths
from gates.records import PairRecord

__all__ = [
    "QUARANTINE_FILE",
    "QUARANTINE_MAX_BYTES",
    "Quarantine",
    "default_quarantine_path",
    "storable",
]

QUARANTINE_FILE = "quarantined-pairs.jsonl"
QUARANTINE_MAX_BYTES = 16 * 1024 * 1024
_NUL = "\x00"
_REPLACEMENT = "\ufffd"


def default_quarantine_path() -> Path:
    """`quarantined-pairs.jsonl` in the data directory (`CANARYD_DATA_DIR`)."""
    return paths.data_dir() / QUARANTINE_FILE


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


class Quarantine:
    """An append-only JSON-lines file of pairs that could not be stored, rotated to one
    `.1` file past `max_bytes`. Thread-safe; `add` raises `OSError` when the file cannot
    be written (the caller says so: the pair is then lost)."""

    def __init__(self, path: Path, max_bytes: int = QUARANTINE_MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    @property
    def rotated(self) -> Path:
        return self.path.with_name(self.path.name + ".1")

    def add(self, record: PairRecord, reason: str, detail: str = "") -> None:
        """Append `record` with `reason`, the time and any `detail` (a traceback) as one
        line."""
        entry: dict[str, Any] = {
            "quarantined_at": datetime.now(UTC).isoformat(),
            "reason": reason,
            "pair": dataclasses.asdict(record),
        }
        if detail:
            entry["detail"] = detail
        # ensure_ascii: control characters (the NUL that may be why) stay escaped.
        line = (json.dumps(entry, default=str, ensure_ascii=True) + "\n").encode()
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size and size + len(line) > self.max_bytes:
                self.path.replace(self.rotated)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "ab") as file:
                file.write(line)
