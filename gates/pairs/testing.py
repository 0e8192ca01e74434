"""Builders of pair records with chosen figures, for tests and benchmarks.

`record(i)` is pair number `i` of a healthy greedy window, started `i` × `PAIR_SPACING`
after `T0`: both arms succeed, the speculative arm twice as fast, the outputs identical.
Every figure a test cares about is a keyword (`result(...)` for an arm, `scores(...)` for
the pair's scores); the rest keep the defaults, so a test states only what it is about.
Pure like the rest of `gates`: no clock, no I/O, nothing from `canaryd`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engine.types import (
    ErrorKind,
    GenerationResult,
    InterTokenLatency,
    Message,
    SpeculativeStats,
)
from gates.records import DEFAULT_ARM, PairRecord, PairScores, PairSource, Prompt

T0 = datetime(2025, 1, 1, tzinfo=UTC)
PAIR_SPACING = timedelta(seconds=10)


def at(index: int) -> datetime:
    """When pair number `index` started: `index` × 10 s after T0."""
    return T0 + index * PAIR_SPACING


def result(
    e2e: float = 1.0,
    *,
    ok: bool = True,
    ttft: float | None = 0.1,
    tpot: float | None = 0.02,
    output_tokens: int = 40,
    verify_steps: int | None = None,
    itl_p99: float | None = None,
) -> GenerationResult:
    """One arm's result; `verify_steps` makes it a speculative result with acceptance data,
    `itl_p99` gives it an inter-token latency summary with that P99 (its median `tpot`)."""
    if not ok:
        return GenerationResult.failed(ErrorKind.HTTP, "injected", e2e, http_status=503)
    stats = None
    if verify_steps is not None:
        accepted = output_tokens - verify_steps
        stats = SpeculativeStats(verify_steps, accepted * 2, accepted, (accepted,))
    return GenerationResult(
        text="x",
        token_ids=(1,),
        finish_reason="stop",
        prompt_tokens=5,
        output_tokens=output_tokens,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        speculative=stats,
        itl=None
        if itl_p99 is None
        else InterTokenLatency(
            output_tokens - 1, output_tokens - 1, tpot or 0.0, itl_p99, itl_p99, itl_p99
        ),
    )


def scores(
    *,
    exact: bool = True,
    delta: float | None = 0.0,
    spec_loop: bool = False,
    base_loop: bool = False,
    margin: float | None = None,
    first_divergence: int = 0,
) -> PairScores:
    """A pair's scores; `delta` None: the prompt has no check, so no task scores.
    `first_divergence` is the first differing token of a pair that is not `exact`."""
    return PairScores(
        exact_match=exact,
        first_divergence=None if exact else first_divergence,
        token_edit_similarity=1.0,
        rouge_l=1.0,
        chrf=100.0,
        length_ratio=1.0,
        baseline_loop=base_loop,
        speculative_loop=spec_loop,
        baseline_task_score=None if delta is None else 0.5,
        speculative_task_score=None if delta is None else 0.5 + delta,
        task_score_delta=delta,
        divergence_margin=margin,
    )


def record(
    index: int,
    *,
    baseline: GenerationResult | None = None,
    speculative: GenerationResult | None = None,
    pair_scores: PairScores | None = None,
    scored: bool = True,
    category: str = "qa",
    temperature: float = 0.0,
    prompt: Prompt | None = None,
    pair_id: str | None = None,
    run_id: str = "test",
    started_at: datetime | None = None,
    source: PairSource = "control",
    arm: str = DEFAULT_ARM,
    group_id: str = "",
    sampling_seed: int = 0,
) -> PairRecord:
    """Pair number `index` (id `p{index}`), started at `at(index)`, on a one-message
    prompt of `category`. A pair whose arms both succeed gets `pair_scores` (by default
    `scores()`), unless `scored` is False; a pair with a failed arm has none."""
    baseline = baseline or result()
    speculative = speculative or result(0.5)
    if not (scored and baseline.ok and speculative.ok):
        pair_scores = None
    elif pair_scores is None:
        pair_scores = scores()
    return PairRecord(
        pair_id=f"p{index}" if pair_id is None else pair_id,
        run_id=run_id,
        prompt=prompt or Prompt(f"{category}-1", category, (Message("user", "hi"),), 64),
        started_at=at(index) if started_at is None else started_at,
        arm_order=("baseline", "speculative"),
        baseline=baseline,
        speculative=speculative,
        scores=pair_scores,
        sampling_seed=sampling_seed,
        temperature=temperature,
        arm=arm,
        group_id=group_id,
        source=source,
    )
