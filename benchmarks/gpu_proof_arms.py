"""The GPU proof's arms: every decoding method on the same prompts through canaryd's
transformers engine and pair runner, whether each equalled autoregressive decoding token
for token, their figures overall and per category, and what a verify step costs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.heads_ablation import ArmFigures, arm_configs
from canaryd.bench.resources import NOT_MEASURED, ResourceMonitor
from canaryd.pairs.runner import PairParams, PairRunner
from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.heads.decode import _keep_path
from engine.heads.model import cache_argument
from engine.hf import TransformersEngine, _load_shared, _release_shared
from gates.records import Prompt

AUTOREGRESSIVE = "autoregressive"
VERIFY_WIDTHS = (1, 4, 16, 64)
VERIFY_CONTEXT = 128  # cached tokens in front of a verify step


def speculative_arms() -> dict[str, SpeculativeConfig]:
    """Prompt lookup and the four draft-head arms of the heads ablation."""
    heads = arm_configs(SpeculativeConfig(method="draft_heads"))
    arms = {"prompt-lookup": SpeculativeConfig(method="prompt_lookup")}
    arms |= {name: spec for name, spec in heads.items() if spec is not None}
    return arms


def per_category(arm: ArmFigures, baseline: ArmFigures | None) -> dict[str, dict[str, Any]]:
    """Speedup, acceptance length and draft share of `arm` in each category."""
    out: dict[str, dict[str, Any]] = {}
    for category in sorted({c for c, _r in arm.results}):
        own, base = ArmFigures(), ArmFigures()
        for index, (c, result) in enumerate(arm.results):
            if c == category:
                own.add(c, result)
                if baseline is not None:
                    base.add(c, baseline.results[index][1])
        summary = own.summary(base if baseline is not None else None)
        out[category] = {
            key: summary.get(key) for key in ("speedup", "acceptance_length", "draft_share")
        }
    return out


@dataclass
class Outcome:
    """What the arms produced on the same prompts: figures, and per arm how many
    outputs differed from the autoregressive one, the baseline model's log-probability
    margin at each first divergent token (small: a numeric tie), and how many
    generations failed."""

    figures: dict[str, ArmFigures]
    differing: dict[str, int]
    margins: dict[str, list[float | None]]
    failed: dict[str, int]
    seconds: float

    def lossless(self, name: str) -> bool:
        return self.differing[name] == 0 and self.failed[name] == 0 == self.failed[AUTOREGRESSIVE]


def compare_arms(
    engines: dict[str, TransformersEngine], prompts: list[Prompt], max_tokens: int
) -> Outcome:
    """Every prompt through the pair runner, the autoregressive arm as its baseline,
    greedy, arms in a seeded random order."""
    runner = PairRunner(
        engines[AUTOREGRESSIVE],
        {name: engine for name, engine in engines.items() if name != AUTOREGRESSIVE},
        run_id="gpu-proof",
        params=PairParams(max_tokens=max_tokens),
        seed=7,
    )
    outcome = Outcome(
        figures={name: ArmFigures() for name in engines},
        differing=dict.fromkeys(engines, 0),
        margins={name: [] for name in engines},
        failed=dict.fromkeys(engines, 0),
        seconds=0.0,
    )
    started = time.perf_counter()
    for prompt in prompts:
        group = runner.run_group(prompt)
        outcome.figures[AUTOREGRESSIVE].add(prompt.category, group.baseline)
        outcome.failed[AUTOREGRESSIVE] += not group.baseline.ok
        for record in group.records:
            outcome.figures[record.arm].add(prompt.category, record.speculative)
            outcome.failed[record.arm] += not record.speculative.ok
            if record.speculative.token_ids != group.baseline.token_ids:
                outcome.differing[record.arm] += 1
                scores = record.scores
                margin = scores.divergence_margin if scores is not None else None
                outcome.margins[record.arm].append(margin)
    outcome.seconds = time.perf_counter() - started
    return outcome


def run_arms(
    model: str,
    models_dir: Path,
    device: str,
    dtype: str,
    prompts: list[Prompt],
    max_tokens: int,
    verify_repeats: int,
) -> dict[str, Any]:
    """Every arm on `prompts`: figures per arm, whether it equalled the autoregressive
    arm, and the cost of verify steps on the same weights."""
    engines: dict[str, TransformersEngine] = {}
    try:
        for name, spec in {AUTOREGRESSIVE: None, **speculative_arms()}.items():
            config = TransformersEngineConfig(
                model=model, device=device, dtype=dtype, speculative=spec, warmup_tokens=4
            )
            engines[name] = TransformersEngine(config, models_dir=models_dir)
            engines[name].load()
        outcome = compare_arms(engines, prompts, max_tokens)
        baseline = outcome.figures[AUTOREGRESSIVE]
        arms: dict[str, Any] = {}
        for name, engine in engines.items():
            reference = None if name == AUTOREGRESSIVE else baseline
            arms[name] = outcome.figures[name].summary(reference) | {
                "lossless": outcome.lossless(name),
                "outputs_differing": outcome.differing[name],
                "divergence_margins": outcome.margins[name],
                "failed": outcome.failed[name],
                "by_category": per_category(outcome.figures[name], reference),
            }
            if "draft_bytes" in engine.identity:
                arms[name]["heads_bytes"] = int(engine.identity["draft_bytes"])
        identity = engines[AUTOREGRESSIVE].identity
        shared = _load_shared(model, device, dtype, models_dir)
        try:
            verify = verify_cost(shared.model, VERIFY_WIDTHS, verify_repeats)
        finally:
            _release_shared((model, device, dtype))
    finally:
        for engine in engines.values():
            engine.close()
    return {
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "engine_device": identity["device"],
        "seconds": round(outcome.seconds, 2),
        "arms": arms,
        "verify_cost": verify,
    }


def verify_cost(model: Any, widths: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """Seconds of one forward pass over `width` new tokens behind a cache of
    `VERIFY_CONTEXT` tokens, the median of `repeats` after 2 warm-ups (the cache is cut
    back after each, as the heads loop cuts rejected drafts), and each width's cost
    relative to one token."""
    from transformers import DynamicCache

    device = model.get_output_embeddings().weight.device
    generator = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    cache_arg = cache_argument(model)
    prefix = torch.randint(vocab, (1, VERIFY_CONTEXT), generator=generator).to(device)

    def synchronise() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def forward(ids: torch.Tensor, cache: Any) -> torch.Tensor:
        """The heads loop's target pass, with logits at every position as assisted
        generation computes them."""
        kwargs = {cache_arg: cache, "use_cache": True}
        hidden = model.base_model(ids, **kwargs).last_hidden_state
        logits: torch.Tensor = model.get_output_embeddings()(hidden)
        return logits

    seconds: dict[str, float] = {}
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        forward(prefix, cache)
        for width in widths:
            ids = torch.randint(vocab, (1, width), generator=generator).to(device)
            timings = []
            for attempt in range(repeats + 2):
                synchronise()
                began = time.perf_counter()
                forward(ids, cache)
                synchronise()
                if attempt >= 2:
                    timings.append(time.perf_counter() - began)
                _keep_path(cache, VERIFY_CONTEXT, [])
            seconds[str(width)] = statistics.median(timings)
    one = seconds[str(widths[0])]
    return {
        "context_tokens": VERIFY_CONTEXT,
        "repeats": repeats,
        "seconds": seconds,
        "relative": {width: value / one for width, value in seconds.items()},
    }


def resources(monitor: ResourceMonitor) -> dict[str, Any]:
    """The monitor's summary, with `gpu_status`: "measured", or "no GPU (why)"."""
    summary = monitor.summary()
    measured = summary["gpu"] != NOT_MEASURED
    summary["gpu_status"] = "measured" if measured else f"no GPU ({summary['gpu_reason']})"
    return summary
