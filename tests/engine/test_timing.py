"""engine.timing and `InterTokenLatency`: a generation's deliveries become per-token gaps
(zeros inside a burst), summarised by linearly interpolated quantiles; the fallback rate
of `SpeculativeStats` counts the steps that kept none of their draft."""

from __future__ import annotations

import numpy as np
import pytest

from engine.timing import ArrivalClock, inter_token_latency, percentile
from engine.types import AcceptanceSource, SpeculativeStats


class TestPercentile:
    def test_matches_numpy_linear_interpolation(self) -> None:
        """The same quantiles `vllm bench serve` computes with numpy's default method."""
        values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.05, 0.4]
        for q in (0.0, 0.5, 0.95, 0.99, 1.0):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q * 100)))

    def test_no_values_no_quantile(self) -> None:
        """An empty sample has no quantile (None, not zero)."""
        assert percentile([], 0.5) is None


class TestInterTokenLatency:
    def test_one_token_a_chunk_gives_the_chunk_gaps(self) -> None:
        """Without bursts every token's gap is its chunk's gap."""
        itl = inter_token_latency([(0.1, 1), (0.2, 1), (0.4, 1), (0.5, 1)])
        assert itl is not None
        assert (itl.tokens, itl.chunks) == (3, 3)
        assert itl.token_gaps() == pytest.approx([0.1, 0.2, 0.1])
        assert itl.chunk_gaps() == pytest.approx([0.1, 0.2, 0.1])
        assert itl.p50_s == pytest.approx(0.1)
        assert itl.max_s == pytest.approx(0.2)

    def test_a_burst_gives_its_other_tokens_no_gap(self) -> None:
        """A verify step that emits four tokens after 0.3 s: one gap of 0.3 s and three of
        zero, so the median falls while the maximum keeps the stall."""
        itl = inter_token_latency([(0.1, 2), (0.4, 4), (0.5, 1)])
        assert itl is not None
        assert itl.token_gaps() == pytest.approx([0.0, 0.3, 0.0, 0.0, 0.0, 0.1])
        assert (itl.tokens, itl.chunks) == (6, 2)
        assert itl.p50_s == 0.0
        assert itl.max_s == pytest.approx(0.3)
        assert itl.p99_s == pytest.approx(float(np.percentile(itl.token_gaps(), 99)))

    def test_fewer_than_two_tokens_have_no_gap(self) -> None:
        """One token (or none) has no inter-token latency: None, not zero."""
        assert inter_token_latency([(0.1, 1)]) is None
        assert inter_token_latency([]) is None
        assert inter_token_latency([(0.1, 0), (0.2, 1)]) is None

    def test_the_clock_stamps_against_the_start(self) -> None:
        """Deliveries are kept as seconds since the request started; empty ones dropped."""
        clock = ArrivalClock(100.0)
        clock.delivered(100.5, 1)
        clock.delivered(100.6, 0)
        clock.delivered(100.75, 2)
        itl = clock.summary()
        assert itl is not None
        assert [at for at, _ in itl.arrivals] == pytest.approx([0.5, 0.75])
        assert [tokens for _, tokens in itl.arrivals] == [1, 2]

    def test_arrivals_do_not_take_part_in_equality(self) -> None:
        """A summary read back from the store (no arrivals) equals the one measured."""
        itl = inter_token_latency([(0.1, 1), (0.2, 1)])
        assert itl is not None
        stored = type(itl)(itl.tokens, itl.chunks, itl.p50_s, itl.p95_s, itl.p99_s, itl.max_s)
        assert stored == itl
        assert stored.token_gaps() == []


class TestFallbackRate:
    def _stats(self, steps: int, per_position: tuple[int, ...]) -> SpeculativeStats:
        return SpeculativeStats(
            verify_steps=steps,
            draft_tokens=3 * steps,
            accepted_tokens=sum(per_position),
            accepted_per_position=per_position,
            source=AcceptanceSource.DECODING_LOOP,
        )

    def test_steps_without_an_accepted_token_fall_back(self) -> None:
        """10 steps, 6 kept their first draft token: 40 % fell back."""
        assert self._stats(10, (6, 4, 1)).fallback_rate == pytest.approx(0.4)

    def test_not_reported_without_per_position_counts(self) -> None:
        """No per-position counts (or no steps): the rate is not reported."""
        assert self._stats(10, ()).fallback_rate is None
        assert self._stats(0, (0, 0, 0)).fallback_rate is None
