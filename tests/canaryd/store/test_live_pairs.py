"""Live pairs in the store (SQLite and PostgreSQL): the source round-trips, a live pair
made storable keeps no text, and text kept by traffic.store_text is erased once old."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from canaryd.store import SqlStore
from canaryd.traffic.live import LIVE_SUITE, stored_record
from tests.canaryd.store.conftest import T0


def live(pair: Any, prompt: Any, **changes: Any) -> Any:
    return pair(
        source="live",
        prompt=prompt(id="a" * 64, suite=LIVE_SUITE, reference=None, check=None),
        **changes,
    )


class TestLivePairs:
    def test_source_round_trips(self, store: SqlStore, pair: Any, prompt: Any) -> None:
        """A control pair reads back as control, a live one as live."""
        store.save_pair(pair())
        store.save_pair(live(pair, prompt))
        assert sorted(record.source for record in store.pairs()) == ["control", "live"]

    def test_a_storable_live_pair_keeps_figures_not_text(
        self, store: SqlStore, pair: Any, prompt: Any
    ) -> None:
        """Stored without text: no messages, outputs, token ids; counts, timings,
        acceptance and scores as measured."""
        measured = live(pair, prompt)
        store.save_pair(stored_record(measured, store_text=False))
        (back,) = store.pairs()
        assert back.prompt.messages == ()
        assert back.prompt.id == "a" * 64
        for arm in ("baseline", "speculative"):
            result, original = getattr(back, arm), getattr(measured, arm)
            assert (result.text, result.token_ids) == ("", ())
            assert result.output_tokens == original.output_tokens
            assert result.e2e_s == original.e2e_s
        assert back.speculative.speculative == measured.speculative.speculative
        assert back.scores == measured.scores

    def test_old_live_text_is_erased_and_the_rest_kept(
        self, store: SqlStore, pair: Any, prompt: Any
    ) -> None:
        """erase_live_text empties old live pairs' outputs and prompts; a newer live pair
        and every control pair keep theirs."""
        store.save_pair(live(pair, prompt, started_at=T0))
        newer_prompt = prompt(id="b" * 64, suite=LIVE_SUITE, reference=None, check=None)
        store.save_pair(pair(source="live", prompt=newer_prompt, started_at=T0 + timedelta(days=8)))
        store.save_pair(pair(started_at=T0))
        assert store.erase_live_text(T0 + timedelta(days=1)) == 2
        by_id = {record.prompt.id: record for record in store.pairs()}
        old, new, control = by_id["a" * 64], by_id["b" * 64], by_id["sum-001"]
        assert (old.baseline.text, old.speculative.token_ids, old.prompt.messages) == ("", (), ())
        assert old.speculative.output_tokens > 0
        assert new.baseline.text and new.prompt.messages
        assert control.baseline.text and control.prompt.messages
        assert store.erase_live_text(T0 + timedelta(days=1)) == 0
