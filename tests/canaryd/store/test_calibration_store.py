"""The calibrated tie margins in SQL (canaryd.store.calibration_sql), on SQLite and
PostgreSQL: a margin round-trips field for field under its arms key, another key reads
nothing, a new calibration replaces the old one, and what cannot be a margin is refused."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from canaryd.store import SqlStore, TieMargin

T0 = datetime(2026, 3, 2, 10, 30, tzinfo=UTC)
MARGIN = TieMargin(
    arms="key-a",
    arm="speculative",
    margin=0.21875,
    divergences=240,
    aa=12,
    ab=228,
    unmeasured=3,
    pairs=400,
    coverage=0.975,
    confidence=0.95,
    calibrated_at=T0,
    aa_arm="baseline",
    aa_divergent_pairs=150,
    engines="0123456789abcdef",
)


class TestTieMargins:
    def test_round_trip(self, store: SqlStore) -> None:
        assert store.tie_margin("key-a") is None
        store.save_tie_margin(MARGIN)
        assert store.tie_margin("key-a") == MARGIN

    def test_a_row_without_the_aa_fields_round_trips_as_none(self, store: SqlStore) -> None:
        """Rows from before the bound came from A/A pairs alone have no A/A arm, pair
        count or engines (migration 0021 leaves them NULL): read back as None."""
        old = replace(MARGIN, aa_arm=None, aa_divergent_pairs=None, engines=None)
        store.save_tie_margin(old)
        assert store.tie_margin("key-a") == old

    def test_another_arms_key_reads_nothing(self, store: SqlStore) -> None:
        """A margin measured under other arms is never this configuration's."""
        store.save_tie_margin(MARGIN)
        assert store.tie_margin("key-b") is None

    def test_a_new_calibration_replaces_the_old(self, store: SqlStore) -> None:
        store.save_tie_margin(MARGIN)
        other = replace(MARGIN, arms="key-b", margin=0.4)
        store.save_tie_margin(other)
        newer = replace(MARGIN, margin=0.15, divergences=500, calibrated_at=T0 + timedelta(1))
        store.save_tie_margin(newer)
        assert store.tie_margin("key-a") == newer
        assert store.tie_margin("key-b") == other

    def test_naive_times_and_negative_margins_are_refused(self, store: SqlStore) -> None:
        with pytest.raises(ValueError, match="naive"):
            store.save_tie_margin(replace(MARGIN, calibrated_at=T0.replace(tzinfo=None)))
        with pytest.raises(ValueError, match="non-negative"):
            store.save_tie_margin(replace(MARGIN, margin=-0.1))
        with pytest.raises(ValueError, match="non-negative"):
            store.save_tie_margin(replace(MARGIN, margin=float("nan")))
        assert store.tie_margin("key-a") is None
