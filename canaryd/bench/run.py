"""`canaryd bench`: the one-shot evaluation (acceptance, concurrency ladder, consistency,
resources) as one stored run.

A bench warms every arm up (excluded from every figure), then climbs a concurrency
ladder. At each level each arm is driven *separately*, in a random order, by
`concurrency` closed-loop workers of a thread pool over the same prompts in the same
order; request i of the baseline and request i of a speculative arm form that arm's pair
i (the pairs of request i share a group), which is scored and stored like any other
pair, so acceptance and consistency come from the very data the ladder measured. What a
stored pair cannot carry — which level it belongs to and how long each arm's level took
on the wall clock — goes into the run's config snapshot under
`bench` (with the plan and the resource figures), so every number in `results.json`
and in `canaryd report` is recomputed from the database by `canaryd.report.figures`.

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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from canaryd.bench.resources import ResourceMeter
from canaryd.bench.serving import Slo, poisson_arrivals, serving_figures, vllm_view
from canaryd.report.figures import (
    ArmWindow,
    LevelRecord,
    acceptance_figures,
    bench_section,
    by_category,
    consistency_figures,
    ladder_figures,
    run_arms,
)
from canaryd.scoring import score_pair
from canaryd.store import Store, StoredRun
from engine.base import Engine
from engine.types import ErrorKind, GenerationRequest, GenerationResult, SamplingParams
from engine.validation import checked_result
from gates.records import BASELINE_ARM, DEFAULT_ARM, Arm, PairRecord, Prompt, RunInfo

log = structlog.get_logger(__name__)

BENCH_SCHEMA = "canaryd.bench/1"
DEFAULT_CONCURRENCY: tuple[int, ...] = (1, 4, 16, 64)


# --- the plan and what a bench run stores ----------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchPlan:
    """The ladder to climb: closed-loop `concurrency` levels, then open-loop `rates`
    (requests per second, gamma gaps of shape `burstiness`; open-loop levels need
    `requests`). Exactly one of `requests` and `duration_s` is set."""

    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    requests: int | None = None  # per level and arm
    duration_s: float | None = None  # per level: the baseline arm's time budget
    warmup: int = 2  # requests per arm before the ladder, excluded
    rates: tuple[float, ...] = ()
    burstiness: float = 1.0
    slo: Slo = field(default_factory=Slo)

    def __post_init__(self) -> None:
        if not (self.concurrency or self.rates) or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be ≥ 1, got {self.concurrency!r}")
        if any(r <= 0 for r in self.rates) or self.burstiness <= 0:
            raise ValueError(f"rates and burstiness must be > 0, got {self.rates!r}")
        if self.rates and self.requests is None:
            raise ValueError("open-loop rates need a number of requests, not a duration")
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


def bench_results(run: StoredRun, pairs: Sequence[PairRecord]) -> dict[str, Any]:
    """`results.json`: everything the bench found, recomputed from the stored run.
    `acceptance` and `consistency` are the switch's arm's; `arms` has them for every
    speculative arm."""
    section = bench_section(run)
    if section is None:
        raise ValueError(f"run {run.info.run_id!r} is a {run.info.kind!r} run, not a bench")
    config = {k: v for k, v in run.info.config.items() if k != "bench"}
    arms = run_arms(run, pairs)
    of_arm = {arm: [p for p in pairs if p.arm == arm] for arm in arms}
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
            **{arm: identity for arm, identity in run.info.arm_identities.items()},
        },
        "software": run.info.software,
        "config": config,
        "config_hash": run.info.config_hash,
        "acceptance": _by_category(of_arm[arms[0]], acceptance_figures),
        "ladder": [asdict(level) for level in ladder_figures(section, pairs)],
        "consistency": _by_category(of_arm[arms[0]], consistency_figures),
        "resources": section.get("resources"),
        "serving": serving_results(section),
        "cold": (section.get("warmup") or {}).get("cold"),
        "switch_arm": arms[0],
        "arms": {
            arm: {
                "acceptance": _by_category(of_arm[arm], acceptance_figures),
                "consistency": _by_category(of_arm[arm], consistency_figures),
            }
            for arm in arms
        },
    }


def serving_results(section: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each level's serving figures per arm (with their `vllm bench serve` keys) and the
    speculative arms' cost per useful token over the baseline's."""
    levels = []
    for data in section.get("levels", []):
        serving = data.get("serving") or {}
        base_cost = (serving.get(BASELINE_ARM) or {}).get("cost_per_useful_token")
        levels.append(
            {
                "concurrency": data.get("concurrency"),
                "rate": data.get("rate"),
                "arms": {arm: {**f, "vllm": vllm_view(f)} for arm, f in serving.items()},
                "cost_ratio": {
                    arm: f["cost_per_useful_token"] / base_cost
                    if base_cost and f.get("cost_per_useful_token") is not None
                    else None
                    for arm, f in serving.items()
                    if arm != BASELINE_ARM
                },
            }
        )
    return levels


def _by_category(
    pairs: Sequence[PairRecord], figures: Callable[[Sequence[PairRecord]], Any]
) -> dict[str, Any]:
    return {c: asdict(f) for c, f in by_category(pairs, figures).items()}


# --- driving the engines ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timed:
    """One request's result and when it was sent."""

    started_at: datetime
    result: GenerationResult


def call_engine(engine: Engine, request: GenerationRequest) -> Timed:
    """`engine.generate`, with an engine that raises (a bug) recorded as `internal` and an
    answer that cannot be true as `invalid_output`."""
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    try:
        result = checked_result(engine.generate(request), request)
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


def drive_open(
    engine: Engine,
    request_for: Callable[[int], GenerationRequest],
    arrivals: Sequence[float],
    *,
    on_done: Callable[[], None] | None = None,
) -> ArmRun:
    """Open loop: request i is sent `arrivals[i]` seconds after the start whatever is
    still in flight (as `vllm bench serve --request-rate` sends). Results in index order;
    the window spans the start to the last reply."""
    results: dict[int, Timed] = {}
    lock = threading.Lock()
    started_at = datetime.now(UTC)
    started = time.perf_counter()

    def send(index: int) -> None:
        timed = call_engine(engine, request_for(index))
        with lock:
            results[index] = timed
        if on_done is not None:
            on_done()

    workers = max(1, min(len(arrivals), 256))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench-open") as pool:
        futures = []
        for index, at in enumerate(arrivals):
            delay = started + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(send, index))
        for future in futures:
            future.result()
    wall_s = time.perf_counter() - started
    return ArmRun(ArmWindow(started_at, wall_s), [results[i] for i in sorted(results)])


def passed_quality(record: PairRecord) -> bool:
    """A complete pair whose speculative output kept the baseline's quality: an exact
    match, or a task score no lower than the baseline's (no check: not a loss), and no
    loop the baseline did not have."""
    scores = record.scores
    if not record.complete or scores is None or scores.speculative_loop > scores.baseline_loop:
        return False
    return scores.exact_match or (scores.task_score_delta or 0.0) >= 0.0


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
    """The ladder on `baseline` and `speculative`: one engine (the arm named
    `speculative`), or the speculative arms by name."""

    def __init__(
        self,
        baseline: Engine,
        speculative: Engine | Mapping[str, Engine],
        *,
        prompts: Sequence[Prompt],
        plan: BenchPlan,
        params: BenchParams,
        run_id: str | None = None,
        progress: BenchProgress | None = None,
    ) -> None:
        if not prompts:
            raise ValueError("a bench needs at least one prompt")
        self.speculative: dict[str, Engine] = (
            dict(speculative) if isinstance(speculative, Mapping) else {DEFAULT_ARM: speculative}
        )
        if not self.speculative or BASELINE_ARM in self.speculative:
            raise ValueError(f"speculative arms {sorted(self.speculative)!r}: need at least one")
        self.arms: dict[str, Engine] = {BASELINE_ARM: baseline, **self.speculative}
        self.prompts = list(prompts)
        self.plan = plan
        self.params = params
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.progress = progress or BenchProgress()
        self._rng = random.Random(params.seed)  # noqa: S311  (arm order, not security)
        self.warmup: dict[str, Any] = {}
        self.meter = ResourceMeter()

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

    def pair_id(
        self, concurrency: int, index: int, arm: str | None = None, rate: float | None = None
    ) -> str:
        """Request `index` of a level (the group of its pairs); with several speculative
        arms, `arm`'s pair of it."""
        level = f"c{concurrency}" if rate is None else f"r{rate:g}"
        group = f"{self.run_id}-{level}-{index:05d}"
        return group if arm is None or len(self.speculative) == 1 else f"{group}-{arm}"

    def run_warmup(self) -> None:
        """`plan.warmup` requests per arm, one at a time; nothing of them is kept."""
        if not self.plan.warmup:
            self.warmup = {"requests_per_arm": 0}
            return
        self.progress.phase("warm-up", len(self.arms) * self.plan.warmup)
        walls: dict[str, float] = {}
        cold: dict[str, Any] = {}
        for arm in self.arms:
            run = drive_arm(
                self.arms[arm],
                lambda i: self.request(i, f"{self.run_id}-warmup-{i}"),
                1,
                limit=self.plan.warmup,
                on_done=self.progress.advance,
            )
            walls[arm] = run.window.wall_s
            # The first requests after start, apart from the warm levels' figures.
            cold[arm] = serving_figures(
                [t.result for t in run.results],
                run.window.wall_s,
                slo=self.plan.slo,
                resource_s=None,
                resource_unit=self.meter.unit,
                useful_tokens=0,
            )
        self.warmup = {"requests_per_arm": self.plan.warmup, "wall_s": walls, "cold": cold}

    def _order(self) -> tuple[str, ...]:
        """Which arm goes first, second, … is drawn at random per level."""
        names = list(self.arms)
        if len(names) == 2:  # two arms draw as they always have: a seeded bench repeats
            return tuple(reversed(names)) if self._rng.random() < 0.5 else tuple(names)
        self._rng.shuffle(names)
        return tuple(names)

    def run_level(
        self, concurrency: int = 0, rate: float | None = None
    ) -> tuple[LevelRecord, list[PairRecord]]:
        """One level: closed loop at `concurrency`, or open loop at `rate` per second."""
        order = self._order()
        runs: dict[str, ArmRun] = {}
        spent: dict[str, float | None] = {}
        limit = self.plan.requests
        arrivals = (
            poisson_arrivals(limit or 0, rate, self.plan.burstiness, self.params.seed)
            if rate is not None
            else []
        )
        for position, arm in enumerate(order):
            timed_first = position == 0 and self.plan.duration_s is not None
            self.progress.phase(f"r={rate:g} {arm}" if rate else f"c={concurrency} {arm}", limit)
            before = self.meter.reading()
            if rate is not None:
                runs[arm] = drive_open(
                    self.arms[arm],
                    lambda i: self.request(i, self.pair_id(concurrency, i, rate=rate)),
                    arrivals,
                    on_done=self.progress.advance,
                )
            else:
                runs[arm] = drive_arm(
                    self.arms[arm],
                    lambda i: self.request(i, self.pair_id(concurrency, i)),
                    concurrency,
                    limit=None if timed_first else limit,
                    deadline_s=self.plan.duration_s if timed_first else None,
                    on_done=self.progress.advance,
                )
            spent[arm] = self.meter.spent(before)
            if timed_first:  # the other arm sends exactly the requests this one sent
                limit = len(runs[arm].results)
        records = []
        for arm in self.speculative:
            roles: tuple[Arm, Arm] = (
                ("baseline", "speculative")
                if order.index(BASELINE_ARM) < order.index(arm)
                else ("speculative", "baseline")
            )
            for index, (base, spec) in enumerate(
                zip(runs[BASELINE_ARM].results, runs[arm].results, strict=True)
            ):
                prompt = self.prompts[index % len(self.prompts)]
                records.append(
                    PairRecord(
                        pair_id=self.pair_id(concurrency, index, arm, rate),
                        run_id=self.run_id,
                        prompt=prompt,
                        started_at=min(base.started_at, spec.started_at),
                        arm_order=roles,
                        baseline=base.result,
                        speculative=spec.result,
                        scores=score_pair(prompt, base.result, spec.result),
                        sampling_seed=self.params.seed + index,
                        temperature=self.params.temperature,
                        arm=arm,
                        group_id=self.pair_id(concurrency, index, rate=rate),
                    )
                )
        level = LevelRecord(
            concurrency=concurrency,
            arm_order=order,
            pair_ids=tuple(r.pair_id for r in records),
            windows={arm: runs[arm].window for arm in order},
            rate=rate,
            serving=self._serving(runs, spent, records),
        )
        log.info(
            "bench.level_done",
            concurrency=concurrency,
            requests=len(runs[BASELINE_ARM].results),
            wall_s={arm: round(window.wall_s, 3) for arm, window in level.windows.items()},
        )
        return level, records

    def _serving(
        self,
        runs: Mapping[str, ArmRun],
        spent: Mapping[str, float | None],
        records: Sequence[PairRecord],
    ) -> dict[str, Any]:
        """Each arm's serving figures at a level; useful tokens are those of the pairs
        (of that arm; for the baseline, of the switch's arm) that passed quality."""
        passed = {r.pair_id for r in records if passed_quality(r)}
        first = next(iter(self.speculative))
        useful = {
            arm: sum(
                (r.baseline if arm == BASELINE_ARM else r.speculative).output_tokens
                for r in records
                if r.pair_id in passed and r.arm == (first if arm == BASELINE_ARM else arm)
            )
            for arm in runs
        }
        return {
            arm: serving_figures(
                [t.result for t in run.results],
                run.window.wall_s,
                slo=self.plan.slo,
                resource_s=spent.get(arm),
                resource_unit=self.meter.unit,
                useful_tokens=useful[arm],
            )
            for arm, run in runs.items()
        }

    def section(
        self, levels: Sequence[LevelRecord], resources: Mapping[str, Any]
    ) -> dict[str, Any]:
        plan = asdict(self.plan)
        plan["concurrency"] = list(self.plan.concurrency)
        plan["rates"] = list(self.plan.rates)
        plan["slo"] = self.plan.slo.as_json()
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
