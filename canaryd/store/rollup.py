"""Per-hour, per-category, per-arm roll-ups of pairs, and the fixed-bucket histograms they carry.

Retention turns old raw pairs into `PairRollup`s: counts and sums that merge by addition,
plus histograms over fixed bucket bounds so that a quantile over many hours can still be
approximated after the raw rows are gone. Everything here is pure: `PairFacts` (the lean
figures of one pair that roll-ups and `canaryd status` need) come from a `PairRecord` or
from SQL rows, `rollup_of` and `merge_rollups` aggregate them, `histogram_quantile` reads
a quantile back. The bucket bounds are part of the stored schema: a histogram is a list
of counts per bucket, so changing a bounds tuple needs a migration that re-buckets (or
drops) the stored roll-ups.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime

from engine.types import ErrorKind, GenerationResult, acceptance_length_of
from gates.records import DEFAULT_ARM, PairRecord, e2e_speedup

__all__ = [
    "ACCEPTANCE_LENGTH_BOUNDS",
    "LATENCY_BOUNDS_S",
    "SPEEDUP_BOUNDS",
    "ArmFacts",
    "ArmRollup",
    "PairFacts",
    "PairRollup",
    "add_histograms",
    "bucket_index",
    "facts_from_record",
    "histogram",
    "histogram_quantile",
    "hour_start",
    "merge_rollups",
    "rollup_of",
    "rollups_by_hour",
]


def _log_spaced(low: float, high: float, count: int) -> tuple[float, ...]:
    ratio = (high / low) ** (1.0 / (count - 1))
    # Rounded so the stored meaning of a bucket does not depend on float noise.
    return tuple(float(f"{low * ratio**i:.6g}") for i in range(count))


# Upper bounds of the buckets; bucket 0 is [0, bounds[0]), bucket i is
# [bounds[i-1], bounds[i]), the last bucket is [bounds[-1], inf): len(bounds) + 1 buckets.
LATENCY_BOUNDS_S: tuple[float, ...] = _log_spaced(0.001, 300.0, 40)  # ~38 % wide each
SPEEDUP_BOUNDS: tuple[float, ...] = _log_spaced(0.1, 10.0, 40)  # ~12.5 % wide each
# Acceptance length lies in 1 … k+1 (k draft tokens); quarter-token resolution up to 16.
ACCEPTANCE_LENGTH_BOUNDS: tuple[float, ...] = tuple(1.0 + 0.25 * i for i in range(61))


# --- histograms -------------------------------------------------------------------------


def bucket_index(value: float, bounds: Sequence[float]) -> int:
    """The bucket `value` falls in: a value equal to a bound belongs to the bucket above."""
    return bisect.bisect_right(bounds, value)


def histogram(values: Iterable[float], bounds: Sequence[float]) -> tuple[int, ...]:
    """Counts per bucket of the finite `values` over `bounds` (len(bounds) + 1 buckets)."""
    counts = [0] * (len(bounds) + 1)
    for value in values:
        if math.isfinite(value):
            counts[bucket_index(value, bounds)] += 1
    return tuple(counts)


def add_histograms(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """Bucket-wise sum of two histograms over the same bounds."""
    if len(a) != len(b):
        raise ValueError(f"histograms of {len(a)} and {len(b)} buckets cannot be merged")
    return tuple(x + y for x, y in zip(a, b, strict=True))


def histogram_quantile(counts: Sequence[int], bounds: Sequence[float], q: float) -> float | None:
    """The q-quantile of a histogram, interpolating linearly inside the bucket that holds it.

    The rank q·n is located in the first non-empty bucket whose cumulative count reaches
    it, and the value is placed at the same fraction of that bucket's width. The first
    bucket spans [0, bounds[0]); the open last bucket has no width to interpolate over, so
    a quantile that lands there is reported as bounds[-1] (a lower bound, as Prometheus
    does). None for an empty histogram.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q={q!r} is outside [0, 1]")
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(counts)} counts do not fit {len(bounds)} bounds")
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    cumulative = 0
    for index, count in enumerate(counts):
        if count == 0:
            continue
        if cumulative + count >= rank:
            if index == len(bounds):
                return float(bounds[-1])
            lower = 0.0 if index == 0 else float(bounds[index - 1])
            upper = float(bounds[index])
            return lower + (upper - lower) * (rank - cumulative) / count
        cumulative += count
    return float(bounds[-1])  # pragma: no cover - the loop always reaches the total


# --- facts of one pair ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArmFacts:
    """What roll-ups and status need of one arm's generation."""

    error: str  # an `ErrorKind` value; "none" when the generation succeeded
    output_tokens: int
    e2e_s: float
    ttft_s: float | None
    tpot_s: float | None

    @property
    def ok(self) -> bool:
        return self.error == ErrorKind.NONE.value


@dataclass(frozen=True, slots=True)
class PairFacts:
    """The lean figures of one stored pair: no text, no token ids.

    The speculative-arm acceptance fields are None when the engine did not report them;
    `exact_match` is None when the pair has no scores (either arm failed).
    """

    pair_id: str
    category: str
    started_at: datetime
    baseline: ArmFacts
    speculative: ArmFacts
    verify_steps: int | None
    draft_tokens: int | None
    accepted_tokens: int | None
    accepted_per_position: tuple[int, ...] | None
    drafted_per_position: tuple[int, ...] | None
    exact_match: bool | None
    task_score_delta: float | None
    arm: str = DEFAULT_ARM  # the speculative arm's name

    @property
    def complete(self) -> bool:
        return self.baseline.ok and self.speculative.ok

    @property
    def speedup(self) -> float | None:
        """Baseline e2e over speculative e2e, as `PairRecord.speedup`."""
        return e2e_speedup(self.baseline, self.speculative)

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted / steps, as `GenerationResult.acceptance_length`."""
        return acceptance_length_of(self.verify_steps, self.accepted_tokens)


def _arm_facts(result: GenerationResult) -> ArmFacts:
    return ArmFacts(
        error=result.error.value,
        output_tokens=result.output_tokens,
        e2e_s=result.e2e_s,
        ttft_s=result.ttft_s,
        tpot_s=result.tpot_s,
    )


def facts_from_record(record: PairRecord) -> PairFacts:
    """The facts of a pair record, equal to what the store reads back for it."""
    stats = record.speculative.speculative
    return PairFacts(
        pair_id=record.pair_id,
        category=record.prompt.category,
        started_at=record.started_at,
        baseline=_arm_facts(record.baseline),
        speculative=_arm_facts(record.speculative),
        verify_steps=None if stats is None else stats.verify_steps,
        draft_tokens=None if stats is None else stats.draft_tokens,
        accepted_tokens=None if stats is None else stats.accepted_tokens,
        accepted_per_position=None if stats is None else tuple(stats.accepted_per_position),
        drafted_per_position=None if stats is None else tuple(stats.drafted_per_position),
        exact_match=None if record.scores is None else record.scores.exact_match,
        task_score_delta=None if record.scores is None else record.scores.task_score_delta,
        arm=record.arm,
    )


# --- roll-ups ---------------------------------------------------------------------------


def hour_start(moment: datetime) -> datetime:
    """The start of the UTC hour that `moment` (timezone-aware) falls in, in UTC."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"naive datetime {moment!r}: canaryd works in timezone-aware UTC")
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _empty_latency() -> tuple[int, ...]:
    return (0,) * (len(LATENCY_BOUNDS_S) + 1)


@dataclass(frozen=True, slots=True)
class ArmRollup:
    """One arm's figures over many pairs. Latency and tokens count successful generations
    only (as `canaryd once`'s summary does); failures are counted by error kind."""

    ok: int = 0
    errors: Mapping[str, int] = field(default_factory=dict)
    output_tokens: int = 0
    e2e_sum_s: float = 0.0
    e2e_histogram: tuple[int, ...] = field(default_factory=_empty_latency)
    ttft_count: int = 0
    ttft_sum_s: float = 0.0
    ttft_histogram: tuple[int, ...] = field(default_factory=_empty_latency)
    tpot_count: int = 0
    tpot_sum_s: float = 0.0
    tpot_histogram: tuple[int, ...] = field(default_factory=_empty_latency)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @classmethod
    def of(cls, arm: ArmFacts) -> ArmRollup:
        if not arm.ok:
            return cls(errors={arm.error: 1})
        ttft = () if arm.ttft_s is None else (arm.ttft_s,)
        tpot = () if arm.tpot_s is None else (arm.tpot_s,)
        return cls(
            ok=1,
            output_tokens=arm.output_tokens,
            e2e_sum_s=arm.e2e_s,
            e2e_histogram=histogram((arm.e2e_s,), LATENCY_BOUNDS_S),
            ttft_count=len(ttft),
            ttft_sum_s=sum(ttft),
            ttft_histogram=histogram(ttft, LATENCY_BOUNDS_S),
            tpot_count=len(tpot),
            tpot_sum_s=sum(tpot),
            tpot_histogram=histogram(tpot, LATENCY_BOUNDS_S),
        )

    def merge(self, other: ArmRollup) -> ArmRollup:
        errors = Counter(self.errors)
        errors.update(other.errors)
        return ArmRollup(
            ok=self.ok + other.ok,
            errors=dict(sorted(errors.items())),
            output_tokens=self.output_tokens + other.output_tokens,
            e2e_sum_s=self.e2e_sum_s + other.e2e_sum_s,
            e2e_histogram=add_histograms(self.e2e_histogram, other.e2e_histogram),
            ttft_count=self.ttft_count + other.ttft_count,
            ttft_sum_s=self.ttft_sum_s + other.ttft_sum_s,
            ttft_histogram=add_histograms(self.ttft_histogram, other.ttft_histogram),
            tpot_count=self.tpot_count + other.tpot_count,
            tpot_sum_s=self.tpot_sum_s + other.tpot_sum_s,
            tpot_histogram=add_histograms(self.tpot_histogram, other.tpot_histogram),
        )


def _add_positions(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    # Engines with different draft lengths report different lengths; pad with zeros.
    width = max(len(a), len(b))
    return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(width))


@dataclass(frozen=True, slots=True)
class PairRollup:
    """The pairs of one category and one speculative arm started in one UTC hour, as
    sums, counts and histograms (the baseline figures are those of the arm's pairs).

    Pair-level and acceptance figures count complete pairs only (both arms succeeded), as
    `canaryd once`'s summary does: `speculative_reported` of them carried acceptance stats,
    `scored_pairs` of them have scores, of which `exact_matches` matched exactly.
    `draft_tokens` sums only the pairs whose engine reported drafted tokens (a pair that
    did not adds nothing, not a zero count), while `accepted_tokens` sums every reported
    pair: accepted ÷ drafted over a roll-up is the acceptance rate only where every pair
    reported drafted tokens. Per-position counts sum the pairs that report both drafted
    and accepted per position, so their ratio is always a rate.
    """

    hour_start: datetime
    category: str
    arm: str = DEFAULT_ARM
    pairs: int = 0
    complete_pairs: int = 0
    scored_pairs: int = 0
    exact_matches: int = 0
    quality_delta_count: int = 0
    quality_delta_sum: float = 0.0
    speedup_count: int = 0
    speedup_sum: float = 0.0
    speedup_histogram: tuple[int, ...] = (0,) * (len(SPEEDUP_BOUNDS) + 1)
    baseline: ArmRollup = field(default_factory=ArmRollup)
    speculative: ArmRollup = field(default_factory=ArmRollup)
    speculative_reported: int = 0
    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()
    drafted_per_position: tuple[int, ...] = ()
    acceptance_length_count: int = 0
    acceptance_length_sum: float = 0.0
    acceptance_length_histogram: tuple[int, ...] = (0,) * (len(ACCEPTANCE_LENGTH_BOUNDS) + 1)

    @classmethod
    def of(cls, facts: PairFacts) -> PairRollup:
        """The roll-up of a single pair."""
        rollup = cls(
            hour_start=hour_start(facts.started_at),
            category=facts.category,
            arm=facts.arm,
            pairs=1,
            baseline=ArmRollup.of(facts.baseline),
            speculative=ArmRollup.of(facts.speculative),
        )
        if not facts.complete:
            return rollup
        speedup = facts.speedup
        length = facts.acceptance_length
        reported = facts.verify_steps is not None
        # Per position, an empty or missing tuple is "not reported"; only a pair that
        # reports both sides may add to either, or a ratio would pool a zero it never saw.
        by_position = bool(facts.accepted_per_position) and bool(facts.drafted_per_position)
        delta = facts.task_score_delta
        return replace(
            rollup,
            complete_pairs=1,
            scored_pairs=int(facts.exact_match is not None),
            exact_matches=int(bool(facts.exact_match)),
            quality_delta_count=int(delta is not None),
            quality_delta_sum=delta or 0.0,
            speedup_count=int(speedup is not None),
            speedup_sum=speedup or 0.0,
            speedup_histogram=histogram(() if speedup is None else (speedup,), SPEEDUP_BOUNDS),
            speculative_reported=int(reported),
            verify_steps=facts.verify_steps or 0,
            draft_tokens=facts.draft_tokens or 0,  # None: not reported, adds nothing
            accepted_tokens=facts.accepted_tokens or 0,
            accepted_per_position=(facts.accepted_per_position or ()) if by_position else (),
            drafted_per_position=(facts.drafted_per_position or ()) if by_position else (),
            acceptance_length_count=int(length is not None),
            acceptance_length_sum=length or 0.0,
            acceptance_length_histogram=histogram(
                () if length is None else (length,), ACCEPTANCE_LENGTH_BOUNDS
            ),
        )

    def merge(self, other: PairRollup) -> PairRollup:
        """The sum of two roll-ups of the same hour, category and arm."""
        if (self.hour_start, self.category, self.arm) != (
            other.hour_start,
            other.category,
            other.arm,
        ):
            raise ValueError(
                f"cannot merge the roll-up of {other.category!r} on arm {other.arm!r} at "
                f"{other.hour_start!r} into that of {self.category!r} on arm {self.arm!r} "
                f"at {self.hour_start!r}"
            )
        return merge_rollups(self, other, hour=self.hour_start, category=self.category)


def merge_rollups(
    *rollups: PairRollup, hour: datetime | None = None, category: str | None = None
) -> PairRollup:
    """The sum of any roll-ups, labelled `hour` and `category` (default: the first one's)
    and the first one's arm.

    Merging across hours or categories is how status builds a window's figures; the
    stored rows only ever merge within one (hour, category, arm).
    """
    if not rollups:
        raise ValueError("merge_rollups needs at least one roll-up")
    first = rollups[0]
    total = replace(
        first,
        hour_start=first.hour_start if hour is None else hour,
        category=first.category if category is None else category,
    )
    for rollup in rollups[1:]:
        merged: dict[str, object] = {}
        for spec in fields(PairRollup):
            name = spec.name
            if name in ("hour_start", "category", "arm"):
                continue
            mine, theirs = getattr(total, name), getattr(rollup, name)
            if isinstance(mine, ArmRollup):
                merged[name] = mine.merge(theirs)
            elif name in ("accepted_per_position", "drafted_per_position"):
                merged[name] = _add_positions(mine, theirs)
            elif isinstance(mine, tuple):
                merged[name] = add_histograms(mine, theirs)
            else:
                merged[name] = mine + theirs
        total = replace(total, **merged)  # type: ignore[arg-type]  # names from fields()
    return total


def rollups_by_hour(
    facts: Iterable[PairFacts],
) -> dict[tuple[datetime, str, str], PairRollup]:
    """One roll-up per (UTC hour start, category, arm) of the given pairs."""
    grouped: dict[tuple[datetime, str, str], list[PairRollup]] = {}
    for pair in facts:
        single = PairRollup.of(pair)
        grouped.setdefault((single.hour_start, single.category, single.arm), []).append(single)
    return {key: merge_rollups(*singles) for key, singles in sorted(grouped.items())}


def rollup_of(
    facts: Iterable[PairFacts], hour: datetime, category: str, arm: str = DEFAULT_ARM
) -> PairRollup:
    """All of `facts` in one roll-up labelled `hour` and `category` (empty if no facts:
    labelled `arm`)."""
    singles = [PairRollup.of(pair) for pair in facts]
    if not singles:
        return PairRollup(hour_start=hour, category=category, arm=arm)
    return merge_rollups(*singles, hour=hour, category=category)
