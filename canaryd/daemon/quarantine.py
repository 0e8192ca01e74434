"""Pairs the database cannot store, kept aside.

`Quarantine` keeps the pairs the database still refuses once their text is made storable
(`canaryd.store.text`): a number out of range from a garbage server, a value it cannot
hold. They go to a JSON-lines file under the data directory, one object per pair with the
reason, readable only by canaryd's user (the pairs hold prompt and output text). The file
is bounded: past `QUARANTINE_MAX_BYTES` it is rotated to one `.1` file,
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
]

QUARANTINE_FILE = "quarantined-pairs.jsonl"
QUARANTINE_MAX_BYTES = 16 * 1024 * 1024


def default_quarantine_path() -> Path:
    """`quarantined-pairs.jsonl` in the data directory (`CANARYD_DATA_DIR`)."""
    return paths.data_dir() / QUARANTINE_FILE


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
