"""Synthetic production telemetry for tests and simulations of the telemetry gates: one
arm's scrape intervals as a serving engine's counters and histograms would give them.

`simulate_arm` draws, interval by interval, Poisson arrivals, per-request latencies
(end-to-end, time to first token, one inter-token latency per generated token, each
log-normal and scaled by the arm's `slowdown`), requests in flight by Little's law,
and speculative drafts with per-request acceptance (a truncated geometric run of
accepted draft tokens per verify step, each request with its own acceptance
probability), then bins the latencies into vLLM's buckets. Every figure comes from the
caller's seeded generator, so a test or a benchmark replays exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from gates.stats.histogram import BucketCounts
from gates.telemetry.intervals import ArmTelemetry, TelemetryInterval

T0 = datetime(2025, 1, 1, tzinfo=UTC)
INF = float("inf")
# vLLM's bucket bounds (seconds) for its three latency histograms.
E2E_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
              60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0, INF)  # fmt: skip
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, INF)  # fmt: skip
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
              7.5, 10.0, 20.0, 40.0, 80.0, INF)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ArmTraffic:
    """What one arm serves and how: `rps` requests per second over `replicas`, of about
    `tokens` output tokens each (log-normal, spread `tokens_spread`, at least 2);
    latencies log-normal around `ttft_s` and `itl_s` (spread `sigma`), × `slowdown`;
    with `draft_tokens` > 0, speculative verify steps of that many draft tokens, each
    accepted with a request's probability (mean `acceptance`, spread
    `acceptance_spread` between requests), each step taking `verify_step_cost` × a
    decode step and observed as one inter-token latency, as vLLM observes it.
    `interval_jitter` is a per-interval log-normal factor on every latency (batches
    that run slower together)."""

    rps: float = 5.0
    replicas: int = 1
    tokens: int = 100
    tokens_spread: float = 0.5
    ttft_s: float = 0.1
    itl_s: float = 0.02
    sigma: float = 0.3
    slowdown: float = 1.0
    interval_jitter: float = 0.05
    draft_tokens: int = 0
    verify_step_cost: float = 1.3
    acceptance: float = 0.7
    acceptance_spread: float = 0.1
    waiting_share: float = 0.1


def bucketed(values: np.ndarray, bounds: Sequence[float]) -> BucketCounts:
    """Cumulative bucket counts of `values` (an observation equal to a bound counts in it)."""
    edges = np.asarray(bounds, dtype=float)
    cumulative = np.searchsorted(np.sort(values), edges, side="right").astype(float)
    return BucketCounts(tuple(float(b) for b in bounds), tuple(float(c) for c in cumulative))


def simulate_interval(
    rng: np.random.Generator, traffic: ArmTraffic, start: datetime, seconds: float
) -> TelemetryInterval:
    """One scrape interval of the arm."""
    requests = int(rng.poisson(traffic.rps * seconds))
    scale = traffic.slowdown * float(np.exp(rng.normal(0.0, traffic.interval_jitter)))
    ttft = traffic.ttft_s * scale * np.exp(rng.normal(0.0, traffic.sigma, requests))
    tokens = np.maximum(
        2, np.round(traffic.tokens * np.exp(rng.normal(0.0, traffic.tokens_spread, requests)))
    ).astype(int)
    drafts = draft_tokens = accepted = None
    gaps, gap_s = tokens - 1, traffic.itl_s  # one inter-token observation per decode step
    if traffic.draft_tokens > 0:
        steps, drafts, draft_tokens, accepted = _speculation(rng, traffic, tokens)
        # A verify step streams its accepted tokens and one more at once: vLLM observes
        # one inter-token latency per step, the step's whole time.
        gaps, gap_s = np.maximum(steps - 1, 1), traffic.itl_s * traffic.verify_step_cost
    itl = gap_s * scale * np.exp(rng.normal(0.0, traffic.sigma, int(gaps.sum())))
    e2e = ttft.copy()
    if requests:
        starts = np.concatenate(([0], np.cumsum(gaps)[:-1]))
        e2e += np.add.reduceat(itl, starts)
    in_flight = traffic.rps * float(np.mean(e2e)) if requests else 0.0
    return TelemetryInterval(
        start=start,
        end=start + timedelta(seconds=seconds),
        requests=requests,
        errors=0,
        e2e=bucketed(e2e, E2E_BOUNDS),
        ttft=bucketed(ttft, TTFT_BOUNDS),
        itl=bucketed(itl, ITL_BOUNDS),
        running=in_flight * (1.0 - traffic.waiting_share),
        waiting=in_flight * traffic.waiting_share,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        replicas=traffic.replicas,
    )


def _speculation(
    rng: np.random.Generator, traffic: ArmTraffic, tokens: np.ndarray
) -> tuple[np.ndarray, int, int, int]:
    """Verify steps per request, and drafts, draft tokens and accepted tokens of
    requests of `tokens` tokens: each request's acceptance probability drawn around
    `acceptance`; a verify step accepts a run of draft tokens up to the first rejected
    one; steps until the request's tokens are out (each step yields its accepted tokens
    and one more)."""
    requests = len(tokens)
    if requests == 0:
        return np.zeros(0, dtype=int), 0, 0, 0
    k = traffic.draft_tokens
    spread = traffic.acceptance_spread
    alphas = np.clip(rng.normal(traffic.acceptance, spread, requests), 0.01, 0.99)
    expected = (1.0 - alphas ** (k + 1)) / (1.0 - alphas)  # tokens per verify step
    steps = np.maximum(1, np.ceil(tokens / expected)).astype(int)
    per_step = np.repeat(alphas, steps)
    accepted = np.minimum(rng.geometric(1.0 - per_step) - 1, k)
    drafts = int(steps.sum())
    return steps, drafts, drafts * k, int(accepted.sum())


def simulate_arm(
    rng: np.random.Generator,
    traffic: ArmTraffic | Sequence[ArmTraffic],
    *,
    intervals: int,
    seconds: float = 15.0,
    start: datetime = T0,
) -> ArmTelemetry:
    """`intervals` consecutive scrape intervals; a sequence of traffics gives each
    interval its own (a fault that starts part-way, load that changes)."""
    plan = [traffic] * intervals if isinstance(traffic, ArmTraffic) else list(traffic)
    return ArmTelemetry.of(
        simulate_interval(rng, plan[i], start + timedelta(seconds=i * seconds), seconds)
        for i in range(intervals)
    )


def end_of(index: int, seconds: float = 15.0, start: datetime = T0) -> datetime:
    """The end of interval number `index`."""
    return start + timedelta(seconds=(index + 1) * seconds)
