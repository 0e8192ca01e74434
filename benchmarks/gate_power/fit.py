"""The embedded fit (`--refit`): per category, the fake speculative arm's acceptance rate
at which its median speedup over the baseline arm equals the embedded model's measured
one (`noise.EMBEDDED_SPEEDUP`), by bisection with common random numbers; the result is
what `noise.EMBEDDED_ACCEPTANCE_RATE` holds."""

from __future__ import annotations

import statistics

from benchmarks.gate_power.noise import EMBEDDED_SPEEDUP, NoiseModel, embedded_fit
from benchmarks.gate_power.streams import default_prompts
from engine.fake import FakeEngine
from engine.types import GenerationRequest, SamplingParams


def category_speedup(model: NoiseModel, category: str, rate: float, n: int, seed: int) -> float:
    """The fake's median speedup on `n` requests of one category at acceptance `rate`."""
    prompts = [p for p in default_prompts() if p.category == category]
    baseline = FakeEngine(model.baseline.model_copy(update={"seed": seed}))
    speculative = FakeEngine(
        model.speculative.model_copy(
            update={"seed": seed, "acceptance_rate_by_category": {category: rate}}
        )
    )
    speedups = []
    for i in range(n):
        prompt = prompts[i % len(prompts)]
        request = GenerationRequest(
            messages=prompt.messages,
            sampling=SamplingParams(max_tokens=model.params.max_tokens or prompt.max_tokens),
            category=category,
        )
        b, s = baseline.generate(request), speculative.generate(request)
        if b.ok and s.ok:
            speedups.append(b.e2e_s / s.e2e_s)
    return statistics.median(speedups)


def fit_embedded(seed: int = 0, n: int = 720) -> dict[str, float]:
    """Per category, the acceptance rate at which the fake's median speedup is the
    embedded model's (bisection; common random numbers keep it monotone)."""
    model = embedded_fit()
    rates = {}
    for category, target in sorted(EMBEDDED_SPEEDUP.items()):
        low, high = 0.0, 0.99
        for _ in range(14):
            middle = (low + high) / 2
            faster = category_speedup(model, category, middle, n, seed) >= target
            low, high = (low, middle) if faster else (middle, high)
        rates[category] = round((low + high) / 2, 4)
    return rates
