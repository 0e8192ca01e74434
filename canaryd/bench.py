"""`canaryd bench`: the seed documents' evaluation procedure as one stored run.

A bench warms both arms up (excluded from every figure), then climbs a concurrency
ladder. At each level each arm is driven *separately* by `concurrency` closed-loop
workers of a thread pool over the same prompts in the same order; request i of the
baseline and request i of the speculative arm form pair i, which is scored and stored
like any other pair, so acceptance and consistency come from the very data the ladder
measured. What a stored pair cannot carry — which level it belongs to and how long
each arm's level took on the wall clock — goes into the run's config snapshot under
`bench` (with the plan and the resource figures), so every number in `results.json`
and in `canaryd report` is recomputed from the database by the functions below.

The in-process transformers engine runs one `generate` at a time per model (a lock),
so its "concurrency" measures queueing: aggregate throughput stays flat and latency
grows with the level. The OpenAI-compatible HTTP engine sends truly concurrent streams
and measures the server's batching.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from canaryd.records import ARMS, Arm, PairRecord, Prompt, RunInfo
from canaryd.scoring import score_pair
from canaryd.store import Store, StoredRun
from canaryd.summary import ALL
from engine.base import Engine
from engine.types import ErrorKind, GenerationRequest, GenerationResult, SamplingParams
from gates.stats import mean, quantile, rate

log = structlog.get_logger(__name__)

BENCH_SCHEMA = "canaryd.bench/1"
LATENCY_QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
DEFAULT_CONCURRENCY: tuple[int, ...] = (1, 4, 16, 64)


# --- figures: pure functions of stored data --------------------------------------------


@dataclass(frozen=True, slots=True)
class Percentiles:
    p50: float | None
    p95: float | None
    p99: float | None


def percentiles(values: Iterable[float | None]) -> Percentiles:
    """P50/P95/P99 (type-7 quantiles, `gates.stats.quantile`) of the values that are set."""
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
    concurrency: int
    arm_order: tuple[Arm, Arm]
    baseline: ArmLevelFigures
    speculative: ArmLevelFigures
    throughput_speedup: float | None  # speculative / baseline aggregate tokens/s
    e2e_speedup_median: float | None  # median over complete pairs of baseline e2e / spec e2e

    def arm(self, arm: Arm) -> ArmLevelFigures:
        return self.baseline if arm == "baseline" else self.speculative


def level_figures(
    concurrency: int,
    arm_order: tuple[Arm, Arm],
    pairs: Sequence[PairRecord],
    wall_s: Mapping[Arm, float],
) -> LevelFigures:
    """Both arms of one level and the speedups between them."""
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
    )


@dataclass(frozen=True, slots=True)
class AcceptanceFigures:
    """The speculative arm's acceptance over complete pairs (seeds step 1, offline)."""

    pairs: int  # complete pairs whose speculative arm reported acceptance
    acceptance_length_mean: float | None  # output tokens / verify steps
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


# --- what a bench run stores in its config snapshot ------------------------------------


@dataclass(frozen=True, slots=True)
class BenchPlan:
    """The ladder to climb. Exactly one of `requests` and `duration_s` is set."""

    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    requests: int | None = None  # per level and arm
    duration_s: float | None = None  # per level: the baseline arm's time budget
    warmup: int = 2  # requests per arm before the ladder, excluded

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be ≥ 1, got {self.concurrency!r}")
        if (self.requests is None) == (self.duration_s is None):
            raise ValueError("set exactly one of requests and duration_s")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be ≥ 1, got {self.requests!r}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s!r}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be ≥ 0, got {self.warmup!r}")


def default_requests(concurrency: Sequence[int]) -> int:
    """Without --requests or --duration: enough requests to fill the top level twice."""
    return max(16, 2 * max(concurrency))


@dataclass(frozen=True, slots=True)
class ArmWindow:
    started_at: datetime
    wall_s: float


@dataclass(frozen=True, slots=True)
class LevelRecord:
    """Which stored pairs one level produced, and each arm's wall-clock window."""

    concurrency: int
    arm_order: tuple[Arm, Arm]
    pair_ids: tuple[str, ...]
    windows: dict[Arm, ArmWindow]

    def as_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "arm_order": list(self.arm_order),
            "pair_ids": list(self.pair_ids),
            "arms": {
                arm: {"started_at": w.started_at.isoformat(), "wall_s": w.wall_s}
                for arm, w in self.windows.items()
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LevelRecord:
        order = tuple(data["arm_order"])
        if sorted(order) != sorted(ARMS):
            raise ValueError(f"bad arm order {order!r} in a stored bench level")
        return cls(
            concurrency=int(data["concurrency"]),
            arm_order=(order[0], order[1]),
            pair_ids=tuple(data["pair_ids"]),
            windows={
                arm: ArmWindow(
                    started_at=datetime.fromisoformat(w["started_at"]), wall_s=float(w["wall_s"])
                )
                for arm, w in data["arms"].items()
                if arm in ARMS
            },
        )


def bench_section(run: StoredRun) -> dict[str, Any] | None:
    """The `bench` part of a run's config snapshot; None for runs that are not benches."""
    section = run.info.config.get("bench")
    if run.info.kind != "bench" or not isinstance(section, dict):
        return None
    return section


def ladder_figures(section: Mapping[str, Any], pairs: Sequence[PairRecord]) -> list[LevelFigures]:
    """Each level's figures from the stored pairs it lists and its stored windows."""
    by_id = {p.pair_id: p for p in pairs}
    figures = []
    for data in section.get("levels", []):
        level = LevelRecord.from_json(data)
        level_pairs = [by_id[i] for i in level.pair_ids if i in by_id]
        figures.append(
            level_figures(
                level.concurrency,
                level.arm_order,
                level_pairs,
                {arm: level.windows[arm].wall_s for arm in ARMS},
            )
        )
    return figures


def bench_results(run: StoredRun, pairs: Sequence[PairRecord]) -> dict[str, Any]:
    """`results.json`: everything the bench found, recomputed from the stored run."""
    section = bench_section(run)
    if section is None:
        raise ValueError(f"run {run.info.run_id!r} is a {run.info.kind!r} run, not a bench")
    config = {k: v for k, v in run.info.config.items() if k != "bench"}
    return {
        "schema": BENCH_SCHEMA,
        "run_id": run.info.run_id,
        "started_at": run.info.started_at.isoformat(),
        "finished_at": None if run.finished_at is None else run.finished_at.isoformat(),
        "plan": section.get("plan"),
        "warmup": section.get("warmup"),
        "engines": {
            "baseline": run.info.baseline_identity,
            "speculative": run.info.speculative_identity,
        },
        "software": run.info.software,
        "config": config,
        "config_hash": run.info.config_hash,
        "acceptance": {c: asdict(f) for c, f in by_category(pairs, acceptance_figures).items()},
        "ladder": [asdict(level) for level in ladder_figures(section, pairs)],
        "consistency": {c: asdict(f) for c, f in by_category(pairs, consistency_figures).items()},
        "resources": section.get("resources"),
    }


# --- driving the engines ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timed:
    """One request's result and when it was sent."""

    started_at: datetime
    result: GenerationResult


def call_engine(engine: Engine, request: GenerationRequest) -> Timed:
    """`engine.generate`, with an engine that raises (a bug) recorded as `internal`."""
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    try:
        result = engine.generate(request)
    except Exception as exc:
        log.exception("bench.engine_raised", request_id=request.request_id)
        result = GenerationResult.failed(
            ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}", time.perf_counter() - started
        )
    return Timed(started_at, result)


@dataclass
class ArmRun:
    window: ArmWindow
    results: list[Timed] = field(default_factory=list)


def drive_arm(
    engine: Engine,
    request_for: Callable[[int], GenerationRequest],
    concurrency: int,
    *,
    limit: int | None = None,
    deadline_s: float | None = None,
    on_done: Callable[[], None] | None = None,
) -> ArmRun:
    """Closed loop: `concurrency` workers each take the next request index and send it,
    until `limit` requests were sent or `deadline_s` seconds passed (in-flight requests
    finish). Results come back in index order; the window spans first send to last reply."""
    if limit is None and deadline_s is None:
        raise ValueError("drive_arm needs a limit or a deadline")
    results: dict[int, Timed] = {}
    next_index = 0
    lock = threading.Lock()
    started_at = datetime.now(UTC)
    started = time.perf_counter()

    def take() -> int | None:
        nonlocal next_index
        with lock:
            if limit is not None and next_index >= limit:
                return None
            if deadline_s is not None and time.perf_counter() - started >= deadline_s:
                return None
            index, next_index = next_index, next_index + 1
            return index

    def worker() -> None:
        while (index := take()) is not None:
            timed = call_engine(engine, request_for(index))
            with lock:
                results[index] = timed
            if on_done is not None:
                on_done()

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="bench") as pool:
        for future in [pool.submit(worker) for _ in range(concurrency)]:
            future.result()
    wall_s = time.perf_counter() - started
    return ArmRun(ArmWindow(started_at, wall_s), [results[i] for i in sorted(results)])


@dataclass(frozen=True, slots=True)
class BenchParams:
    """Sampling shared by both arms (from `[prompts]`); `max_tokens` overrides prompts'."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int | None = None
    timeout_s: float | None = 120.0
    seed: int = 0


class BenchProgress:
    """What the bench tells its caller as it goes (a rich progress bar on a TTY)."""

    def phase(self, description: str, total: int | None) -> None: ...

    def advance(self) -> None: ...


class Bench:
    def __init__(
        self,
        baseline: Engine,
        speculative: Engine,
        *,
        prompts: Sequence[Prompt],
        plan: BenchPlan,
        params: BenchParams,
        run_id: str | None = None,
        progress: BenchProgress | None = None,
    ) -> None:
        if not prompts:
            raise ValueError("a bench needs at least one prompt")
        self.arms: dict[Arm, Engine] = {"baseline": baseline, "speculative": speculative}
        self.prompts = list(prompts)
        self.plan = plan
        self.params = params
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.progress = progress or BenchProgress()
        self._rng = random.Random(params.seed)  # noqa: S311  (arm order, not security)
        self.warmup: dict[str, Any] = {}

    def request(self, index: int, request_id: str) -> GenerationRequest:
        prompt = self.prompts[index % len(self.prompts)]
        return GenerationRequest(
            messages=prompt.messages,
            sampling=SamplingParams(
                max_tokens=self.params.max_tokens or prompt.max_tokens,
                temperature=self.params.temperature,
                top_p=self.params.top_p,
                seed=self.params.seed + index,
            ),
            request_id=request_id,
            timeout_s=self.params.timeout_s,
            category=prompt.category,
        )

    def pair_id(self, concurrency: int, index: int) -> str:
        return f"{self.run_id}-c{concurrency}-{index:05d}"

    def run_warmup(self) -> None:
        """`plan.warmup` requests per arm, one at a time; nothing of them is kept."""
        if not self.plan.warmup:
            self.warmup = {"requests_per_arm": 0}
            return
        self.progress.phase("warm-up", 2 * self.plan.warmup)
        walls: dict[str, float] = {}
        for arm in ARMS:
            run = drive_arm(
                self.arms[arm],
                lambda i: self.request(i, f"{self.run_id}-warmup-{i}"),
                1,
                limit=self.plan.warmup,
                on_done=self.progress.advance,
            )
            walls[arm] = run.window.wall_s
        self.warmup = {"requests_per_arm": self.plan.warmup, "wall_s": walls}

    def run_level(self, concurrency: int) -> tuple[LevelRecord, list[PairRecord]]:
        order: tuple[Arm, Arm] = ("baseline", "speculative")
        if self._rng.random() < 0.5:  # which arm goes first alternates at random per level
            order = ("speculative", "baseline")
        runs: dict[Arm, ArmRun] = {}
        limit = self.plan.requests
        for position, arm in enumerate(order):
            timed_first = position == 0 and self.plan.duration_s is not None
            self.progress.phase(f"c={concurrency} {arm}", limit)
            runs[arm] = drive_arm(
                self.arms[arm],
                lambda i: self.request(i, self.pair_id(concurrency, i)),
                concurrency,
                limit=None if timed_first else limit,
                deadline_s=self.plan.duration_s if timed_first else None,
                on_done=self.progress.advance,
            )
            if timed_first:  # the other arm sends exactly the requests this one sent
                limit = len(runs[arm].results)
        records = []
        for index, (base, spec) in enumerate(
            zip(runs["baseline"].results, runs["speculative"].results, strict=True)
        ):
            prompt = self.prompts[index % len(self.prompts)]
            records.append(
                PairRecord(
                    pair_id=self.pair_id(concurrency, index),
                    run_id=self.run_id,
                    prompt=prompt,
                    started_at=min(base.started_at, spec.started_at),
                    arm_order=order,
                    baseline=base.result,
                    speculative=spec.result,
                    scores=score_pair(prompt, base.result, spec.result),
                    sampling_seed=self.params.seed + index,
                    temperature=self.params.temperature,
                )
            )
        level = LevelRecord(
            concurrency=concurrency,
            arm_order=order,
            pair_ids=tuple(r.pair_id for r in records),
            windows={arm: runs[arm].window for arm in ARMS},
        )
        log.info(
            "bench.level_done",
            concurrency=concurrency,
            requests=len(records),
            baseline_wall_s=round(level.windows["baseline"].wall_s, 3),
            speculative_wall_s=round(level.windows["speculative"].wall_s, 3),
        )
        return level, records

    def section(
        self, levels: Sequence[LevelRecord], resources: Mapping[str, Any]
    ) -> dict[str, Any]:
        plan = asdict(self.plan)
        plan["concurrency"] = list(self.plan.concurrency)
        return {
            "schema": BENCH_SCHEMA,
            "plan": plan,
            "params": asdict(self.params),
            "prompts": [f"{p.suite}/{p.id}" for p in self.prompts],
            "warmup": self.warmup,
            "levels": [level.as_json() for level in levels],
            "resources": dict(resources),
        }


def store_bench(
    store: Store,
    run: RunInfo,
    records: Sequence[PairRecord],
    finished_at: datetime,
) -> None:
    """Store the finished bench: the run (with its `bench` section), then every pair.

    The run row is written once the ladder is done because its config snapshot carries
    the measured level windows, and the store has no way to amend a run afterwards.
    """
    store.create_run(run)
    for record in records:
        store.save_pair(record)
    store.finish_run(run.run_id, finished_at)
