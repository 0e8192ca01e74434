"""Shared builders for gate tests: pair records with chosen figures, and a soak harness
that drives the real pair runner over fault-injecting fake engines the way the daemon
does (evaluate every few pairs on the configured windows, then step the switch policy)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest
import structlog

from canaryd.pairs.runner import PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from engine.types import ErrorKind, GenerationResult, Message, SpeculativeStats
from gates import (
    Evaluation,
    GatesConfig,
    ReferenceStats,
    SwitchMode,
    SwitchState,
    Transition,
    evaluate_all,
    pin_reference,
    step,
)
from gates.records import PairRecord, PairScores, Prompt

T0 = datetime(2025, 1, 1, tzinfo=UTC)
PAIR_SPACING = timedelta(seconds=10)


def result(
    e2e: float = 1.0,
    *,
    ok: bool = True,
    ttft: float | None = 0.1,
    tpot: float | None = 0.02,
    output_tokens: int = 40,
    verify_steps: int | None = None,
) -> GenerationResult:
    """One arm's result; `verify_steps` makes it a speculative result with acceptance data."""
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
    )


def scores(
    *,
    exact: bool = True,
    delta: float | None = 0.0,
    spec_loop: bool = False,
    base_loop: bool = False,
    margin: float | None = None,
) -> PairScores:
    return PairScores(
        exact_match=exact,
        first_divergence=None if exact else 0,
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
    category: str = "qa",
    temperature: float = 0.0,
) -> PairRecord:
    """Pair number `index`, started `index` × 10 s after T0."""
    baseline = baseline or result()
    speculative = speculative or result(0.5)
    if pair_scores is None and baseline.ok and speculative.ok:
        pair_scores = scores()
    return PairRecord(
        pair_id=f"p{index}",
        run_id="test",
        prompt=Prompt(f"{category}-1", category, (Message("user", "hi"),), 64),
        started_at=T0 + index * PAIR_SPACING,
        arm_order=("baseline", "speculative"),
        baseline=baseline,
        speculative=speculative,
        scores=pair_scores if baseline.ok and speculative.ok else None,
        temperature=temperature,
    )


def at(index: int) -> datetime:
    return T0 + index * PAIR_SPACING


@dataclass(frozen=True)
class SoakResult:
    pairs_to_trip: int | None  # pairs generated after the fault began until the switch tripped
    transitions: tuple[Transition, ...]
    history: tuple[Evaluation, ...]
    state: SwitchState
    references: dict[str, ReferenceStats]


SPECULATIVE = FakeEngineConfig(speculative=True)
_PROMPTS: list[Prompt] = []


def default_prompts() -> list[Prompt]:
    if not _PROMPTS:
        _PROMPTS.extend(p for suite in load_default_suites() for p in suite.prompts)
    return _PROMPTS


def healthy_records(seed: int, n: int) -> list[PairRecord]:
    """`n` healthy pairs from the real pair runner over fake engines, 10 s apart."""
    return run_pairs(seed, n, SPECULATIVE, start=0)


def run_pairs(seed: int, n: int, speculative: FakeEngineConfig, *, start: int) -> list[PairRecord]:
    sampler = StratifiedSampler(default_prompts(), seed=seed + start)
    runner = PairRunner(
        FakeEngine(FakeEngineConfig(seed=seed)),
        FakeEngine(speculative.model_copy(update={"seed": seed})),
        run_id=f"soak-{seed}-{start}",
        seed=seed + start,
    )
    return [replace(runner.run_pair(sampler.next()), started_at=at(start + i)) for i in range(n)]


def soak(
    prefix: Sequence[PairRecord],
    *,
    seed: int,
    fault: FakeEngineConfig | None = None,
    fault_pairs: int = 0,
    config: GatesConfig | None = None,
    every: int = 25,
    pin_pairs: int = 900,
    evaluate_from: int = 0,
    stop_at_trip: bool = True,
) -> SoakResult:
    """Run the gates and the switch policy over `prefix` (healthy pairs already made),
    then over `fault_pairs` pairs from the `fault` speculative engine, as the daemon would:
    every `every` pairs (from pair `evaluate_from` on) all gates are evaluated on the pairs
    that cover the longest window, and the policy is stepped; the drift references are
    pinned from the first `pin_pairs` pairs. Time is simulated: 10 s per pair."""
    config = config or GatesConfig()
    sections = (config.liveness, config.error, config.latency, config.quality, config.speedup)
    longest = max(c.window_pairs or 0 for c in (*sections, config.drift))
    records: list[PairRecord] = []
    history: list[Evaluation] = []
    transitions: list[Transition] = []
    state = SwitchState()
    references: dict[str, ReferenceStats] = {}
    pairs_to_trip: int | None = None
    faulty: list[PairRecord] = []
    if fault is not None and fault_pairs:
        faulty = run_pairs(seed, fault_pairs, fault, start=len(prefix))
    for index, pair in enumerate([*prefix, *faulty]):
        records.append(pair)
        if index + 1 == pin_pairs:
            references = pin_reference(records)
        if index < evaluate_from or (index + 1) % every:
            continue
        now = at(index)
        decisions = evaluate_all(records[-longest:], config, now=now, references=references)
        history.append(Evaluation(now, tuple(decisions)))
        outcome = step(state, history[-20:], config.policy, now=now)
        state = outcome.state
        transitions.extend(outcome.transitions)
        if state.mode is SwitchMode.ROLLED_BACK and pairs_to_trip is None:
            pairs_to_trip = index + 1 - len(prefix)
            if stop_at_trip:
                break
    return SoakResult(pairs_to_trip, tuple(transitions), tuple(history), state, references)


def replace_seed(engine: FakeEngineConfig, seed: int) -> FakeEngineConfig:
    return engine.model_copy(update={"seed": seed})


@pytest.fixture(autouse=True)
def _quiet_pair_logs() -> Iterator[None]:
    """The pair runner logs every pair at info; thousands of them only slow the soak."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield
