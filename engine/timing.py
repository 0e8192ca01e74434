"""Token delivery timing: from the arrivals of a generation's output to its ITL summary.

Every engine stamps each delivery of output tokens — a streamed chunk with the tokens it
carried, a verify step with the tokens it emitted — as (seconds since the request
started, tokens). `inter_token_latency` turns those arrivals into the per-token gaps'
`InterTokenLatency` summary; `percentile` is the interpolation it and the bench use
(numpy's default "linear", which `vllm bench serve` reports with), so figures agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.types import InterTokenLatency

__all__ = ["ArrivalClock", "inter_token_latency", "percentile"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0 ≤ q ≤ 1) of `values`, linearly interpolated between order
    statistics; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def inter_token_latency(arrivals: Sequence[tuple[float, int]]) -> InterTokenLatency | None:
    """The summary of `arrivals` ((seconds since start, tokens) per delivery, in order);
    None when they hold fewer than two tokens (no gap to measure). Deliveries of no
    tokens are dropped."""
    kept = tuple((float(at), int(tokens)) for at, tokens in arrivals if tokens > 0)
    summary = InterTokenLatency(
        tokens=0, chunks=0, p50_s=0.0, p95_s=0.0, p99_s=0.0, max_s=0.0, arrivals=kept
    )
    gaps = summary.token_gaps()
    if not gaps:
        return None
    p50, p95, p99 = (percentile(gaps, q) for q in (0.5, 0.95, 0.99))
    assert p50 is not None and p95 is not None and p99 is not None
    return InterTokenLatency(
        tokens=len(gaps),
        chunks=len(kept) - 1,
        p50_s=p50,
        p95_s=p95,
        p99_s=p99,
        max_s=max(gaps),
        arrivals=kept,
    )


class ArrivalClock:
    """Collects a generation's deliveries against its start time."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.arrivals: list[tuple[float, int]] = []

    def delivered(self, at: float, tokens: int) -> None:
        if tokens > 0:
            self.arrivals.append((at - self.started, tokens))

    def summary(self) -> InterTokenLatency | None:
        return inter_token_latency(self.arrivals)
