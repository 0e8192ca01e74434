"""Shared error bursts against the error and liveness gates: how often does a burst that
hits both arms roll a healthy speculative arm back (issue #23)?

A real deployment has error bursts that are nobody's fault in particular: a gateway
restarts, a network path flaps, a shared node is drained. Inside one, each arm fails on
its own too, so a window-long comparison sees a cluster of speculative-only failures. The
full `gate_power` run found them to be the only false-trip source on its
`deployment_bf16` model (9 trips in 153,402 pairs, all by the error gate). It sees about
one burst per 5,000 pairs; this benchmark simulates thousands of them, each with the
production gates evaluated as the daemon does.

Each burst: `--calm-pairs` calm pairs (each arm failing on its own at the engine's 1 %
and timing out at 0.2 %, as `gate_power.DeploymentNoise`), then a burst of
Exponential(mean `burst_pairs`) pairs in which each arm also fails with probability
`burst_failure` independently of the other (the hardest case: in a real outage both arms
often fail on the same pair, which says nothing and is left out), then `--after-pairs`
calm pairs. From the burst's first pair to the last, every `--every` pairs (6: the
daemon's 60 s cadence at the 10 s design schedule), it evaluates:
- the error gate as configured (the shared-outage screen and the settle delay on);
- the error gate without them (`outage_spans = []`, `settle_pairs = 0`, and
  `lead_pairs = 0`: a failure right after the baseline's counts too): what the gate did
  before;
- the liveness gate.
A burst trips a gate if any evaluation FAILs it. Reported: trips per burst with a 95 %
Clopper–Pearson bound, and per 30 days at one burst per 5,000 pairs on the 10 s design
schedule (51.8 bursts per 30 days; 17.3 on the shipped 30 s schedule).

Usage: .venv/bin/python benchmarks/error_bursts.py [--quick] [--bursts N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.types import ErrorKind, GenerationResult, Message
from gates import GateDecision, GatesConfig, GateState, error_gate
from gates.config import ErrorGateConfig
from gates.pairs.liveness import liveness_gate
from gates.records import PairRecord, Prompt
from gates.stats.budget import DEFAULT_ARL0
from gates.stats.descriptive import clopper_pearson

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ENGINE_FAILURE = 0.01  # each arm's own error rate in gate_power's realistic model
TIMEOUT = 0.002  # DeploymentNoise.timeout_rate
BURST_RATE = 1.0 / 5_000  # DeploymentNoise.burst_rate
BURST_PAIRS = 30.0  # DeploymentNoise.burst_pairs
BURST_FAILURE = 0.3  # DeploymentNoise.burst_failure
PAIRS_PER_30_DAYS = 30 * 86_400 / 10.0  # the budget's design schedule: a pair every 10 s
PROMPT = Prompt("qa-1", "qa", (Message("user", "hi"),), 64)
OK = GenerationResult(
    text="x",
    token_ids=(1,),
    finish_reason="stop",
    prompt_tokens=5,
    output_tokens=40,
    ttft_s=0.1,
    tpot_s=0.02,
    e2e_s=1.0,
)
FAILED = GenerationResult.failed(ErrorKind.HTTP, "burst", 1.0, http_status=503)


def arm_fails(rng: random.Random, in_burst: bool) -> bool:
    if rng.random() < ENGINE_FAILURE:
        return True
    if in_burst and rng.random() < BURST_FAILURE:
        return True
    return rng.random() < TIMEOUT


def burst_records(rng: random.Random, calm: int, after: int) -> tuple[list[PairRecord], int, int]:
    """The pairs around one burst, its first pair's index and its length."""
    length = max(1, round(rng.expovariate(1.0 / BURST_PAIRS)))
    records = []
    for i in range(calm + length + after):
        in_burst = calm <= i < calm + length
        base, spec = arm_fails(rng, in_burst), arm_fails(rng, in_burst)
        records.append(
            PairRecord(
                pair_id=f"p{i}",
                run_id="bursts",
                prompt=PROMPT,
                started_at=T0 + timedelta(seconds=10 * i),
                arm_order=("baseline", "speculative"),
                baseline=FAILED if base else OK,
                speculative=FAILED if spec else OK,
                scores=None,
            )
        )
    return records, calm, length


Judge = Callable[[list[PairRecord], datetime], GateDecision]


def tripped(records: list[PairRecord], start: int, every: int, judge: Judge) -> bool:
    return any(
        judge(records[:n], records[n - 1].started_at).state is GateState.FAIL
        for n in range(start + 1, len(records) + 1, every)
    )


def rate(trips: int, bursts: int, bursts_per_30_days: float) -> dict[str, Any]:
    _, upper = clopper_pearson(trips, bursts, 0.95)
    return {
        "trips": trips,
        "per_burst": trips / bursts,
        "per_burst_upper95": upper,
        "trips_per_30_days": trips / bursts * bursts_per_30_days,
        "trips_per_30_days_upper95": upper * bursts_per_30_days,
    }


def run(
    bursts: int, *, calm_pairs: int = 2_000, after_pairs: int = 60, every: int = 6, seed: int = 0
) -> dict[str, Any]:
    """Simulate `bursts` bursts and judge each as the daemon would; the report."""
    config = GatesConfig()
    unscreened = config.error.model_copy(
        update={"outage_spans": (), "settle_pairs": 0, "lead_pairs": 0}
    )

    def judge_error(cfg: ErrorGateConfig) -> Judge:
        return lambda records, now: error_gate(records, cfg, now=now, arl0=DEFAULT_ARL0)

    def judge_liveness(records: list[PairRecord], now: datetime) -> GateDecision:
        return liveness_gate(records, config.liveness, now=now, arl0=DEFAULT_ARL0)

    rng = random.Random(seed)
    counts = {"error": 0, "error_unscreened": 0, "liveness": 0}
    lengths = []
    began = time.perf_counter()
    for _ in range(bursts):
        records, start, length = burst_records(rng, calm_pairs, after_pairs)
        lengths.append(length)
        counts["error"] += tripped(records, start, every, judge_error(config.error))
        counts["error_unscreened"] += tripped(records, start, every, judge_error(unscreened))
        counts["liveness"] += tripped(records, start, every, judge_liveness)
    per_30_days = PAIRS_PER_30_DAYS * BURST_RATE
    return {
        "bursts": bursts,
        "burst_pairs_mean": sum(lengths) / bursts,
        "burst_pairs_max": max(lengths),
        "bursts_per_30_days": per_30_days,
        "evaluate_every_pairs": every,
        "calm_pairs_before": calm_pairs,
        "gates": {name: rate(n, bursts, per_30_days) for name, n in counts.items()},
        "config": {
            "outage_spans": list(config.error.outage_spans),
            "outage_alpha": config.error.outage_alpha,
            "outage_margin_pairs": config.error.outage_margin_pairs,
            "settle_pairs": config.error.settle_pairs,
            "max_consecutive_failures": config.liveness.max_consecutive_failures,
        },
        "elapsed_s": round(time.perf_counter() - began, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 bursts (about 2 minutes)")
    parser.add_argument("--bursts", type=int, default=None, help="default 3,000 (300 --quick)")
    parser.add_argument("--calm-pairs", type=int, default=2_000, help="before each burst")
    parser.add_argument("--after-pairs", type=int, default=60, help="judged after each burst")
    parser.add_argument("--every", type=int, default=6, help="pairs between evaluations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report = run(
        args.bursts or (300 if args.quick else 3_000),
        calm_pairs=args.calm_pairs,
        after_pairs=args.after_pairs,
        every=args.every,
        seed=args.seed,
    )
    print(
        f"{report['bursts']} bursts (mean {report['burst_pairs_mean']:.1f} pairs), "
        f"{report['elapsed_s']:.0f} s"
    )
    for name, figures in report["gates"].items():
        print(
            f"  {name:17s} trips {figures['trips']:5d}  per burst {figures['per_burst']:.5f} "
            f"(95 % ≤ {figures['per_burst_upper95']:.5f})  per 30 days "
            f"{figures['trips_per_30_days']:.3f} "
            f"(95 % ≤ {figures['trips_per_30_days_upper95']:.3f})"
        )
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
