"""A bf16 speculative arm against the fp32 baseline: how often greedy outputs diverge, and
how many of those divergences the quality gate calls numeric ties (issue #23).

On a bf16 GPU deployment the speculative arm verifies a batch of tokens through other
kernels than plain decoding, so greedy outputs part where the top two logits nearly tie.
This CPU has no such kernels, but it can run the arms in different precisions: the
baseline in float32 and, on the same prompts, greedy,
- `bf16-autoregressive`: plain decoding in bfloat16 — what the precision alone does;
- `bf16-prompt-lookup`: prompt-lookup speculation in bfloat16 — precision and verification;
- and, from the same outputs, `bf16-prompt-lookup vs bf16-autoregressive`: both arms in
  bfloat16, as a deployment runs them, judged by the bfloat16 model — only verification
  (several tokens scored in one forward pass, other matrix shapes, other rounding)
  separates them: the CPU's closest analogue of the kernel ties the issue describes.

Every pair goes through canaryd's own pair runner, so each first divergent token is judged
by the float32 baseline model exactly as the daemon judges it (`divergence_margin`: the
baseline's log-probability of its own token minus that of the arm's). Reported per arm:
pairs, identical outputs, divergences, ties (margin ≤ `gates.quality.tie_margin_nats`),
real divergences (beyond it), unjudged ones, and the margins' quantiles.

bf16 rounds weights as well as activations, a larger change than kernel order alone, so
these rates bound what a bf16 deployment's kernels do from above rather than measure it.

Usage: .venv/bin/python benchmarks/bf16_ties.py [--model embedded|DIR] [--per-category N]
       [--max-tokens T] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from canaryd.pairs.runner import PairParams, PairRunner
from canaryd.pairs.suites import load_default_suites
from canaryd.paths import models_dir
from canaryd.scoring import score_pair
from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.hf import TransformersEngine
from gates import GatesConfig
from gates.records import PairRecord, Prompt

BASELINE = "fp32-autoregressive"
# The deployment's own case: both arms in bf16, speculation against plain decoding.
SAME_PRECISION = "bf16-prompt-lookup vs bf16-autoregressive"
ARMS: dict[str, SpeculativeConfig | None] = {
    "bf16-autoregressive": None,
    "bf16-prompt-lookup": SpeculativeConfig(method="prompt_lookup"),
}


def prompts_per_category(n: int) -> list[Prompt]:
    """The first `n` prompts of every category of the shipped suites, interleaved."""
    by_category: dict[str, list[Prompt]] = {}
    for suite in load_default_suites():
        for prompt in suite.prompts:
            by_category.setdefault(prompt.category, []).append(prompt)
    rounds = [[ps[i] for ps in by_category.values() if i < len(ps)] for i in range(n)]
    return [prompt for round_ in rounds for prompt in round_]


def judge(records: list[PairRecord], tie_margin: float) -> dict[str, Any]:
    """Identical, tie, real and unjudged greedy pairs of one arm, with the margins."""
    scored = [r for r in records if r.baseline.ok and r.speculative.ok and r.scores is not None]
    diverged = [r for r in scored if not r.scores.exact_match]  # type: ignore[union-attr]
    margins = [
        m
        for r in diverged
        if r.scores is not None and (m := r.scores.divergence_margin) is not None
    ]
    ties = sum(1 for m in margins if m <= tie_margin)
    real = len(margins) - ties
    pairs = len(scored)

    def share(count: int) -> float | None:
        return round(count / pairs, 4) if pairs else None

    return {
        "pairs": pairs,
        "failed": len(records) - pairs,
        "identical": pairs - len(diverged),
        "diverged": len(diverged),
        "ties": ties,
        "real": real,
        "unjudged": len(diverged) - len(margins),
        "diverged_rate": share(len(diverged)),
        "tie_rate": share(ties),
        "real_rate": share(real),
        "margin_quantiles": (
            [round(q, 4) for q in statistics.quantiles(margins, n=4)]
            if len(margins) >= 2
            else [round(m, 4) for m in margins]
        ),
        "margin_max": round(max(margins), 4) if margins else None,
        "first_divergence_median": (
            statistics.median(
                d
                for r in diverged
                if r.scores is not None and (d := r.scores.first_divergence) is not None
            )
            if diverged
            else None
        ),
    }


def run(model: str, per_category: int, max_tokens: int, device: str = "cpu") -> dict[str, Any]:
    tie_margin = GatesConfig().quality.tie_margin_nats
    prompts = prompts_per_category(per_category)
    baseline = TransformersEngine(
        TransformersEngineConfig(model=model, device=device, dtype="float32"),
        models_dir=models_dir(),
    )
    engines: dict[str, TransformersEngine] = {}
    started = time.perf_counter()
    try:
        baseline.load()
        for name, spec in ARMS.items():
            config = TransformersEngineConfig(
                model=model, device=device, dtype="bfloat16", speculative=spec
            )
            engines[name] = TransformersEngine(config, models_dir=models_dir())
            engines[name].load()
        runner = PairRunner(
            baseline,
            dict(engines),
            run_id="bf16-ties",
            params=PairParams(max_tokens=max_tokens),
            seed=23,
        )
        records: dict[str, list[PairRecord]] = {name: [] for name in ARMS}
        same_precision: list[PairRecord] = []
        plain = engines["bf16-autoregressive"]
        for prompt in prompts:
            group = runner.run_group(prompt)
            for record in group.records:
                records[record.arm].append(record)
            # Both arms in bf16, as a deployment runs them: the lookup arm against the bf16
            # plain arm, judged by the bf16 model (the daemon's teacher is the baseline).
            base, lookup = group.record("bf16-autoregressive"), group.record("bf16-prompt-lookup")
            same_precision.append(
                replace(
                    lookup,
                    baseline=base.speculative,
                    scores=score_pair(
                        prompt, base.speculative, lookup.speculative, tie_judge=plain
                    ),
                )
            )
        records[SAME_PRECISION] = same_precision
    finally:
        for engine in [baseline, *engines.values()]:
            engine.close()
    return {
        "model": model,
        "device": device,
        "baseline": BASELINE,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "tie_margin_nats": tie_margin,
        "arms": {name: judge(rs, tie_margin) for name, rs in records.items()},
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['prompts']} greedy prompts, {result['max_tokens']} tokens, baseline "
        f"{result['baseline']}, tie margin {result['tie_margin_nats']:g} nats "
        f"({result['elapsed_s']:.0f}s)",
        f"  {'arm':<44}{'pairs':>6}{'same':>6}{'diverged':>9}{'ties':>6}{'real':>6}"
        f"{'unjudged':>9}  margins (quartiles; max)",
    ]
    for name, row in result["arms"].items():
        lines.append(
            f"  {name:<44}{row['pairs']:>6}{row['identical']:>6}{row['diverged']:>9}"
            f"{row['ties']:>6}{row['real']:>6}{row['unjudged']:>9}  "
            f"{row['margin_quantiles']}; {row['margin_max']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="embedded", help="'embedded' or a model directory")
    parser.add_argument("--per-category", type=int, default=6, help="prompts per category")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result = run(args.model, args.per_category, args.max_tokens, args.device)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(result), file=sys.stdout)


if __name__ == "__main__":
    main()
