"""canaryd's transformers engine against raw `model.generate`, side by side in one run.

For each prompt (a stratified sample of the shipped suites) the same greedy request is
run four ways, interleaved so that machine noise hits all of them alike:
raw baseline `generate`, canaryd baseline engine, raw prompt-lookup `generate`, canaryd
prompt-lookup engine. Reported:

- overhead ratio = canaryd engine time / raw generate time, per mode (goal ≤ 1.03);
- prompt-lookup speedup per category = median over prompts of baseline / speculative
  end-to-end time, as canaryd's engine measures it.

Usage: .venv/bin/python benchmarks/engine_overhead.py [--per-category 3] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from canaryd import paths
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites, select
from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.hf import TransformersEngine, _load_shared
from engine.types import GenerationRequest, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--draft-tokens", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    prompts = select(load_default_suites(), None)
    categories = sorted({p.category for p in prompts})
    sample = StratifiedSampler(prompts, seed=11).take(args.per_category * len(categories))

    spec_cfg = SpeculativeConfig(method="prompt_lookup", num_draft_tokens=args.draft_tokens)
    base = TransformersEngine(TransformersEngineConfig(), models_dir=paths.models_dir())
    spec = TransformersEngine(
        TransformersEngineConfig(speculative=spec_cfg), models_dir=paths.models_dir()
    )
    base.load()
    spec.load()
    shared = _load_shared("embedded", "auto", "auto", paths.models_dir())
    model, tokenizer = shared.model, shared.tokenizer

    def raw_generate(request: GenerationRequest, speculative: bool) -> float:
        chat = [{"role": m.role, "content": m.content} for m in request.messages]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        started = time.perf_counter()
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        extra = (
            {"prompt_lookup_num_tokens": args.draft_tokens, "max_matching_ngram_size": 2}
            if speculative
            else {}
        )
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.max_tokens,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                pad_token_id=tokenizer.eos_token_id,
                **extra,
            )
        return time.perf_counter() - started

    times: dict[str, list[float]] = defaultdict(list)
    speedups: dict[str, list[float]] = defaultdict(list)
    lengths: dict[str, list[float]] = defaultdict(list)
    for repeat in range(args.repeats):
        for prompt in sample:
            request = GenerationRequest(
                messages=prompt.messages, sampling=SamplingParams(max_tokens=args.max_tokens)
            )
            times["raw_baseline"].append(raw_generate(request, speculative=False))
            b = base.generate(request)
            times["engine_baseline"].append(b.e2e_s)
            times["raw_speculative"].append(raw_generate(request, speculative=True))
            s = spec.generate(request)
            times["engine_speculative"].append(s.e2e_s)
            if repeat == 0:
                speedups[prompt.category].append(b.e2e_s / s.e2e_s)
                if s.acceptance_length:
                    lengths[prompt.category].append(s.acceptance_length)
            print(
                f"{prompt.id:>22}  base {b.e2e_s:6.2f}s  spec {s.e2e_s:6.2f}s  "
                f"x{b.e2e_s / s.e2e_s:4.2f}  same={b.token_ids == s.token_ids}",
                flush=True,
            )

    result = {
        "prompts": len(sample),
        "repeats": args.repeats,
        "max_tokens": args.max_tokens,
        "overhead_ratio_baseline": sum(times["engine_baseline"]) / sum(times["raw_baseline"]),
        "overhead_ratio_speculative": (
            sum(times["engine_speculative"]) / sum(times["raw_speculative"])
        ),
        "speedup_median_by_category": {
            c: statistics.median(v) for c, v in sorted(speedups.items())
        },
        "acceptance_length_mean_by_category": {
            c: statistics.fmean(v) for c, v in sorted(lengths.items())
        },
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
