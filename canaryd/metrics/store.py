"""The store series: how writing pairs to the database is going.

`StoreMetrics` owns failed store operations (by a capped error kind), pairs the database
refused and sent to the quarantine file, pairs stored after their text was made
storable, and the pairs buffered in memory while the database is unreachable.
"""

from __future__ import annotations

from canaryd.metrics.declare import Declarer
from canaryd.metrics.labels import BoundedLabel


class StoreMetrics:
    """Store errors, quarantined and sanitised pairs, and the in-memory buffer."""

    def __init__(self, declare: Declarer) -> None:
        self._error_kind = BoundedLabel(16)
        self.errors = declare.counter(
            "canaryd_store_errors_total",
            "Failed store operations, by kind (as the store names them, capped).",
            ("kind",),
            "sum by (kind) (increase(canaryd_store_errors_total[15m]))",
        )
        self.pairs_quarantined = declare.counter(
            "canaryd_pairs_quarantined_total",
            "Pairs the database refused for their content (a number out of range, a value "
            "it cannot store), written to the quarantine file instead of the database.",
            (),
            "increase(canaryd_pairs_quarantined_total[1h]) > 0",
        )
        self.pairs_sanitised = declare.counter(
            "canaryd_pairs_sanitised_total",
            "Pairs stored after their text was made storable (NUL characters replaced by U+FFFD).",
            (),
            "increase(canaryd_pairs_sanitised_total[1h])",
        )
        self.pending = declare.gauge(
            "canaryd_store_pending_pairs",
            "Pairs held in memory because the database is unreachable.",
            (),
            "canaryd_store_pending_pairs > 0",
        )

    def error(self, kind: str) -> None:
        """A store operation failed; `kind` is a short lower-case identifier."""
        self.errors.labels(kind=self._error_kind(kind)).inc()

    def pair_quarantined(self) -> None:
        """A pair went to the quarantine file instead of the database."""
        self.pairs_quarantined.inc()

    def pair_sanitised(self) -> None:
        """A pair was stored with its text made storable."""
        self.pairs_sanitised.inc()

    def pending_pairs(self, n: int) -> None:
        """`n` pairs are buffered in memory, waiting for the database."""
        self.pending.set(n)
