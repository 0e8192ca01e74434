"""canaryd.report.summary: per-category figures of pair records, with figures an engine did not
report left out of their pools rather than counted as zeros."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from canaryd.report import ALL, summarise
from engine.timing import inter_token_latency
from engine.types import AcceptanceSource, GenerationResult, Message, SpeculativeStats
from gates.pairs.testing import record
from gates.records import PairRecord, Prompt


def pair(n: int, stats: SpeculativeStats | None) -> PairRecord:
    ok = GenerationResult(
        text="a b c d e f", token_ids=(1, 2, 3, 4, 5, 6), finish_reason="length",
        prompt_tokens=3, output_tokens=6, ttft_s=0.1, tpot_s=0.1, e2e_s=0.6,
    )  # fmt: skip
    return record(
        n,
        baseline=ok,
        speculative=replace(ok, speculative=stats),
        scored=False,
        prompt=Prompt(id=f"q{n}", category="qa", messages=(Message("user", "x"),), max_tokens=6),
        run_id="r",
        started_at=datetime(2026, 1, 1, 0, n, tzinfo=UTC),
    )


def stats(verify_steps: int, draft_tokens: int | None, accepted_tokens: int) -> SpeculativeStats:
    return SpeculativeStats(
        verify_steps=verify_steps,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted_tokens,
        accepted_per_position=(),
        source=AcceptanceSource.WINDOW_AGGREGATE,
    )


class TestAcceptanceRate:
    def test_pools_only_pairs_that_report_drafted_tokens(self) -> None:
        """Accepted ÷ drafted is pooled over the pairs with a drafted count: a pair
        without one adds neither its accepted tokens nor a zero drafted count."""
        records = [
            pair(0, stats(verify_steps=2, draft_tokens=8, accepted_tokens=4)),
            pair(1, stats(verify_steps=3, draft_tokens=12, accepted_tokens=3)),
            pair(2, stats(verify_steps=1, draft_tokens=None, accepted_tokens=5)),
            pair(3, None),  # acceptance not reported at all
        ]
        summary = summarise(records)
        # (4 + 3) / (8 + 12) = 7 / 20; counting pair 2 would give 12 / 20.
        assert summary["qa"].acceptance_rate == pytest.approx(0.35)
        assert summary[ALL].acceptance_rate == pytest.approx(0.35)
        # The acceptance length still uses every pair that reports steps: 6/2, 6/3, 6/1.
        assert summary["qa"].acceptance_length_mean == pytest.approx((3 + 2 + 6) / 3)

    def test_no_drafted_counts_is_not_reported(self) -> None:
        """When no pair reports drafted tokens the rate is None, not 0."""
        records = [
            pair(i, stats(verify_steps=2, draft_tokens=None, accepted_tokens=4)) for i in range(3)
        ]
        assert summarise(records)["qa"].acceptance_rate is None


class TestFallbackAndItl:
    def test_fallback_rate_pools_steps_of_pairs_with_positions(self) -> None:
        """Steps that kept no draft token over all steps, pooled over the pairs that
        report acceptance per position: (2 + 1) fallbacks of (4 + 2) steps."""
        with_positions = [
            replace(stats(4, 12, 3), accepted_per_position=(2, 1, 0)),
            replace(stats(2, 6, 1), accepted_per_position=(1, 0, 0)),
        ]
        records = [pair(i, s) for i, s in enumerate(with_positions)]
        records.append(pair(2, stats(5, 15, 5)))  # no positions: not counted
        assert summarise(records)["qa"].fallback_rate == pytest.approx(3 / 6)

    def test_itl_p99_is_the_median_of_the_generations_p99(self) -> None:
        """Each arm's ITL P99 is the median over its successful generations of their own
        P99 gap; generations without one are left out, and none at all is None."""
        records = [pair(i, None) for i in range(3)]
        assert summarise(records)["qa"].speculative_itl_p99_s is None
        gaps = [0.1, 0.3, 0.2]
        records = [
            replace(r, speculative=replace(r.speculative, itl=inter_token_latency(
                [(0.1, 1), (0.1 + g, 1), (0.2 + g, 1)]
            )))
            for r, g in zip(records, gaps, strict=True)
        ]  # fmt: skip
        summary = summarise(records)["qa"]
        assert summary.speculative_itl_p99_s == pytest.approx(0.2, abs=0.01)
        assert summary.baseline_itl_p99_s is None
