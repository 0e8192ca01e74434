"""`HistoryStore.serving`: the bounded read of recent generations' ITL and fallback counts,
on every backend (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from canaryd.store import SqlStore
from canaryd.store.serving import ServingFacts
from gates.records import PairRecord
from tests.canaryd.store.conftest import T0

PairFactory = Callable[..., PairRecord]


class TestServingQuery:
    def test_rows_carry_the_stored_itl_summary_and_kept_steps(
        self, store: SqlStore, pair: PairFactory
    ) -> None:
        """Each generation of a pair in the window is one row: the speculative one with its
        ITL quantiles, its verify steps and the steps that kept a draft token (the first
        entry of acceptance per position); the baseline, which reported no acceptance, with
        none."""
        record = pair(started_at=T0)
        store.save_pair(record)
        rows = store.serving(T0, T0 + timedelta(seconds=1))
        by_role = {row.role: row for row in rows}
        assert set(by_role) == {"baseline", "speculative"}
        itl = record.speculative.itl
        assert itl is not None
        assert by_role["speculative"] == ServingFacts(
            started_at=T0,
            arm="speculative",
            role="speculative",
            ok=True,
            itl_p50_s=itl.p50_s,
            itl_p95_s=itl.p95_s,
            itl_p99_s=itl.p99_s,
            verify_steps=2,
            kept_steps=1,
        )
        baseline = by_role["baseline"]
        assert baseline.itl_p99_s is None and baseline.kept_steps is None

    def test_window_is_half_open_and_the_limit_keeps_the_newest(
        self, store: SqlStore, pair: PairFactory
    ) -> None:
        """Pairs outside [since, until) are not read; with a limit, the newest rows are."""
        for minute in range(4):
            store.save_pair(pair(started_at=T0 + timedelta(minutes=minute)))
        window = store.serving(T0 + timedelta(minutes=1), T0 + timedelta(minutes=3))
        assert sorted({row.started_at for row in window}) == [
            T0 + timedelta(minutes=1),
            T0 + timedelta(minutes=2),
        ]
        newest = store.serving(T0, T0 + timedelta(hours=1), limit=3)
        assert [row.started_at for row in newest] == [
            T0 + timedelta(minutes=3),
            T0 + timedelta(minutes=3),
            T0 + timedelta(minutes=2),
        ]

    def test_a_failed_generation_is_not_ok(self, store: SqlStore, failed: PairFactory) -> None:
        """A failed speculative generation is read back as not ok, with no figures."""
        store.save_pair(failed(started_at=T0))
        rows = {r.role: r for r in store.serving(T0, T0 + timedelta(seconds=1))}
        assert not rows["speculative"].ok
        assert rows["speculative"].itl_p99_s is None and rows["speculative"].verify_steps is None
