"""Distributional equivalence under sampling: does the quality gate catch a speculative
arm that changes what the model says, and leave a lossless one alone?

The embedded model runs at temperature 0.8 with short outputs through the real pair
runner (which has the baseline engine score both arms' outputs, `nll_delta`): once
against a healthy prompt-lookup arm and once against the same arm with
`fault = "greedy_verify"` (drafts accepted by argmax match while sampling). After every
pair the quality gate is evaluated on the pairs so far; the healthy arm must not FAIL,
and `pairs_to_fail` is the first pair at which the lossy arm FAILs.

Writes {"healthy": {"state", "pairs", ...}, "lossy": {"state", "pairs", "pairs_to_fail",
...}} to `--out` and prints it. `--quick` (≤ 8 minutes on 2 cores) runs fewer pairs.

Usage: .venv/bin/python benchmarks/sampling_equivalence.py [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from canaryd import paths
from canaryd.runner import PairParams, PairRunner
from canaryd.sampling import StratifiedSampler
from canaryd.suites import load_default_suites, select
from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.hf import TransformersEngine
from gates import GateState, quality_gate
from gates.config import QualityGateConfig
from gates.records import PairRecord

TEMPERATURE = 0.8


def run_arm(
    fault: str | None, pairs: int, max_tokens: int, config: QualityGateConfig, budget_s: float
) -> dict[str, Any]:
    """Pairs against one speculative arm until `pairs`, the time budget, or a FAIL."""
    # Unigram lookup drafts at almost every step, so verification decides most tokens.
    spec_cfg = SpeculativeConfig(
        method="prompt_lookup", num_draft_tokens=8, max_ngram_size=1, fault=fault
    )
    models = paths.models_dir()
    base = TransformersEngine(TransformersEngineConfig(warmup_tokens=0), models_dir=models)
    spec = TransformersEngine(
        TransformersEngineConfig(speculative=spec_cfg, warmup_tokens=0), models_dir=models
    )
    runner = PairRunner(
        base,
        spec,
        run_id=f"sampling-equivalence-{fault or 'healthy'}",
        params=PairParams(temperature=TEMPERATURE, max_tokens=max_tokens, timeout_s=None),
        seed=5,
    )
    prompts = select(load_default_suites(), None)
    sampler = StratifiedSampler(prompts, seed=3)
    base.load()  # loading is not part of the time budget
    spec.load()
    records: list[PairRecord] = []
    state, pairs_to_fail, detail = GateState.NODATA, None, ""
    started = time.perf_counter()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    while len(records) < pairs and time.perf_counter() - started < budget_s:
        record = runner.run_pair(sampler.take(1)[0])
        # Gate time is pair time at the design interval, whatever the CPU took.
        records.append(replace(record, started_at=t0 + timedelta(seconds=10 * len(records))))
        decision = quality_gate(records, config, now=t0 + timedelta(seconds=10 * len(records)))
        component = next((c for c in decision.components if c.name == "quality.distribution"), None)
        if component is not None:
            state, detail = component.state, component.detail
        if state is GateState.FAIL and pairs_to_fail is None:
            pairs_to_fail = len(records)
            if fault is not None:
                break
    base.close()
    spec.close()
    deltas = [d for r in records if r.scores is not None and (d := r.scores.nll_delta) is not None]
    out: dict[str, Any] = {
        "state": state.value,
        "pairs": len(records),
        "scored_pairs": len(deltas),
        "mean_nll_delta": round(statistics.fmean(deltas), 4) if deltas else None,
        "sd_nll_delta": round(statistics.stdev(deltas), 4) if len(deltas) > 1 else None,
        "seconds": round(time.perf_counter() - started, 1),
        "detail": detail,
    }
    if fault is not None:
        out["pairs_to_fail"] = pairs_to_fail
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="≤ 8 minutes on 2 cores")
    parser.add_argument("--pairs", type=int, default=None, help="per arm")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--margin", type=float, default=None, help="distribution_margin (nats); default config"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    pairs = args.pairs or (150 if args.quick else 400)
    budget_s = 200.0 if args.quick else 3600.0  # per arm
    margin = {} if args.margin is None else {"distribution_margin": args.margin}
    config = QualityGateConfig(**margin)
    result = {
        "healthy": run_arm(None, pairs, args.max_tokens, config, budget_s),
        "lossy": run_arm("greedy_verify", pairs, args.max_tokens, config, budget_s),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
