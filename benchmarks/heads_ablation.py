"""The draft-heads ablation: causally dependent (Hydra-style) against independent
(Medusa-style) heads, each as a chain and as a tree, against autoregressive decoding.

Every prompt goes greedily to five arms of the embedded model in a seeded random order,
so machine noise hits them alike: the autoregressive baseline and `draft_heads` with
causal / independent heads, chain / tree. Heads come from `canaryd models train-heads`
(run it first). The prompts are a stratified sample of the shipped prompts the heads
did not train on (their held-out split; `--prompts all` samples every shipped prompt,
whose greedy openings the heads have seen). Per arm:

- acceptance length: tokens per target forward pass as the engine counts it (pooled
  over prompts, the prefill step included), and the distribution of per-step
  acceptance lengths over drafting steps (mean, p50, p90);
- acceptance per position (accepted / offered at depth d) and per category;
- speed: tokens/s, speedup over the baseline (pooled, median per prompt, per category),
  TPOT p50 / p99;
- cost: drafting's share of the loop's time, verify time per step, drafts verified per
  step (every branch), the heads' extra memory; and outputs that differ from the
  baseline (0: lossless).

`--quick` (a few minutes on 2 cores): 2 prompts per category, 48 tokens each.

Usage: .venv/bin/python benchmarks/heads_ablation.py [--quick] [--out FILE]
       [--tree 3,2,2,1] [--nodes 12] [--prompts held-out|all]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from canaryd import paths
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites, select
from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.errors import EngineError
from engine.heads.data import SeedPrompt, split_prompts
from engine.heads.model import read_metadata, trained_heads_location
from engine.hf import TransformersEngine
from engine.types import GenerationRequest, GenerationResult, SamplingParams
from gates.records import Prompt

CHAIN = (1, 1, 1, 1)


def arm_configs(tree: SpeculativeConfig) -> dict[str, SpeculativeConfig | None]:
    arms: dict[str, SpeculativeConfig | None] = {"autoregressive": None}
    for kind, causal in (("causal", True), ("independent", False)):
        arms[f"{kind}-chain"] = SpeculativeConfig(
            method="draft_heads", causal=causal, tree_topk=CHAIN, max_tree_nodes=len(CHAIN)
        )
        arms[f"{kind}-tree"] = SpeculativeConfig(
            method="draft_heads",
            causal=causal,
            tree_topk=tree.heads_tree,
            max_tree_nodes=tree.max_tree_nodes,
        )
    return arms


def held_out(prompts: list[Prompt], models_dir: Path | None = None) -> list[Prompt]:
    """The shipped prompts the trained heads held out, split as training split them
    (the embedded model's heads in `models_dir`, default canaryd's models directory)."""
    location = paths.models_dir() if models_dir is None else models_dir
    directory, _identity = trained_heads_location("embedded", location, "causal")
    metadata = read_metadata(directory)
    if metadata is None:
        sys.exit("heads_ablation: no trained heads: run `canaryd models train-heads` first")
    data = metadata.training["plan_details"]["data"]
    seeds = [SeedPrompt(p.category, p.messages) for p in prompts]
    _train, test = split_prompts(seeds, data["held_out"], data["seed"])
    return [prompts[i] for i in test]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class ArmFigures:
    """Everything one arm produced, accumulated over prompts."""

    results: list[tuple[str, GenerationResult]] = field(default_factory=list)

    def add(self, category: str, result: GenerationResult) -> None:
        self.results.append((category, result))

    def step_lengths(self) -> list[float]:
        """Acceptance length of every drafting step (prefill excluded), from the
        per-position counts: steps that kept exactly j drafts emit j + 1 tokens."""
        lengths: list[float] = []
        for _category, result in self.results:
            stats = result.speculative
            if stats is None:
                continue
            kept = list(stats.accepted_per_position)
            drafting = stats.verify_steps - 1
            exactly = [drafting - (kept[0] if kept else 0)]
            exactly += [kept[j - 1] - kept[j] for j in range(1, len(kept))]
            exactly += [kept[-1]] if kept else []
            for j, count in enumerate(exactly):
                lengths.extend([j + 1.0] * count)
        return lengths

    def summary(self, baseline: ArmFigures | None) -> dict[str, Any]:
        results = [r for _c, r in self.results if r.ok]
        tokens = sum(r.output_tokens for r in results)
        seconds = sum(r.e2e_s for r in results)
        out: dict[str, Any] = {
            "prompts": len(results),
            "output_tokens": tokens,
            "tokens_per_s": tokens / seconds if seconds else None,
            "tpot_p50_s": percentile([r.tpot_s for r in results if r.tpot_s], 0.5),
            "tpot_p99_s": percentile([r.tpot_s for r in results if r.tpot_s], 0.99),
        }
        if baseline is not None:
            out |= self._speed_against(baseline)
        stats = [r.speculative for r in results if r.speculative is not None]
        if not stats:
            return out
        steps = sum(s.verify_steps for s in stats)
        accepted = sum(s.accepted_tokens for s in stats)
        depth = max(len(s.accepted_per_position) for s in stats)
        kept = [sum(s.accepted_per_position[d] for s in stats) for d in range(depth)]
        offered = [sum(s.drafted_per_position[d] for s in stats) for d in range(depth)]
        lengths = self.step_lengths()
        costs = [r.draft_cost for r in results if r.draft_cost is not None]
        draft_s = sum(c.draft_s for c in costs)
        verify_s = sum(c.verify_s for c in costs)
        out |= {
            "acceptance_length": 1 + accepted / steps,
            "step_acceptance_mean": statistics.fmean(lengths) if lengths else None,
            "step_acceptance_p50": percentile(lengths, 0.5),
            "step_acceptance_p90": percentile(lengths, 0.9),
            "acceptance_per_position": [
                k / o if o else None for k, o in zip(kept, offered, strict=True)
            ],
            "acceptance_length_by_category": self._by_category(),
            "draft_share": draft_s / (draft_s + verify_s) if draft_s + verify_s else None,
            "draft_s_per_step": draft_s / max(steps - len(stats), 1),
            "verify_s_per_step": verify_s / steps,
            "tree_tokens_per_step": sum(c.tree_tokens for c in costs) / max(steps - len(stats), 1),
        }
        return out

    def _by_category(self) -> dict[str, float]:
        pooled: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for category, result in self.results:
            if result.ok and result.speculative is not None:
                pooled[category][0] += result.output_tokens
                pooled[category][1] += result.speculative.verify_steps
        return {c: tokens / steps for c, (tokens, steps) in sorted(pooled.items())}

    def _speed_against(self, baseline: ArmFigures) -> dict[str, Any]:
        ratios: dict[str, list[float]] = defaultdict(list)
        different = 0
        base_total = own_total = 0.0
        for (category, own), (_c, base) in zip(self.results, baseline.results, strict=True):
            if not (own.ok and base.ok):
                continue
            different += own.token_ids != base.token_ids
            ratios[category].append(base.e2e_s / own.e2e_s)
            base_total += base.e2e_s
            own_total += own.e2e_s
        every = [r for values in ratios.values() for r in values]
        return {
            "speedup": base_total / own_total if own_total else None,
            "speedup_median": statistics.median(every) if every else None,
            "speedup_by_category": {c: statistics.median(v) for c, v in sorted(ratios.items())},
            "outputs_differing_from_baseline": different,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 prompts per category")
    parser.add_argument("--per-category", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--prompts", choices=("held-out", "all"), default="held-out")
    parser.add_argument("--tree", default=None, help="tree_topk, e.g. 3,2,2,1 (default: shipped)")
    parser.add_argument("--nodes", type=int, default=None, help="max_tree_nodes")
    # One intra-op thread: on a shared 2-core machine a second thread stalls every step.
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    per_category = args.per_category or (2 if args.quick else 6)
    max_tokens = args.max_tokens or (48 if args.quick else 128)

    shape: dict[str, Any] = {"method": "draft_heads"}
    if args.tree:
        shape["tree_topk"] = tuple(int(k) for k in args.tree.split(","))
    if args.nodes:
        shape["max_tree_nodes"] = args.nodes
    tree = SpeculativeConfig(**shape)
    engines: dict[str, TransformersEngine] = {}
    for name, spec in arm_configs(tree).items():
        config = TransformersEngineConfig(speculative=spec, warmup_tokens=4)
        engines[name] = TransformersEngine(config, models_dir=paths.models_dir())
        try:
            engines[name].load()
        except EngineError as exc:
            sys.exit(f"heads_ablation: {exc}")
    prompts = select(load_default_suites(), None)
    if args.prompts == "held-out":
        prompts = held_out(prompts)
    categories = sorted({p.category for p in prompts})
    chosen = StratifiedSampler(prompts, seed=7).take(per_category * len(categories))
    figures = {name: ArmFigures() for name in engines}
    rng = random.Random(11)
    started = time.perf_counter()
    for index, prompt in enumerate(chosen, start=1):
        request = GenerationRequest(
            messages=prompt.messages, sampling=SamplingParams(max_tokens=max_tokens)
        )
        order = list(engines)
        rng.shuffle(order)
        for name in order:
            figures[name].add(prompt.category, engines[name].generate(request))
        print(f"{index}/{len(chosen)} prompts, {time.perf_counter() - started:.0f} s", flush=True)
    baseline = figures["autoregressive"]
    report: dict[str, Any] = {
        "config": {
            "prompts": len(chosen),
            "prompt_set": args.prompts,
            "max_tokens": max_tokens,
            "threads": torch.get_num_threads(),
            "chain": list(CHAIN),
            "tree_topk": list(tree.heads_tree),
            "max_tree_nodes": tree.max_tree_nodes,
            "seconds": round(time.perf_counter() - started, 1),
        },
        "arms": {},
    }
    for name, engine in engines.items():
        summary = figures[name].summary(None if name == "autoregressive" else baseline)
        if "draft_bytes" in engine.identity:
            summary["heads_bytes"] = int(engine.identity["draft_bytes"])
        report["arms"][name] = summary
    arms = report["arms"]
    report["causal_over_independent"] = {
        shape: arms[f"causal-{shape}"]["acceptance_length"]
        / arms[f"independent-{shape}"]["acceptance_length"]
        for shape in ("chain", "tree")
    }
    report["goals"] = goals(report)
    print_table(report)
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)


# The ablation's goals: dependent heads' acceptance length at least this many times the
# independent heads' at the same tree budget, and at least this long with trees.
GOAL_CAUSAL_RATIO = 1.2
GOAL_CAUSAL_TREE_LENGTH = 2.0


def goals(report: dict[str, Any]) -> dict[str, Any]:
    """Each goal with the measured figure and whether it was met."""
    ratio = report["causal_over_independent"]["tree"]
    length = report["arms"]["causal-tree"]["acceptance_length"]
    return {
        "causal_over_independent_tree": {
            "goal": GOAL_CAUSAL_RATIO,
            "measured": ratio,
            "met": ratio >= GOAL_CAUSAL_RATIO,
        },
        "causal_tree_acceptance_length": {
            "goal": GOAL_CAUSAL_TREE_LENGTH,
            "measured": length,
            "met": length >= GOAL_CAUSAL_TREE_LENGTH,
        },
    }


def print_table(report: dict[str, Any]) -> None:
    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    print(
        f"{'arm':<18}{'accept len':>11}{'p50':>6}{'p90':>6}{'tok/s':>8}{'speedup':>9}"
        f"{'draft %':>9}{'tree/step':>10}{'per position':>30}"
    )
    for name, arm in report["arms"].items():
        positions = " ".join(fmt(p, ".2f") for p in arm.get("acceptance_per_position", []))
        print(
            f"{name:<18}{fmt(arm.get('acceptance_length'), '.2f'):>11}"
            f"{fmt(arm.get('step_acceptance_p50'), '.0f'):>6}"
            f"{fmt(arm.get('step_acceptance_p90'), '.0f'):>6}"
            f"{fmt(arm.get('tokens_per_s'), '.1f'):>8}{fmt(arm.get('speedup'), '.2f'):>9}"
            f"{fmt(arm.get('draft_share') and 100 * arm['draft_share'], '.0f'):>9}"
            f"{fmt(arm.get('tree_tokens_per_step'), '.1f'):>10}{positions:>30}"
        )
    ratios = report["causal_over_independent"]
    print(
        f"causal / independent acceptance length: chain {ratios['chain']:.2f}x, "
        f"tree {ratios['tree']:.2f}x"
    )
    for name, goal in report["goals"].items():
        verdict = "met" if goal["met"] else "NOT met"
        print(f"goal {name}: {goal['measured']:.2f} vs {goal['goal']:g} — {verdict}")


if __name__ == "__main__":
    main()
