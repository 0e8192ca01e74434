"""Distributional equivalence under sampling: does the quality gate catch a speculative
arm that changes what the model says, and leave a lossless one alone?

The embedded model samples at temperature 0.8 with short outputs. Every prompt (drawn by
the daemon's stratified sampler) goes to three arms in a random order, each arm with its
own seed as the daemon sends them (`prompts.seed_per_arm`; `--no-seed-per-arm`: one seed):
the baseline, a healthy prompt-lookup arm, the same arm with `fault = "greedy_verify"`
(drafts verified by argmax match while sampling: lossy); then to the same arm with
`fault = "garbage_sampling"` (each verified token replaced by a random one with probability
`--garbage-rate`, the nonsense a real vLLM n-gram arm emitted at temperature 0.8, #27).
The garbage arm stops at its first FAIL. Each speculative
output is paired with that one baseline output and scored as the pair runner scores
sampled pairs — the baseline engine is the teacher (`nll_delta`, `argmax_delta`) — so
the two comparisons share the baseline's generation and its teacher pass. After every
prompt the quality gate (default budget) is evaluated on each arm's pairs so far, one
pair every 10 s of gate time.

`--quick` stops at the lossy arm's first FAIL or after `QUICK_PAIRS` (150) prompts,
whatever the machine's speed: enough for every arm to decide (the lossy arm's detection
delays were 43-67 pairs; the healthy arm leaves NODATA at `min_samples` = 100), about
13 minutes at 5 CPU-seconds a prompt (the garbage arm stops at its own first FAIL).
The full run measures the detection delay over several episodes (the lossy arm's
detectors restart after each FAIL) while the healthy arm runs on; it reports the
healthy arm's false alarms, and how many alarms its own argmax deltas raise at a
test-sized budget (h = log 50 per CUSUM), against the Lorden bound for that budget.

Writes {"healthy": {"state", "pairs", ...}, "lossy": {"state", "pairs", "pairs_to_fail",
"failed_by", ...}, "garbage": {... the same}} to `--out` and prints it; `failed_by` names
the checks that FAILed first.

Usage: .venv/bin/python benchmarks/sampling_equivalence.py [--quick] [--out FILE]
       [--pairs N] [--budget-s S] [--no-seed-per-arm]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch

from canaryd import paths
from canaryd.config import PromptsConfig
from canaryd.pairs.runner import arm_seed
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites, select
from canaryd.scoring import score_pair
from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.hf import TransformersEngine
from engine.types import GenerationRequest, GenerationResult, Message, SamplingParams, TeacherScore
from gates import GateState, quality_gate
from gates.config import QualityGateConfig
from gates.pairs.distribution import (
    ONE_SIDED_CUSUMS,
    joint_scores,
    shiryaev_roberts,
    sign_flip_increments,
)
from gates.records import PairRecord, Prompt
from gates.stats.budget import DEFAULT_ARL0
from gates.stats.sequential import lorden_threshold

TEMPERATURE = 0.8
T0 = datetime(2026, 1, 1, tzinfo=UTC)
COMPONENTS = ("quality.argmax", "quality.distribution")
TEST_SIZED_ARL0 = 50.0  # per one-sided CUSUM, for the healthy calibration replay
QUICK_PAIRS = 150  # --quick's bound: a count of prompts, not a wall time


class MemoTeacher:
    """The baseline engine as teacher, remembering its last scores: both comparisons of
    a prompt score the same baseline output, one forward pass is enough."""

    def __init__(self, engine: TransformersEngine) -> None:
        self.engine = engine
        self._memo: dict[tuple[tuple[Message, ...], tuple[int, ...]], TeacherScore | None] = {}

    def score(self, messages: tuple[Message, ...], output: GenerationResult) -> TeacherScore | None:
        key = (messages, output.token_ids)
        if key not in self._memo:
            if len(self._memo) > 8:
                self._memo.clear()
            self._memo[key] = self.engine.score(messages, output)
        return self._memo[key]

    # The rest of the Engine protocol, delegated.
    @property
    def identity(self) -> dict[str, str]:
        return self.engine.identity

    @property
    def speculative(self) -> bool:
        return self.engine.speculative

    def load(self) -> None:
        self.engine.load()

    def generate(self, request: GenerationRequest) -> GenerationResult:
        return self.engine.generate(request)

    def count_tokens(self, text: str) -> list[int]:
        return self.engine.count_tokens(text)

    def close(self) -> None:
        self.engine.close()


@dataclass
class Arm:
    """One speculative arm's pairs and what its quality gate said about them."""

    name: str
    engine: TransformersEngine
    records: list[PairRecord] = field(default_factory=list)  # the current episode
    total_pairs: int = 0
    state: GateState = GateState.NODATA
    components: dict[str, str] = field(default_factory=dict)
    tripped_by: str | None = None
    fails: list[int] = field(default_factory=list)  # pairs to each FAIL, per episode
    argmax_deltas: list[float] = field(default_factory=list)
    nll_deltas: list[float] = field(default_factory=list)
    # (argmax delta, NLL delta) of the pairs with an argmax delta: what quality.argmax bets on
    scored: list[tuple[float, float | None]] = field(default_factory=list)

    def add(self, record: PairRecord, config: QualityGateConfig) -> bool:
        """Add a pair, evaluate the gate; True when it FAILs (the episode restarts)."""
        n = len(self.records)
        self.records.append(record_at(record, n))
        self.total_pairs += 1
        if record.scores is not None:
            if record.scores.argmax_delta is not None:
                self.argmax_deltas.append(record.scores.argmax_delta)
                self.scored.append((record.scores.argmax_delta, record.scores.nll_delta))
            if record.scores.nll_delta is not None:
                self.nll_deltas.append(record.scores.nll_delta)
        decision = quality_gate(
            self.records, config, now=T0 + timedelta(seconds=10 * (n + 1)), arl0=DEFAULT_ARL0
        )
        self.state = decision.state
        self.components = {c.name: c.state.value for c in decision.components}
        if decision.state is not GateState.FAIL:
            return False
        failing = [c.name for c in decision.components if c.state is GateState.FAIL]
        self.tripped_by = self.tripped_by or ", ".join(failing)
        self.fails.append(len(self.records))
        self.records = []
        return True


def record_at(record: PairRecord, index: int) -> PairRecord:
    """Gate time is pair time at the design interval, whatever the CPU took."""
    return replace(record, started_at=T0 + timedelta(seconds=10 * index))


def deltas(record: PairRecord) -> dict[str, Any]:
    scores = record.scores
    return {
        "category": record.prompt.category,
        "argmax_delta": None if scores is None else scores.argmax_delta,
        "nll_delta": None if scores is None else scores.nll_delta,
    }


def speculative_engine(fault: str | None, rate: float = 0.5) -> TransformersEngine:
    # Unigram lookup drafts at almost every step, so verification decides most tokens.
    spec = SpeculativeConfig(
        method="prompt_lookup",
        num_draft_tokens=8,
        max_ngram_size=1,
        fault=fault,  # checked by the model
        fault_rate=rate,
    )
    return TransformersEngine(
        TransformersEngineConfig(speculative=spec, warmup_tokens=0), models_dir=paths.models_dir()
    )


def run_prompt(
    prompt: Prompt,
    baseline: TransformersEngine,
    teacher: MemoTeacher,
    arms: list[Arm],
    max_tokens: int,
    rng: random.Random,
    tail: tuple[Arm, ...] = (),
    *,
    seed_per_arm: bool = False,
) -> dict[str, PairRecord]:
    """One prompt on the baseline and every arm (one seed, a random order), scored; the
    `tail` arms run after them in their own order, so that adding one leaves the random
    stream, and with it every other arm's pairs, as it was. With `seed_per_arm` each arm
    samples with its own seed, as the daemon does under `prompts.seed_per_arm`
    (`canaryd.pairs.runner.arm_seed`: the baseline keeps the pair's seed)."""
    seed = rng.randrange(2**31)
    request = GenerationRequest(
        messages=prompt.messages,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=TEMPERATURE, seed=seed),
        request_id=uuid.uuid4().hex,
        category=prompt.category,
    )
    engines: dict[str, TransformersEngine] = {"baseline": baseline}
    engines.update({arm.name: arm.engine for arm in arms})
    order = list(engines)
    rng.shuffle(order)
    order += [arm.name for arm in tail]
    engines.update({arm.name: arm.engine for arm in tail})
    results = {
        name: engines[name].generate(
            replace(request, sampling=replace(request.sampling, seed=arm_seed(seed, name)))
            if seed_per_arm
            else request
        )
        for name in order
    }
    base = results["baseline"]
    return {
        arm.name: PairRecord(
            pair_id=uuid.uuid4().hex,
            run_id=f"sampling-equivalence-{arm.name}",
            prompt=prompt,
            started_at=datetime.now(UTC),
            arm_order=(
                ("baseline", "speculative")
                if order.index("baseline") < order.index(arm.name)
                else ("speculative", "baseline")
            ),
            baseline=base,
            speculative=results[arm.name],
            scores=score_pair(prompt, base, results[arm.name], teacher=teacher),
            sampling_seed=seed,
            temperature=TEMPERATURE,
        )
        for arm in (*arms, *tail)
    }


def calibration_replay(pairs: list[tuple[float, float | None]], arl0: float) -> dict[str, Any]:
    """The healthy arm's own (argmax delta, NLL delta) pairs through quality.argmax's four
    sign-flip detectors (Shiryaev-Roberts, on `joint_scores`) at a test-sized budget (ARL0
    `arl0` each), restarting after each alarm: observed alarms against the most Lorden's
    bound allows."""
    h = lorden_threshold(arl0)
    alarms, start = 0, 0
    for end in range(1, len(pairs) + 1):
        window = pairs[start:end]
        scores = joint_scores([a for a, _ in window], [n for _, n in window])
        if any(
            shiryaev_roberts(sign_flip_increments(scores, bet), h).statistic >= h
            for bet in (0.5, 0.9, -0.5, -0.9)
        ):
            alarms, start = alarms + 1, end
    return {
        "h": round(h, 2),
        "pairs": len(pairs),
        "alarms": alarms,
        "lorden_bound": round(len(pairs) * 4 / arl0, 1),
    }


def summary(arm: Arm, lossy: bool, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "state": GateState.FAIL.value if arm.fails else arm.state.value,
        "pairs": arm.total_pairs,
        "components": arm.components,
        "mean_argmax_delta": round(statistics.fmean(arm.argmax_deltas), 4)
        if arm.argmax_deltas
        else None,
        "mean_nll_delta": round(statistics.fmean(arm.nll_deltas), 4) if arm.nll_deltas else None,
    }
    if lossy:
        out["pairs_to_fail"] = arm.fails[0] if arm.fails else None
        out["failed_by"] = arm.tripped_by
        out["tripped_by"] = arm.tripped_by  # the name before #27
        if full:
            out["detection_delays"] = arm.fails
            out["median_detection_delay"] = statistics.median(arm.fails) if arm.fails else None
    else:
        out["false_alarms"] = len(arm.fails)
        if full:
            out["false_alarms_per_pair_bound"] = f"Lorden: ≤ 1/{DEFAULT_ARL0:.3g} per detector"
            out["calibration_replay"] = calibration_replay(arm.scored, TEST_SIZED_ARL0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"one lossy FAIL, at most {QUICK_PAIRS} prompts"
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=None,
        help=f"prompts at most (default {QUICK_PAIRS} with --quick, else no bound)",
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--episodes", type=int, default=5, help="full run: lossy FAILs")
    parser.add_argument(
        "--garbage-rate", type=float, default=0.5, help="garbage_sampling's fault_rate"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds of pairs at most (default: none with --quick, else 7,200)",
    )
    # One intra-op thread: a 135M model decodes nearly as fast on one, and on a shared
    # 2-core machine a second thread stalls every step (measured: 8 prompts in 7 minutes
    # on two threads against 42 on one, with other jobs running).
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    parser.add_argument(
        "--seed-per-arm",
        action=argparse.BooleanOptionalAction,
        default=PromptsConfig().seed_per_arm,
        help="each arm samples with its own seed, as the daemon does under "
        "prompts.seed_per_arm (its default); --no-seed-per-arm: one seed for every arm",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--trace", type=Path, default=None, help="per-pair deltas, JSON lines")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    max_tokens = args.max_tokens
    budget_s = args.budget_s or (math.inf if args.quick else 7200.0)
    max_pairs = args.pairs or (QUICK_PAIRS if args.quick else None)
    episodes = 1 if args.quick else args.episodes
    config = QualityGateConfig()

    started, cpu_started = time.perf_counter(), time.process_time()
    baseline = TransformersEngine(
        TransformersEngineConfig(warmup_tokens=0), models_dir=paths.models_dir()
    )
    healthy = Arm("healthy", speculative_engine(None))
    lossy = Arm("lossy", speculative_engine("greedy_verify"))
    garbage = Arm("garbage", speculative_engine("garbage_sampling", args.garbage_rate))
    for engine in (baseline, healthy.engine, lossy.engine, garbage.engine):
        engine.load()
    teacher = MemoTeacher(baseline)
    sampler = StratifiedSampler(select(load_default_suites(), None), seed=3)
    rng = random.Random(5)
    trace = args.trace.open("w", buffering=1) if args.trace is not None else None
    loaded = time.perf_counter()
    while (
        time.perf_counter() - loaded < budget_s
        and len(lossy.fails) < episodes
        and (max_pairs is None or lossy.total_pairs < max_pairs)
    ):
        tail = () if garbage.fails else (garbage,)
        records = run_prompt(
            sampler.take(1)[0],
            baseline,
            teacher,
            [healthy, lossy],
            max_tokens,
            rng,
            tail,
            seed_per_arm=args.seed_per_arm,
        )
        healthy.add(records["healthy"], config)
        lossy.add(records["lossy"], config)
        if "garbage" in records:
            garbage.add(records["garbage"], config)
        if trace is not None:
            trace.write(json.dumps({name: deltas(record) for name, record in records.items()}))
            trace.write("\n")
        print(
            f"{lossy.total_pairs:4d} pairs {time.perf_counter() - loaded:6.0f} s  healthy "
            f"{healthy.state.value} {healthy.components}  lossy {lossy.state.value} "
            f"{lossy.components}  garbage {garbage.state.value} {garbage.components}",
            flush=True,
        )
    for engine in (baseline, healthy.engine, lossy.engine, garbage.engine):
        engine.close()
    if trace is not None:
        trace.close()
    full = not args.quick
    result = {
        "healthy": summary(healthy, lossy=False, full=full),
        "lossy": summary(lossy, lossy=True, full=full),
        "garbage": {**summary(garbage, lossy=True, full=False), "fault_rate": args.garbage_rate},
        "max_tokens": max_tokens,
        "temperature": TEMPERATURE,
        "seed_per_arm": args.seed_per_arm,
        "h": round(math.log(ONE_SIDED_CUSUMS * DEFAULT_ARL0), 2),
        "seconds": round(time.perf_counter() - started, 1),
        # CPU time of this process: the wall time on an otherwise idle machine.
        "cpu_seconds": round(time.process_time() - cpu_started, 1),
        "load_average": round(os.getloadavg()[0], 2),
        "load_seconds": round(loaded - started, 1),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
