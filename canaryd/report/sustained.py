"""Sustained figures: what a history report (`canaryd report --since`) says of the daemon's
long run, apart from its cold starts.

A bench measures minutes; the daemon's history covers hours and days. `sustained_figures`
splits the pairs of a span into the cold ones — the first `COLD_PAIRS` pairs of each run
that started inside the span (a daemon start, as the bench's warm-up requests are the
first after its start) — and the rest, the sustained ones. Each part gets, per arm, the
serving figures the bench reports (TTFT, ITL P99 per request, TPOT and e2e at P50/P95/P99,
output tokens per second per request, errors) and, for the speculative arm, the fallback
rate and acceptance length; the sustained pairs are also cut into equal slices of time
(`slice_length`: an hour, six hours, a day or a week, the shortest that gives at most
`MAX_SLICES`), each with its pairs, speedup, speculative e2e and ITL P99 medians, fallback
rate and acceptance length, so a reader sees whether the figures held over the span.
`steadiness` names the spread of the slice medians. Pure: pairs and run starts in,
figures out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from canaryd.report.figures import Percentiles, latency_value, percentiles
from canaryd.report.tables import ReportTable, fmt, pct
from engine.types import GenerationResult
from gates.records import ARMS, Arm, PairRecord
from gates.stats.descriptive import mean, quantile, rate

__all__ = [
    "COLD_PAIRS",
    "MAX_SLICES",
    "SustainedFigures",
    "slice_length",
    "sustained_figures",
    "sustained_tables",
]

COLD_PAIRS = 2  # as the bench's default warm-up: requests per arm after a start
MAX_SLICES = 48
SLICE_LENGTHS = (timedelta(hours=1), timedelta(hours=6), timedelta(days=1), timedelta(weeks=1))
MIN_SLICE_PAIRS = 10  # a slice with fewer is listed but left out of the steadiness spread


@dataclass(frozen=True, slots=True)
class ArmServing:
    """One arm over a set of pairs, in the bench's serving terms (seconds)."""

    requests: int
    ok: int
    ttft_s: Percentiles
    itl_p99_s: Percentiles  # over requests, each request's own P99 gap
    tpot_s: Percentiles
    e2e_s: Percentiles
    tokens_per_s_p50: float | None  # per request: output tokens / e2e, median

    @property
    def error_rate(self) -> float | None:
        return rate(self.requests - self.ok, self.requests)


@dataclass(frozen=True, slots=True)
class PartFigures:
    """The cold or the sustained pairs: both arms, the speculative arm's fallback rate
    (pooled over verify steps) and mean acceptance length."""

    pairs: int
    baseline: ArmServing
    speculative: ArmServing
    fallback_rate: float | None
    acceptance_length_mean: float | None

    def arm(self, arm: Arm) -> ArmServing:
        return self.baseline if arm == "baseline" else self.speculative


@dataclass(frozen=True, slots=True)
class SliceFigures:
    """The sustained pairs started in [start, start + length)."""

    start: datetime
    pairs: int
    speedup_p50: float | None
    speculative_e2e_p50_s: float | None
    speculative_itl_p99_s: float | None  # median over requests of each one's P99 gap
    fallback_rate: float | None
    acceptance_length_mean: float | None
    errors: int  # failed generations, both arms


@dataclass(frozen=True, slots=True)
class SustainedFigures:
    cold_pairs_per_run: int
    cold: PartFigures
    sustained: PartFigures
    slice_length: timedelta
    slices: tuple[SliceFigures, ...]

    def steadiness(self) -> str:
        """The spread of the slice medians over slices of at least `MIN_SLICE_PAIRS`."""
        full = [s for s in self.slices if s.pairs >= MIN_SLICE_PAIRS]
        speedups = [s.speedup_p50 for s in full if s.speedup_p50 is not None]
        itl = [s.speculative_itl_p99_s for s in full if s.speculative_itl_p99_s is not None]
        if len(speedups) < 2:
            return f"fewer than two slices of {MIN_SLICE_PAIRS} pairs: no spread over time"
        line = (
            f"over {len(full)} slices of {_length(self.slice_length)}: speedup median "
            f"{min(speedups):.2f}× to {max(speedups):.2f}×"
        )
        if len(itl) >= 2:
            line += f", speculative ITL P99 {min(itl) * 1000:.1f} to {max(itl) * 1000:.1f} ms"
        return line


def _arm_serving(results: Sequence[GenerationResult]) -> ArmServing:
    ok = [r for r in results if r.ok]
    return ArmServing(
        requests=len(results),
        ok=len(ok),
        ttft_s=percentiles(r.ttft_s for r in ok),
        itl_p99_s=percentiles(latency_value(r, "itl_p99_s") for r in ok),
        tpot_s=percentiles(r.tpot_s for r in ok),
        e2e_s=percentiles(r.e2e_s for r in ok),
        tokens_per_s_p50=quantile(
            [r.output_tokens / r.e2e_s for r in ok if r.e2e_s > 0 and r.output_tokens], 0.5
        ),
    )


def _fallback_rate(pairs: Sequence[PairRecord]) -> float | None:
    stats = [
        s
        for p in pairs
        if p.speculative.ok and (s := p.speculative.speculative) is not None
        if s.fallback_rate is not None
    ]
    steps = sum(s.verify_steps for s in stats)
    return rate(steps - sum(s.accepted_per_position[0] for s in stats), steps)


def _acceptance_mean(pairs: Sequence[PairRecord]) -> float | None:
    return mean(
        [
            x
            for p in pairs
            if p.speculative.ok and (x := p.speculative.acceptance_length) is not None
        ]
    )


def _part(pairs: Sequence[PairRecord]) -> PartFigures:
    return PartFigures(
        pairs=len(pairs),
        baseline=_arm_serving([p.baseline for p in pairs]),
        speculative=_arm_serving([p.speculative for p in pairs]),
        fallback_rate=_fallback_rate(pairs),
        acceptance_length_mean=_acceptance_mean(pairs),
    )


def slice_length(since: datetime, until: datetime) -> timedelta:
    """The shortest of an hour, six hours, a day and a week that cuts the span into at
    most `MAX_SLICES` slices."""
    span = until - since
    for length in SLICE_LENGTHS:
        if span <= length * MAX_SLICES:
            return length
    return SLICE_LENGTHS[-1]


def _slice(start: datetime, pairs: Sequence[PairRecord]) -> SliceFigures:
    ok = [p.speculative for p in pairs if p.speculative.ok]
    return SliceFigures(
        start=start,
        pairs=len(pairs),
        speedup_p50=quantile([s for p in pairs if (s := p.speedup) is not None], 0.5),
        speculative_e2e_p50_s=quantile([r.e2e_s for r in ok], 0.5),
        speculative_itl_p99_s=quantile([r.itl.p99_s for r in ok if r.itl is not None], 0.5),
        fallback_rate=_fallback_rate(pairs),
        acceptance_length_mean=_acceptance_mean(pairs),
        errors=sum(not p.baseline.ok for p in pairs) + sum(not p.speculative.ok for p in pairs),
    )


def sustained_figures(
    pairs: Sequence[PairRecord],
    run_starts: Mapping[str, datetime],
    since: datetime,
    until: datetime,
    *,
    cold_pairs: int = COLD_PAIRS,
) -> SustainedFigures:
    """The figures of `pairs` (started in [since, until)); `run_starts` gives each run's
    start, so the first `cold_pairs` pairs of a run that started in the span are cold."""
    ordered = sorted(pairs, key=lambda p: (p.started_at, p.pair_id))
    seen: dict[str, int] = {}
    cold: list[PairRecord] = []
    warm: list[PairRecord] = []
    for pair in ordered:
        started = run_starts.get(pair.run_id)
        index = seen.get(pair.run_id, 0)
        seen[pair.run_id] = index + 1
        fresh = started is not None and since <= started < until
        (cold if fresh and index < cold_pairs else warm).append(pair)
    length = slice_length(since, until)
    slices: dict[int, list[PairRecord]] = {}
    for pair in warm:
        slices.setdefault(int((pair.started_at - since) / length), []).append(pair)
    return SustainedFigures(
        cold_pairs_per_run=cold_pairs,
        cold=_part(cold),
        sustained=_part(warm),
        slice_length=length,
        slices=tuple(_slice(since + i * length, slices[i]) for i in sorted(slices)),
    )


def _length(length: timedelta) -> str:
    hours = length.total_seconds() / 3600
    return f"{hours:g} h" if hours < 24 else f"{hours / 24:g} d"


def _ms(p: Percentiles) -> str:
    return "/".join(fmt(None if v is None else v * 1000, ".1f") for v in (p.p50, p.p95, p.p99))


def sustained_tables(figures: SustainedFigures) -> list[ReportTable]:
    """The per-arm table (cold and sustained rows) and the table over time."""
    rows = []
    for name, part in (("cold", figures.cold), ("sustained", figures.sustained)):
        for arm in ARMS:
            f = part.arm(arm)
            spec = arm == "speculative"
            rows.append(
                (
                    name,
                    arm,
                    str(f.requests),
                    pct(f.error_rate),
                    _ms(f.ttft_s),
                    _ms(f.itl_p99_s),
                    _ms(f.tpot_s),
                    _ms(f.e2e_s),
                    fmt(f.tokens_per_s_p50, ".1f"),
                    pct(part.fallback_rate) if spec else "",
                    fmt(part.acceptance_length_mean, ".2f") if spec else "",
                )
            )
    per_arm = ReportTable(
        title="Cold and sustained figures per arm (ms: p50/p95/p99)",
        columns=(
            "part",
            "arm",
            "requests",
            "errors",
            "TTFT",
            "ITL P99/request",
            "TPOT",
            "e2e",
            "tok/s/request p50",
            "fallback",
            "accept len",
        ),
        rows=tuple(rows),
        note=f"cold: the first {figures.cold_pairs_per_run} pairs of each daemon start in "
        "the span (as the bench's warm-up); sustained: every other pair. fallback: verify "
        "steps that kept no draft token ÷ verify steps.",
    )
    over_time = ReportTable(
        title=f"Sustained figures over time (slices of {_length(figures.slice_length)})",
        columns=(
            "slice start",
            "pairs",
            "speedup p50",
            "spec e2e p50 s",
            "spec ITL P99 ms",
            "fallback",
            "accept len",
            "errors",
        ),
        rows=tuple(
            (
                s.start.isoformat(timespec="minutes"),
                str(s.pairs),
                fmt(s.speedup_p50, ".2f", "×"),
                fmt(s.speculative_e2e_p50_s, ".3f"),
                fmt(
                    None if s.speculative_itl_p99_s is None else s.speculative_itl_p99_s * 1000,
                    ".1f",
                ),
                pct(s.fallback_rate),
                fmt(s.acceptance_length_mean, ".2f"),
                str(s.errors),
            )
            for s in figures.slices
        ),
        note=figures.steadiness(),
    )
    return [per_arm, over_time]
