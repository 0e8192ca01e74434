"""The GPU proof: canaryd's device paths end to end on one accelerator, in one command.

Three parts, each through canaryd's own code, written to one JSON file (after every
part, so a run cut short keeps what it measured) and printed as tables:

1. **A tiny model, no downloads.** A small random-weight Llama built in code
   (`engine.testing.chaotic_llama`), saved as a transformers directory, with draft heads
   of both kinds trained on it on the device by the code behind `canaryd models
   train-heads`. Six arms (autoregressive, prompt lookup, causal and independent heads
   each as a chain and as a tree) run through the transformers engine and the pair
   runner, greedily: every arm must equal the autoregressive output token for token
   (`lossless`). Timings are the engine's own; the cost of one forward pass over 1, 4,
   16 and 64 new tokens is measured against one token; memory and utilisation come from
   canaryd's resource monitor (NVML), which on a host without a GPU says "no GPU".
2. **The embedded model** (`--model-dir`: canaryd's models directory holding it; skipped
   when it is absent). The same arms on SmolLM2-135M's real weights, heads trained on
   the device (the quick plan) when the directory holds none, on the prompts the heads
   held out: per category speedup, acceptance length and drafting's share of the loop,
   beside the CPU figures of docs/engines.md.
3. **A bounded daemon run.** `canaryd run` as a subprocess on the tiny model and the
   same device, with SQLite, for `--daemon-seconds` after its first pair: a baseline, a
   draft-heads arm and a deliberately broken arm (prompt lookup under logit noise, the
   switch's arm) whose gates must trip the rollback switch. The stored rows are counted
   and checked against each other.

Parts run in the order 1, 3, 2: the embedded model's part is the longest and needs the
model. Exit 0 when every check passes, 1 when one fails, 2 on a usage error.

Usage: python benchmarks/gpu_proof.py [--device cuda|cpu] [--quick] [--model-dir DIR]
       [--parts 1,2,3] [--dtype float32] [--daemon-seconds S] [--out FILE]
How to run it on a GPU machine without network: docs/gpu-proof.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as transformers_logging

from benchmarks.gpu_proof_arms import AUTOREGRESSIVE, resources, run_arms
from benchmarks.gpu_proof_daemon import DaemonRun, DaemonSetup, daemon_checks, print_daemon
from benchmarks.heads_ablation import held_out
from canaryd.bench.resources import ResourceMonitor
from canaryd.logs import configure_logging
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites, select
from engine.errors import EngineError, ModelNotFoundError
from engine.heads.data import DataPlan, SeedPrompt, split_prompts
from engine.heads.model import read_metadata, trained_heads_location
from engine.heads.train import QUICK, TrainPlan, train_model_heads, with_depth
from engine.provision import require_embedded_model
from engine.testing import chaotic_llama
from gates.records import Prompt

SCHEMA = "canaryd.gpu_proof/1"
TINY_DIR = "tiny-llama"
HEADS_DEPTH = 4

# docs/engines.md, "Measured on this 2-core CPU": the heads ablation after the full
# training (float32, one thread, 27 held-out prompts, 96 tokens) and the adaptive
# prompt-lookup comparison (median speedup per category, k = 8). docs/gpu-proof.md: the
# verify-step cost of this script's `verify_cost` on the embedded model there (the mean
# of two runs).
CPU_REFERENCE: dict[str, Any] = {
    "source": "docs/engines.md (2-core CPU, float32, one thread)",
    "arms": {
        "causal-chain": {"acceptance_length": 1.44, "speedup": 0.86, "draft_share": 0.05},
        "causal-tree": {"acceptance_length": 1.71, "speedup": 0.69, "draft_share": 0.05},
        "independent-chain": {"acceptance_length": 1.27, "speedup": 0.79, "draft_share": 0.03},
        "independent-tree": {"acceptance_length": 1.43, "speedup": 0.61, "draft_share": 0.02},
    },
    "by_category": {
        "causal-tree": {
            "translation": {"acceptance_length": 1.39},
            "code": {"acceptance_length": 2.07},
            "math": {"acceptance_length": 2.27},
        },
        "causal-chain": {"code": {"speedup": 1.03}, "math": {"speedup": 1.02}},
        "prompt-lookup": {
            "extraction": {"speedup": 1.00},
            "summarisation": {"speedup": 1.76},
            "qa": {"speedup": 1.01},
        },
    },
    "verify_cost_relative": {"1": 1.0, "4": 1.8, "16": 2.3, "64": 4.5},
}


@dataclass(frozen=True)
class Sizes:
    """How much each part does: `--quick` (a CPU test) or the full device run."""

    tiny_prompts: int
    train_per_category: int  # training holds one out per category: at least 2
    max_tokens: int
    heads_epochs: int
    verify_repeats: int
    daemon_seconds: float
    gate_interval_s: float
    embedded_per_category: int
    embedded_max_tokens: int


QUICK_SIZES = Sizes(4, 2, 12, 6, 3, 3.0, 1.0, 1, 32)
FULL_SIZES = Sizes(24, 4, 64, 12, 20, 60.0, 5.0, 3, 96)


# -- part 1: the tiny model -------------------------------------------------------------


def fitting_prompts(tokenizer: Any, context: int, max_tokens: int) -> list[Prompt]:
    """The shipped prompts whose chat-formatted tokens plus `max_tokens` fit `context`."""
    fitting = []
    for prompt in select(load_default_suites(), None):
        chat = [{"role": m.role, "content": m.content} for m in prompt.messages]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) + max_tokens <= context:
            fitting.append(prompt)
    return fitting


def tiny_heads_plan(sizes: Sizes) -> TrainPlan:
    """Heads that learn the tiny model's own greedy continuations of their prompts."""
    return TrainPlan(
        name="gpu-proof",
        data=DataPlan(temperatures=(0.0,), max_new_tokens=sizes.max_tokens, batch_size=64),
        depth=HEADS_DEPTH,
        layers=2,
        vocab_limit=512,
        epochs=sizes.heads_epochs,
        patience=sizes.heads_epochs,
        learning_rate=2e-2,
        weight_decay=0.0,
        prompt_weight=0.0,
    )


@dataclass(frozen=True)
class TinyModel:
    """The tiny model saved for the engines (and the daemon), its heads trained."""

    model_dir: Path
    models_dir: Path
    categories: list[str]
    prompts: list[Prompt]  # the measured ones, all among the heads' training prompts
    facts: dict[str, Any]


def prepare_tiny(device: str, sizes: Sizes, work: Path) -> TinyModel:
    """Build and save the tiny model, and train both kinds of heads for it on `device`."""
    model, tokenizer = chaotic_llama(seed=0)
    model_dir = work / TINY_DIR
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    models_dir = work / "models"
    context = int(model.config.max_position_embeddings)
    fitting = fitting_prompts(tokenizer, context, sizes.max_tokens)
    categories = sorted({p.category for p in fitting})
    training = StratifiedSampler(fitting, seed=7).take(sizes.train_per_category * len(categories))
    seeds = [SeedPrompt(p.category, p.messages) for p in training]
    plan = tiny_heads_plan(sizes)
    began = time.perf_counter()
    saved = train_model_heads(str(model_dir), models_dir, seeds, plan, device=device)
    train_seconds = time.perf_counter() - began
    # Training holds prompts out; the arms run on prompts the heads trained on, so that
    # drafts get accepted, deep ones too (a smoke of the paths, not a forecast).
    trained, _held_out = split_prompts(seeds, plan.data.held_out, plan.data.seed)
    return TinyModel(
        model_dir=model_dir,
        models_dir=models_dir,
        categories=categories,
        prompts=[training[i] for i in trained][: sizes.tiny_prompts],
        facts={
            "model": {
                "kind": "chaotic_llama (random weights, built in code)",
                "parameters": sum(p.numel() for p in model.parameters()),
                "context": context,
            },
            "heads_training": {
                "seconds": round(train_seconds, 2),
                "prompts": len(seeds),
                "chain_acceptance_held_out": {
                    kind: meta.training["chain_acceptance"] for kind, meta in saved.items()
                },
            },
        },
    )


def part_tiny(tiny: TinyModel, device: str, dtype: str, sizes: Sizes) -> dict[str, Any]:
    """Part 1: the six arms on the tiny model, with the device's resources."""
    with ResourceMonitor() as monitor:
        result = run_arms(
            str(tiny.model_dir),
            tiny.models_dir,
            device,
            dtype,
            tiny.prompts,
            sizes.max_tokens,
            sizes.verify_repeats,
        )
    return {**tiny.facts, **result, "resources": resources(monitor)}


# -- part 2: the embedded model ---------------------------------------------------------


def embedded_heads(models_dir: Path, device: str, train: bool) -> dict[str, Any]:
    """The embedded model's heads in `models_dir`: trained here on `device` (the quick
    plan of `canaryd models train-heads`) when there are none or `train` asks."""
    directory, _identity = trained_heads_location("embedded", models_dir, "causal")
    heads: dict[str, Any] = {"trained_here": False}
    if train or read_metadata(directory) is None:
        seeds = [
            SeedPrompt(p.category, p.messages) for s in load_default_suites() for p in s.prompts
        ]
        began = time.perf_counter()
        train_model_heads(
            "embedded", models_dir, seeds, with_depth(QUICK, HEADS_DEPTH), device=device
        )
        heads = {"trained_here": True, "seconds": round(time.perf_counter() - began, 1)}
    metadata = read_metadata(directory)
    assert metadata is not None  # trained above when missing
    return heads | {
        "plan": metadata.training.get("plan"),
        "created_at": metadata.created_at,
        "chain_acceptance_held_out": metadata.training.get("chain_acceptance"),
    }


def part_embedded(
    device: str, dtype: str, sizes: Sizes, models_dir: Path, train: bool
) -> dict[str, Any]:
    """Part 2: the six arms on the embedded model's held-out prompts, or why not."""
    try:
        require_embedded_model(models_dir)
    except ModelNotFoundError as exc:
        return {"skipped": f"no embedded model in {models_dir}: {exc}"}
    heads = embedded_heads(models_dir, device, train)
    prompts = held_out(select(load_default_suites(), None), models_dir)
    categories = sorted({p.category for p in prompts})
    chosen = StratifiedSampler(prompts, seed=7).take(sizes.embedded_per_category * len(categories))
    with ResourceMonitor() as monitor:
        result = run_arms(
            "embedded",
            models_dir,
            device,
            dtype,
            chosen,
            sizes.embedded_max_tokens,
            sizes.verify_repeats,
        )
    return {
        "heads": heads,
        **result,
        "resources": resources(monitor),
        "cpu_reference": CPU_REFERENCE,
    }


# -- the report -------------------------------------------------------------------------


def arm_checks(part: str, result: dict[str, Any], device: str) -> dict[str, bool]:
    checks = {f"{part}_{name}_lossless": arm["lossless"] for name, arm in result["arms"].items()}
    checks[f"{part}_on_device"] = str(result["engine_device"]).startswith(device.split(":")[0])
    if device.startswith("cuda"):
        checks[f"{part}_gpu_measured"] = result["resources"]["gpu_status"] == "measured"
    return checks


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_arms(title: str, result: dict[str, Any], cpu_verify: dict[str, float] | None) -> None:
    print(f"\n{title}: {result['prompts']} prompts, {result['max_tokens']} tokens, "
          f"on {result['engine_device']}, {result['seconds']} s")  # fmt: skip
    print(f"{'arm':<19}{'lossless':>9}{'accept len':>11}{'tok/s':>9}{'speedup':>9}"
          f"{'draft %':>8}{'verify s/step':>14}")  # fmt: skip
    for name, arm in result["arms"].items():
        share = arm.get("draft_share")
        print(
            f"{name:<19}{'yes' if arm['lossless'] else 'NO':>9}"
            f"{fmt(arm.get('acceptance_length'), '.2f'):>11}"
            f"{fmt(arm.get('tokens_per_s'), '.1f'):>9}"
            f"{fmt(arm.get('speedup'), '.2f'):>9}{fmt(share and 100 * share, '.0f'):>8}"
            f"{fmt(arm.get('verify_s_per_step'), '.4f'):>14}"
        )
    verify = result["verify_cost"]["relative"]
    widths = "  ".join(
        f"{w} tok {r:.2f}x"
        + (f" (CPU {cpu_verify[w]:g}x)" if cpu_verify and w in cpu_verify else "")
        for w, r in verify.items()
    )
    print(f"verify step vs one token ({result['verify_cost']['context_tokens']} cached): {widths}")
    print(f"GPU: {result['resources']['gpu_status']}")


def print_categories(result: dict[str, Any]) -> None:
    """Per category and draft-head arm: speedup / acceptance length / draft share,
    with the CPU figure from docs beside it where docs give one."""
    here = result["engine_device"]
    print(f"\nper category ({here} | CPU from docs): speedup, acceptance length, draft %")
    reference = CPU_REFERENCE["by_category"]
    for name, arm in result["arms"].items():
        if name == AUTOREGRESSIVE:
            continue
        for category, row in arm["by_category"].items():
            cpu = reference.get(name, {}).get(category, {})
            share = row.get("draft_share")
            print(
                f"{name:<19}{category:<15}{fmt(row.get('speedup'), '.2f'):>6}"
                f" | {fmt(cpu.get('speedup'), '.2f'):>5}"
                f"{fmt(row.get('acceptance_length'), '.2f'):>8}"
                f" | {fmt(cpu.get('acceptance_length'), '.2f'):>5}"
                f"{fmt(share and 100 * share, '.0f'):>6}"
            )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--quick", action="store_true", help="a CPU test: seconds, not minutes")
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="canaryd's models directory (part 2)"
    )
    parser.add_argument(
        "--parts", default="1,2,3", help="which parts, e.g. 1,3 (part 2 needs --model-dir)"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        help="float32 (default: lossless is exact), bfloat16 (the CUDA deployment's)",
    )
    parser.add_argument("--train-heads", action="store_true", help="part 2: retrain heads")
    parser.add_argument("--daemon-seconds", type=float, default=None)
    # One intra-op thread on a CPU: on a shared 2-core machine a second stalls every step.
    parser.add_argument("--threads", type=int, default=1, help="CPU torch threads (0: default)")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def usage_error(args: argparse.Namespace) -> str | None:
    if args.device != "cpu" and not args.device.startswith("cuda"):
        return f"--device {args.device!r}: cuda, cuda:N or cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {args.device}, but torch sees no CUDA device"
    if not set(args.parts.split(",")) <= {"1", "2", "3"}:
        return f"--parts {args.parts!r}: a comma-separated choice of 1, 2, 3"
    return None


def device_facts(args: argparse.Namespace) -> dict[str, Any]:
    cuda = args.device.startswith("cuda")
    return {
        "requested": args.device,
        "name": torch.cuda.get_device_name(args.device)
        if cuda
        else platform.processor() or platform.machine(),
        "dtype": args.dtype,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def run_tiny_and_daemon(
    args: argparse.Namespace,
    parts: set[str],
    sizes: Sizes,
    report: dict[str, Any],
    save: Callable[[], None],
) -> None:
    """Parts 1 and 3, on one tiny model in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="canaryd-gpu-proof-") as scratch:
        work = Path(scratch)
        tiny = prepare_tiny(args.device, sizes, work)
        daemon = None
        if "3" in parts:
            setup = DaemonSetup(
                model_dir=tiny.model_dir,
                models_dir=tiny.models_dir,
                categories=tiny.categories,
                device=args.device,
                dtype=args.dtype,
                max_tokens=sizes.max_tokens,
                gate_interval_s=sizes.gate_interval_s,
                seconds=sizes.daemon_seconds,
                threads=args.threads,
            )
            daemon = DaemonRun(setup, work / "daemon")
            # --quick starts the daemon beside part 1: on a 2-core CPU its start-up then
            # uses the second core; a device run keeps them apart so that timings hold.
            if args.quick:
                daemon.start()
        if "1" in parts:
            report["tiny"] = part_tiny(tiny, args.device, args.dtype, sizes)
            report["checks"] |= arm_checks("tiny", report["tiny"], args.device)
            save()
            print_arms("part 1, tiny random model", report["tiny"], None)
        if daemon is not None:
            if not args.quick:
                daemon.start()
            report["daemon"] = daemon.finish()
            report["checks"] |= daemon_checks(report["daemon"], args.device)
            save()
            print_daemon(report["daemon"])


def run_embedded(args: argparse.Namespace, sizes: Sizes, report: dict[str, Any]) -> None:
    """Part 2, where the embedded model is."""
    if args.model_dir is None:
        report["embedded"] = {"skipped": "no --model-dir"}
        return
    embedded = part_embedded(args.device, args.dtype, sizes, args.model_dir, args.train_heads)
    report["embedded"] = embedded
    if "skipped" in embedded:
        print(f"\npart 2 skipped: {embedded['skipped']}")
        return
    report["checks"] |= arm_checks("embedded", embedded, args.device)
    print_arms("part 2, embedded model", embedded, CPU_REFERENCE["verify_cost_relative"])
    print_categories(embedded)


def main() -> int:
    args = parse_args()
    problem = usage_error(args)
    if problem is not None:
        print(f"gpu_proof: {problem}", file=sys.stderr)
        return 2
    configure_logging(level="WARNING")
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if args.daemon_seconds is not None:
        sizes = replace(sizes, daemon_seconds=args.daemon_seconds)
    parts = set(args.parts.split(","))
    started = time.perf_counter()
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "parts": sorted(parts),
        "device": device_facts(args),
        "checks": {},
    }

    def save() -> None:
        report["ok"] = all(report["checks"].values())
        report["seconds"] = round(time.perf_counter() - started, 1)
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    try:
        if parts & {"1", "3"}:
            run_tiny_and_daemon(args, parts, sizes, report, save)
        if "2" in parts:
            run_embedded(args, sizes, report)
    except EngineError as exc:
        report["error"] = str(exc)
        report["checks"]["engines_loaded"] = False
        print(f"gpu_proof: {exc}", file=sys.stderr)
    save()
    failed = [name for name, ok in report["checks"].items() if not ok]
    print(f"\nchecks: {len(report['checks']) - len(failed)} of {len(report['checks'])} pass"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
