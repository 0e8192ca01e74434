"""A soak harness for judging the gates on the product's own pairs: the real pair runner
over fault-injecting fake engines on the shipped prompts, evaluated the way the daemon
does (every few pairs, on the configured windows, then a step of the switch policy).

A test module that runs many pairs imports `_quiet_pair_logs` (an autouse fixture) so
that the runner's per-pair info logs do not slow it down.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import pytest
import structlog

from canaryd.pairs.runner import PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
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
from gates.pairs.testing import at
from gates.records import PairRecord, Prompt


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
