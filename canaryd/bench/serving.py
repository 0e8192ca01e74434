"""Serving figures of one arm at one bench level, in `vllm bench serve`'s terms.

`serving_figures` turns an arm's in-memory results of one level (their arrivals are
still there, so ITL is pooled over every token gap, not rebuilt from stored summaries)
into what `canaryd bench --json` reports per arm: `ttft`, `tpot`, `itl` (per token, zeros
inside a burst), `itl_chunk` (one gap per streamed chunk: what `vllm bench serve` calls
ITL), `e2e` P50/P95/P99 and means in milliseconds, the fallback rate, goodput against
the `--slo` limits, request and output throughput, and resource-seconds per output
token and per useful token (tokens of pairs that passed the quality checks).
`VLLM_KEYS` maps these figures to `vllm bench serve`'s result keys. `poisson_arrivals`
draws the send times of an open-loop level as `vllm bench serve` does (gamma gaps,
shape `burstiness`, mean 1 / rate).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.timing import percentile
from engine.types import GenerationResult

__all__ = ["SLO_METRICS", "VLLM_KEYS", "Slo", "parse_slo", "poisson_arrivals", "serving_figures"]

SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
_QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
# canaryd figure -> `vllm bench serve --save-result` key (milliseconds, throughput per s)
VLLM_KEYS: Mapping[str, str] = {
    "ttft.mean_ms": "mean_ttft_ms",
    "ttft.p50_ms": "median_ttft_ms",
    "ttft.p99_ms": "p99_ttft_ms",
    "tpot.mean_ms": "mean_tpot_ms",
    "tpot.p50_ms": "median_tpot_ms",
    "tpot.p99_ms": "p99_tpot_ms",
    "itl_chunk.mean_ms": "mean_itl_ms",
    "itl_chunk.p50_ms": "median_itl_ms",
    "itl_chunk.p99_ms": "p99_itl_ms",
    "e2e.mean_ms": "mean_e2el_ms",
    "e2e.p50_ms": "median_e2el_ms",
    "e2e.p99_ms": "p99_e2el_ms",
    "request_throughput": "request_throughput",
    "output_throughput": "output_throughput",
    "goodput": "request_goodput",
    "completed": "completed",
}


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request limits in seconds (`--slo ttft=0.5,itl=0.1,e2e=10`); a request meets
    them when each limit set holds (itl: the request's own P99 gap)."""

    limits: tuple[tuple[str, float], ...] = ()

    def met(self, result: GenerationResult) -> bool:
        values = {
            "ttft": result.ttft_s,
            "tpot": result.tpot_s,
            "itl": None if result.itl is None else result.itl.p99_s,
            "e2e": result.e2e_s,
        }
        for metric, limit in self.limits:
            value = values[metric]
            # A figure the request lacks (one token: no TPOT or ITL) cannot break a limit.
            if value is not None and value > limit:
                return False
        return result.ok

    def as_json(self) -> dict[str, float]:
        return dict(self.limits)


def parse_slo(text: str) -> Slo:
    """`ttft=0.5,itl=0.1` (seconds; `ms` suffix for milliseconds) → `Slo`; ValueError
    naming the bad part."""
    limits = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        metric, _, value = part.partition("=")
        metric = metric.strip()
        if metric not in SLO_METRICS:
            raise ValueError(f"{part!r}: the metric must be one of {', '.join(SLO_METRICS)}")
        try:
            seconds = float(value[:-2]) / 1000 if value.strip().endswith("ms") else float(value)
        except ValueError:
            raise ValueError(f"{part!r}: the limit must be a number of seconds") from None
        if seconds <= 0:
            raise ValueError(f"{part!r}: the limit must be > 0")
        limits.append((metric, seconds))
    return Slo(tuple(limits))


def poisson_arrivals(requests: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Send times (s after the level starts) of `requests` requests at `rate` per second:
    gamma-distributed gaps of shape `burstiness` (1: a Poisson process) and mean 1/rate,
    the first request at 0."""
    rng = random.Random(seed)  # noqa: S311  (arrival times, not security)
    times, at = [], 0.0
    for index in range(requests):
        if index:
            at += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        times.append(at)
    return times


def _ms(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        f"{name}_ms": None if (v := percentile(values, q)) is None else v * 1000
        for name, q in _QUANTILES
    }
    out["mean_ms"] = sum(values) / len(values) * 1000 if values else None
    return out


def serving_figures(
    results: Sequence[GenerationResult],
    wall_s: float,
    *,
    slo: Slo,
    resource_s: float | None,
    resource_unit: str,
    useful_tokens: int,
) -> dict[str, Any]:
    """One arm's figures at one level (see the module docstring); `useful_tokens` are
    its output tokens in pairs that passed the quality checks."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    token_gaps = [g for r in ok if r.itl is not None for g in r.itl.token_gaps()]
    chunk_gaps = [g for r in ok if r.itl is not None for g in r.itl.chunk_gaps()]
    steps = [s for r in ok if (s := r.speculative) is not None and s.fallback_rate is not None]
    verify_steps = sum(s.verify_steps for s in steps)
    kept = sum(s.accepted_per_position[0] for s in steps)
    good = sum(slo.met(r) for r in results)
    return {
        "requests": len(results),
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "wall_s": wall_s,
        "output_tokens": tokens,
        "ttft": _ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot": _ms([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl": _ms(token_gaps),
        "itl_chunk": _ms(chunk_gaps),
        "e2e": _ms([r.e2e_s for r in ok]),
        "fallback_rate": (verify_steps - kept) / verify_steps if verify_steps else None,
        "goodput": good / wall_s if wall_s > 0 else None,
        "goodput_requests": good,
        "request_throughput": len(ok) / wall_s if wall_s > 0 else None,
        "output_throughput": tokens / wall_s if wall_s > 0 else None,
        "resource_unit": resource_unit,
        "resource_s": resource_s,
        "cost_per_token": resource_s / tokens if resource_s is not None and tokens else None,
        "useful_tokens": useful_tokens,
        "cost_per_useful_token": resource_s / useful_tokens
        if resource_s is not None and useful_tokens
        else None,
    }


def vllm_view(figures: Mapping[str, Any]) -> dict[str, Any]:
    """`figures` under `vllm bench serve`'s result keys (`VLLM_KEYS`)."""
    out: dict[str, Any] = {}
    for ours, theirs in VLLM_KEYS.items():
        group, _, key = ours.partition(".")
        value = figures.get(group)
        out[theirs] = value.get(key) if isinstance(value, Mapping) and key else value
    return out
