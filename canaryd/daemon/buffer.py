"""Where the daemon's pairs go: `PairWriter` saves each one to the history store and,
while the database is away, holds it in `PendingPairs` (bounded, oldest first, dropping
and counting the oldest when full) until the database answers again. No pair is dropped
without a log line and a metric: text the database cannot hold (NUL) is made storable
first, and a pair the database still refuses goes to the `Quarantine` file instead of
stopping the cycle (or, buffered, blocking every pair behind it)."""

from __future__ import annotations

import threading
import traceback
from collections import deque

import structlog

from canaryd.daemon.quarantine import Quarantine, default_quarantine_path
from canaryd.errors import DatabaseError, RecordRejectedError
from canaryd.metrics.store import StoreMetrics
from canaryd.store import HistoryStore
from canaryd.store.text import storable
from gates.records import PairRecord

__all__ = ["PairWriter", "PendingPairs"]

log = structlog.get_logger(__name__)


class PendingPairs:
    """Pairs waiting for the database, oldest first, at most `capacity`; when full, adding
    one drops the oldest, which is counted in `dropped`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pairs: deque[PairRecord] = deque()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._pairs)

    def add(self, record: PairRecord) -> PairRecord | None:
        """Queue `record`; return the pair dropped to make room, if any."""
        dropped = None
        if len(self._pairs) >= self.capacity:
            dropped = self._pairs.popleft()
            self.dropped += 1
        self._pairs.append(record)
        return dropped

    def oldest(self) -> PairRecord:
        return self._pairs[0]

    def remove_oldest(self) -> None:
        self._pairs.popleft()

    def resize(self, capacity: int) -> list[PairRecord]:
        """Change the capacity; return the oldest pairs dropped to fit it."""
        self.capacity = capacity
        dropped = []
        while len(self._pairs) > capacity:
            dropped.append(self._pairs.popleft())
            self.dropped += 1
        return dropped


class PairWriter:
    """Saves the daemon's pairs; while the database is away, holds them in `pending` and
    saves them, oldest first, once it answers again.

    `lock` is the one turn-taking point for writes: saves, the flush, a buffer resize,
    the store's close, and the daemon's run rows all go under it. A pair the store
    refuses for its content (`RecordRejectedError`), or fails on with anything but a
    `DatabaseError` (tried twice), goes to `quarantine` (default: the data directory's
    `quarantined-pairs.jsonl`).
    """

    def __init__(
        self, capacity: int, metrics: StoreMetrics, quarantine: Quarantine | None = None
    ) -> None:
        self.pending = PendingPairs(capacity)
        self.metrics = metrics
        self.quarantine = quarantine or Quarantine(default_quarantine_path())
        self.lock = threading.Lock()
        self.abandoned = False  # True when shutdown left a pair generating (dropped whole)
        self.problem: str | None = None  # the last save's DatabaseError, until one works
        self._store: HistoryStore | None = None
        self._closed = False

    def open(self, store: HistoryStore) -> None:
        self._store = store
        self._closed = False

    def close(self) -> None:
        """Take no more saves: the store is about to close. Without the lock after an
        abandon: a save stuck on a frozen database holds it, and shutdown keeps its bound."""
        if self.abandoned:
            self._closed = True
            return
        with self.lock:
            self._closed = True

    def abandon(self) -> None:
        """Drop, from now on, every pair that finishes: shutdown left one generating (or
        saving, on a database that no longer answers). Never waits for the lock: setting
        the flag is atomic, and every save checks it under the lock before it starts."""
        self.abandoned = True

    @property
    def store(self) -> HistoryStore:
        if self._store is None:
            raise RuntimeError("the daemon is not started")
        return self._store

    def save(self, record: PairRecord) -> bool:
        """Store one pair; on `DatabaseError` buffer it, and quarantine it when the
        database refuses it. False when it was buffered."""
        with self.lock:
            if self._closed or self.abandoned:
                log.warning("pair.dropped", pair_id=record.pair_id, reason="shutting down")
                return True
            record = self._storable(record)
            try:
                self.store.save_pair(record)
            except RecordRejectedError as exc:
                self._quarantine(record, exc)
                return True
            except DatabaseError as exc:
                self._failed(exc)
                self._buffer(record)
                return False
            except Exception as exc:
                return self._retry_or_quarantine(record, exc)
            self._back()
            return True

    def buffer(self, record: PairRecord) -> None:
        """Queue `record` behind the pairs already waiting, without trying the database."""
        with self.lock:  # a reload may resize the buffer meanwhile
            self._buffer(self._storable(record))

    def flush(self, *, final: bool = False) -> bool:
        """Save buffered pairs oldest first, stopping at the first failure; True when the
        buffer is empty afterwards."""
        with self.lock:
            if self._closed:
                return not self.pending
            saved = 0
            while self.pending:
                record = self.pending.oldest()
                try:
                    self.store.save_pair(record)
                except RecordRejectedError as exc:
                    # Left at the head, it would fail every flush and hold back the rest.
                    self.pending.remove_oldest()
                    self._quarantine(record, exc)
                    continue
                except DatabaseError as exc:
                    self._failed(exc)
                    break
                except Exception as exc:
                    self.pending.remove_oldest()
                    self._quarantine(record, exc)
                    continue
                self.pending.remove_oldest()
                saved += 1
            if saved:
                self._back()
                log.info("pending.flushed", saved=saved, still_pending=len(self.pending))
            self.metrics.pending_pairs(len(self.pending))
            if final and self.pending:
                log.error(
                    "pending.lost",
                    pairs=len(self.pending),
                    reason="the database is still unreachable at shutdown",
                )
            return not self.pending

    def resize(self, capacity: int) -> None:
        """Change the buffer's capacity; the oldest pairs that no longer fit are lost."""
        with self.lock:  # the cycle thread buffers under the same lock
            dropped = self.pending.resize(capacity)
        for record in dropped:
            self.metrics.error("pair_dropped")
            log.error("pair.lost", pair_id=record.pair_id, reason="buffer_pairs reduced")

    def _buffer(self, record: PairRecord) -> None:
        dropped = self.pending.add(record)
        if dropped is not None:
            self.metrics.error("pair_dropped")
            log.error(
                "pair.lost",
                pair_id=dropped.pair_id,
                reason=f"the database has been away for {self.pending.capacity} pairs; "
                "the oldest buffered pair is dropped",
                lost_total=self.pending.dropped,
            )
        self.metrics.pending_pairs(len(self.pending))

    def _storable(self, record: PairRecord) -> PairRecord:
        cleaned, changed = storable(record)
        if changed:
            self.metrics.pair_sanitised()
            log.warning(
                "pair.sanitised",
                pair_id=record.pair_id,
                reason="NUL characters in its text (which PostgreSQL cannot store) are "
                "stored as U+FFFD",
            )
        return cleaned

    def _retry_or_quarantine(self, record: PairRecord, exc: Exception) -> bool:
        """One more try after an unexpected error (a prompt pruned by retention between
        its lookup and the insert); quarantine the pair if that fails too."""
        log.warning("pair.save_retried", pair_id=record.pair_id, reason=_one_line(exc))
        try:
            self.store.save_pair(record)
        except DatabaseError as again:
            if isinstance(again, RecordRejectedError):
                self._quarantine(record, again)
                return True
            self._failed(again)
            self._buffer(record)
            return False
        except Exception as again:
            self._quarantine(record, again)
            return True
        self._back()
        return True

    def _quarantine(self, record: PairRecord, exc: Exception) -> None:
        reason = _one_line(exc)
        # The traceback goes to the file, not the log: SQLAlchemy's message carries the
        # statement's parameters, which hold the pair's text.
        detail = "" if isinstance(exc, RecordRejectedError) else _traceback(exc)
        try:
            self.quarantine.add(record, reason, detail)
        except OSError as error:
            self.metrics.error("pair_dropped")
            log.error(
                "pair.lost",
                pair_id=record.pair_id,
                reason=f"the database refused it ({reason}) and the quarantine file "
                f"{str(self.quarantine.path)!r} cannot be written: {error}",
            )
            return
        self.metrics.pair_quarantined()
        log.error(
            "pair.quarantined",
            pair_id=record.pair_id,
            reason=reason,
            file=str(self.quarantine.path),
        )

    def _failed(self, exc: DatabaseError) -> None:
        self.metrics.error("save_pair")
        if self.problem is None:
            log.error("database.unreachable", reason=str(exc), pending=len(self.pending))
        self.problem = str(exc)

    def _back(self) -> None:
        if self.problem is not None:
            log.info("database.reachable", pending=len(self.pending))
        self.problem = None


def _one_line(exc: Exception) -> str:
    """What went wrong, on one bounded line (SQLAlchemy appends the statement and its
    parameters, pair text included, on later lines)."""
    if isinstance(exc, RecordRejectedError):
        return str(exc)
    first = str(exc).strip().split("\n", 1)[0]
    return f"{type(exc).__name__}: {first}"[:500]


def _traceback(exc: Exception) -> str:
    return "".join(traceback.format_exception(exc))
