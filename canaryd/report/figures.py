"""Figures of stored pairs: percentiles, acceptance, consistency and the bench ladder.

Pure functions of `PairRecord`s and of the `bench` section a bench run stores in its
config snapshot, so `canaryd bench`'s `results.json`, the report's tables and its plots
are all computed by the same code from the same data. `LevelRecord` is the stored form
of one ladder level: the bench writes it, the report reads it back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from canaryd.report.summary import ALL
from canaryd.store import StoredRun
from engine.types import GenerationResult
from gates.records import ARMS, BASELINE_ARM, DEFAULT_ARM, Arm, PairRecord
from gates.stats.descriptive import mean, quantile, rate

LATENCY_QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
LATENCY_METRICS: tuple[tuple[str, str], ...] = (
    ("ttft_s", "TTFT"),
    ("tpot_s", "TPOT"),
    ("itl_p99_s", "ITL P99 per request"),
    ("e2e_s", "end-to-end"),
)


def latency_value(result: GenerationResult, metric: str) -> float | None:
    """A `LATENCY_METRICS` figure of one generation: `itl_p99_s` is the P99 of its own
    gaps between tokens, the others its fields of that name."""
    if metric == "itl_p99_s":
        return None if result.itl is None else result.itl.p99_s
    value: float | None = getattr(result, metric)
    return value


@dataclass(frozen=True, slots=True)
class Percentiles:
    p50: float | None
    p95: float | None
    p99: float | None


def percentiles(values: Iterable[float | None]) -> Percentiles:
    """P50/P95/P99 (type-7 quantiles, `gates.stats.descriptive.quantile`) of the values
    that are set."""
    present = [v for v in values if v is not None]
    p50, p95, p99 = (quantile(present, q) for _, q in LATENCY_QUANTILES)
    return Percentiles(p50=p50, p95=p95, p99=p99)


@dataclass(frozen=True, slots=True)
class ArmLevelFigures:
    """One arm at one concurrency level; throughput over the level's wall-clock time."""

    requests: int
    ok: int
    errors: int
    error_rate: float | None
    wall_s: float
    output_tokens: int  # of successful requests
    aggregate_tokens_per_s: float | None  # output tokens / wall-clock seconds
    per_request_tokens_per_s_p50: float | None  # median of output tokens / e2e per request
    per_request_tokens_per_s_mean: float | None
    request_rate_per_s: float | None  # successful requests / wall-clock seconds
    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles


def arm_level_figures(results: Sequence[GenerationResult], wall_s: float) -> ArmLevelFigures:
    """The ladder figures of one arm's results at one level, which took `wall_s` seconds."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    per_request = [t for r in ok if (t := r.tokens_per_s) is not None]
    return ArmLevelFigures(
        requests=len(results),
        ok=len(ok),
        errors=len(results) - len(ok),
        error_rate=rate(len(results) - len(ok), len(results)),
        wall_s=wall_s,
        output_tokens=tokens,
        aggregate_tokens_per_s=tokens / wall_s if wall_s > 0 and ok else None,
        per_request_tokens_per_s_p50=quantile(per_request, 0.5),
        per_request_tokens_per_s_mean=mean(per_request),
        request_rate_per_s=len(ok) / wall_s if wall_s > 0 else None,
        ttft_s=percentiles(r.ttft_s for r in ok),
        tpot_s=percentiles(r.tpot_s for r in ok),
        e2e_s=percentiles(r.e2e_s for r in ok),
    )


@dataclass(frozen=True, slots=True)
class LevelFigures:
    """One concurrency level of one speculative arm against the baseline."""

    concurrency: int
    arm_order: tuple[Arm, Arm]
    baseline: ArmLevelFigures
    speculative: ArmLevelFigures
    throughput_speedup: float | None  # speculative / baseline aggregate tokens/s
    e2e_speedup_median: float | None  # median over complete pairs of baseline e2e / spec e2e
    speculative_arm: str = DEFAULT_ARM  # the speculative arm's name

    def arm(self, arm: Arm) -> ArmLevelFigures:
        return self.baseline if arm == "baseline" else self.speculative


def level_figures(
    concurrency: int,
    arm_order: tuple[Arm, Arm],
    pairs: Sequence[PairRecord],
    wall_s: Mapping[Arm, float],
    arm: str = DEFAULT_ARM,
) -> LevelFigures:
    """The baseline and the speculative arm `arm` at one level and the speedups between
    them."""
    baseline = arm_level_figures([p.baseline for p in pairs], wall_s["baseline"])
    speculative = arm_level_figures([p.speculative for p in pairs], wall_s["speculative"])
    base_tps, spec_tps = baseline.aggregate_tokens_per_s, speculative.aggregate_tokens_per_s
    return LevelFigures(
        concurrency=concurrency,
        arm_order=arm_order,
        baseline=baseline,
        speculative=speculative,
        throughput_speedup=spec_tps / base_tps if base_tps and spec_tps is not None else None,
        e2e_speedup_median=quantile([s for p in pairs if (s := p.speedup) is not None], 0.5),
        speculative_arm=arm,
    )


@dataclass(frozen=True, slots=True)
class AcceptanceFigures:
    """The speculative arm's acceptance over complete pairs."""

    pairs: int  # complete pairs whose speculative arm reported acceptance
    acceptance_length_mean: float | None  # 1 + accepted tokens / verify steps
    acceptance_length_p50: float | None
    acceptance_length_p90: float | None
    acceptance_rate: float | None  # accepted / drafted, pooled where drafted is reported
    # pooled counts, position 1..k, over requests that report both per-position figures
    accepted_per_position: tuple[int, ...]
    drafted_per_position: tuple[int, ...]
    acceptance_rate_per_position: tuple[float | None, ...]  # accepted_i / drafted_i


def acceptance_lengths(pairs: Iterable[PairRecord]) -> list[float]:
    """Per-request acceptance lengths of complete pairs, in pair order."""
    return [
        length
        for p in pairs
        if p.complete and (length := p.speculative.acceptance_length) is not None
    ]


def _pooled(columns: Iterable[Sequence[int]]) -> tuple[int, ...]:
    totals: list[int] = []
    for counts in columns:
        if len(counts) > len(totals):
            totals.extend([0] * (len(counts) - len(totals)))
        for i, count in enumerate(counts):
            totals[i] += count
    return tuple(totals)


def acceptance_figures(pairs: Sequence[PairRecord]) -> AcceptanceFigures:
    lengths = acceptance_lengths(pairs)
    stats = [s for p in pairs if p.complete and (s := p.speculative.speculative) is not None]
    # Not reported is not zero: a rate pools only requests that report its denominator.
    by_position = [s for s in stats if s.accepted_per_position and s.drafted_per_position]
    rated = [s for s in stats if s.draft_tokens is not None]
    accepted = _pooled(s.accepted_per_position for s in by_position)
    drafted = _pooled(s.drafted_per_position for s in by_position)
    per_position = tuple(
        rate(a, drafted[i]) if i < len(drafted) else None for i, a in enumerate(accepted)
    )
    return AcceptanceFigures(
        pairs=len(lengths),
        acceptance_length_mean=mean(lengths),
        acceptance_length_p50=quantile(lengths, 0.5),
        acceptance_length_p90=quantile(lengths, 0.9),
        acceptance_rate=rate(
            sum(s.accepted_tokens for s in rated), sum(s.draft_tokens or 0 for s in rated)
        ),
        accepted_per_position=accepted,
        drafted_per_position=drafted,
        acceptance_rate_per_position=per_position,
    )


@dataclass(frozen=True, slots=True)
class ConsistencyFigures:
    """Speculative against baseline output over scored (complete) pairs."""

    pairs: int
    scored_pairs: int
    exact_match_rate: float | None
    token_edit_similarity_mean: float | None
    quality_delta_mean: float | None  # speculative - baseline task score
    quality_scored_pairs: int  # pairs whose prompt has a check or reference


def consistency_figures(pairs: Sequence[PairRecord]) -> ConsistencyFigures:
    scored = [p.scores for p in pairs if p.scores is not None]
    deltas = [d for s in scored if (d := s.task_score_delta) is not None]
    return ConsistencyFigures(
        pairs=len(pairs),
        scored_pairs=len(scored),
        exact_match_rate=rate(sum(s.exact_match for s in scored), len(scored)),
        token_edit_similarity_mean=mean([s.token_edit_similarity for s in scored]),
        quality_delta_mean=mean(deltas),
        quality_scored_pairs=len(deltas),
    )


def by_category(
    pairs: Sequence[PairRecord], figures: Callable[[Sequence[PairRecord]], Any]
) -> dict[str, Any]:
    """`figures` per category (sorted), plus `all` over every pair when there are any."""
    categories = sorted({p.prompt.category for p in pairs})
    grouped = {c: figures([p for p in pairs if p.prompt.category == c]) for c in categories}
    if pairs:
        grouped[ALL] = figures(pairs)
    return grouped


def arm_latency(pairs: Sequence[PairRecord]) -> dict[Arm, dict[str, Percentiles]]:
    """TTFT, TPOT, per-request ITL P99 and e2e P50/P95/P99 of each arm's successful
    generations."""
    latency: dict[Arm, dict[str, Percentiles]] = {}
    for arm in ARMS:
        results = [r for p in pairs if (r := p.baseline if arm == "baseline" else p.speculative).ok]
        latency[arm] = {
            metric: percentiles(latency_value(r, metric) for r in results)
            for metric, _ in LATENCY_METRICS
        }
    return latency


# --- the ladder as a bench run stores it ------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArmWindow:
    started_at: datetime
    wall_s: float


@dataclass(frozen=True, slots=True)
class LevelRecord:
    """Which stored pairs one level produced (of every speculative arm), and each arm's
    wall-clock window, by arm name; `arm_order` is the order the arms were driven in."""

    concurrency: int  # 0 for an open-loop level
    arm_order: tuple[str, ...]
    pair_ids: tuple[str, ...]
    windows: dict[str, ArmWindow]
    rate: float | None = None  # requests per second of an open-loop level
    # per arm, `canaryd.bench.serving.serving_figures` of its in-memory results
    serving: dict[str, Any] = field(default_factory=dict)

    @property
    def speculative_arms(self) -> tuple[str, ...]:
        return tuple(arm for arm in self.arm_order if arm != BASELINE_ARM)

    def roles(self, arm: str) -> tuple[Arm, Arm]:
        """Whether the baseline or the speculative arm `arm` ran first at this level."""
        first = self.arm_order.index(BASELINE_ARM) < self.arm_order.index(arm)
        return ("baseline", "speculative") if first else ("speculative", "baseline")

    def as_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "rate": self.rate,
            "serving": self.serving,
            "arm_order": list(self.arm_order),
            "pair_ids": list(self.pair_ids),
            "arms": {
                arm: {"started_at": w.started_at.isoformat(), "wall_s": w.wall_s}
                for arm, w in self.windows.items()
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LevelRecord:
        order = tuple(str(arm) for arm in data["arm_order"])
        if BASELINE_ARM not in order or len(order) < 2 or len(set(order)) != len(order):
            raise ValueError(f"bad arm order {order!r} in a stored bench level")
        return cls(
            concurrency=int(data["concurrency"]),
            arm_order=order,
            pair_ids=tuple(data["pair_ids"]),
            windows={
                arm: ArmWindow(
                    started_at=datetime.fromisoformat(w["started_at"]), wall_s=float(w["wall_s"])
                )
                for arm, w in data["arms"].items()
                if arm in order
            },
            rate=None if data.get("rate") is None else float(data["rate"]),
            serving=dict(data.get("serving") or {}),
        )


def run_arms(run: StoredRun, pairs: Iterable[PairRecord] = ()) -> list[str]:
    """The speculative arms of a stored run and of `pairs`: the run's switch arm first,
    then the others by name."""
    first, *others = run.arms
    return [first, *sorted((set(others) | {p.arm for p in pairs}) - {first})]


def bench_section(run: StoredRun) -> dict[str, Any] | None:
    """The `bench` part of a run's config snapshot; None for runs that are not benches."""
    section = run.info.config.get("bench")
    if run.info.kind != "bench" or not isinstance(section, dict):
        return None
    return section


def probe_section(run: StoredRun) -> dict[str, Any] | None:
    """The `probe` part of a run's config snapshot (`canaryd probe`'s table); None for
    runs that are not probes."""
    section = run.info.config.get("probe")
    if run.info.kind != "probe" or not isinstance(section, dict):
        return None
    return section


def ladder_figures(section: Mapping[str, Any], pairs: Sequence[PairRecord]) -> list[LevelFigures]:
    """Each level's figures from the stored pairs it lists and its stored windows: one
    per level and speculative arm, levels in order, arms in their driven order."""
    by_id = {p.pair_id: p for p in pairs}
    figures = []
    for data in section.get("levels", []):
        level = LevelRecord.from_json(data)
        listed = [by_id[i] for i in level.pair_ids if i in by_id]
        for arm in level.speculative_arms:
            figures.append(
                level_figures(
                    level.concurrency,
                    level.roles(arm),
                    [p for p in listed if p.arm == arm],
                    {
                        "baseline": level.windows[BASELINE_ARM].wall_s,
                        "speculative": level.windows[arm].wall_s,
                    },
                    arm=arm,
                )
            )
    return figures
