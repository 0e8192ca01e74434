"""What a healthy run keeps besides its trips: `HealthySample` collects per-pair figures
(acceptance lengths and speedups per category, latency pairs per metric, error tallies)
from the first `KEPT_PAIRS` pairs, the pre-change distributions of the oracles and the
evidence for the latency tails past the tolerance; its `summary` is the healthy section's
description of the model (acceptance CV, speedups, tails)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gates import GatesConfig
from gates.records import PairRecord

KEPT_PAIRS = 100_000  # per-pair figures kept from a healthy run (enough for every estimate)


def latency_by_metric(record: PairRecord) -> dict[str, tuple[float, float]]:
    """(baseline, speculative) per latency metric, for a pair where both arms succeeded."""
    b, s = record.baseline, record.speculative
    figures = {
        "e2e": (b.e2e_s, s.e2e_s),
        "ttft": (b.ttft_s, s.ttft_s),
        "tpot": (b.tpot_s, s.tpot_s),
    }
    return {
        m: (x, y) for m, (x, y) in figures.items() if x is not None and y is not None and x > 0 < y
    }


def discordant_break_even(alarm_factor: float) -> float:
    """The share of discordant tail pairs on the speculative side above which the latency
    gate's tail detector drifts up: where the Bernoulli(alarm_factor / (1 + alarm_factor))
    against Bernoulli(1/2) log-likelihood ratio has mean zero."""
    p1 = alarm_factor / (1.0 + alarm_factor)
    miss = math.log(0.5 / (1.0 - p1))
    return miss / (math.log(p1 / 0.5) + miss)


@dataclass
class HealthySample:
    """Per-pair figures kept from a healthy run: the oracles' pre-change distributions."""

    log_e2e_ratio: list[float] = field(default_factory=list)
    speedup_by_category: dict[str, list[float]] = field(default_factory=dict)
    acceptance_by_category: dict[str, list[float]] = field(default_factory=dict)
    latency: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    errors: list[int] = field(default_factory=lambda: [0, 0, 0])  # pairs, baseline, spec

    def add(self, record: PairRecord) -> None:
        self.errors[0] += 1
        self.errors[1] += not record.baseline.ok
        self.errors[2] += not record.speculative.ok
        if self.errors[0] > KEPT_PAIRS:
            return
        length = record.speculative.acceptance_length if record.speculative.ok else None
        if length is not None:
            self.acceptance_by_category.setdefault(record.prompt.category, []).append(length)
        speedup = record.speedup
        if speedup is not None:
            self.log_e2e_ratio.append(-math.log(speedup))
            self.speedup_by_category.setdefault(record.prompt.category, []).append(speedup)
            for metric, values in latency_by_metric(record).items():
                self.latency.setdefault(metric, []).append(values)

    def latency_tails(self, config: GatesConfig) -> dict[str, Any]:
        """Per metric: the speculative/baseline quantile ratio over the whole run, how
        often the speculative value exceeded max_ratio × the baseline quantile, and the
        speculative side's share of the tail detector's discordant pairs."""
        gate = config.latency
        out: dict[str, Any] = {}
        for q in gate.quantiles:
            for metric, pairs in sorted(self.latency.items()):
                base = np.asarray([b for b, _ in pairs])
                spec = np.asarray([s for _, s in pairs])
                limit = gate.max_ratio * float(np.quantile(base, q))
                scaled = gate.max_ratio * base
                level = float(np.quantile(np.concatenate([scaled, spec]), q))
                spec_side = int(np.sum((spec > level) & (scaled <= level)))
                discordant = spec_side + int(np.sum((scaled > level) & (spec <= level)))
                out[f"{metric}.p{q * 100:g}"] = {
                    "ratio": round(float(np.quantile(spec, q) / np.quantile(base, q)), 4),
                    "exceedance_rate": round(float(np.mean(spec > limit)), 5),
                    "speculative_discordant_share": round(spec_side / discordant, 4)
                    if discordant
                    else None,
                }
        out["break_even_discordant_share"] = round(discordant_break_even(gate.alarm_factor), 5)
        return out

    def summary(self, config: GatesConfig) -> dict[str, Any]:
        cv = {
            c: statistics.stdev(v) / statistics.fmean(v)
            for c, v in sorted(self.acceptance_by_category.items())
            if len(v) > 1
        }
        speedups = [s for v in self.speedup_by_category.values() for s in v]
        pairs, base, spec = self.errors
        return {
            "acceptance_length_mean": {
                c: round(statistics.fmean(v), 3)
                for c, v in sorted(self.acceptance_by_category.items())
            },
            "acceptance_cv_by_category": {c: round(x, 3) for c, x in cv.items()},
            "acceptance_cv_mean": round(statistics.fmean(cv.values()), 3) if cv else None,
            "median_speedup_by_category": {
                c: round(statistics.median(v), 3)
                for c, v in sorted(self.speedup_by_category.items())
            },
            "median_speedup": round(statistics.median(speedups), 3) if speedups else None,
            "slower_share": round(sum(s < 1.0 for s in speedups) / len(speedups), 4)
            if speedups
            else None,
            "error_rate": {"baseline": base / max(pairs, 1), "speculative": spec / max(pairs, 1)},
            "latency_tails": self.latency_tails(config) if self.latency else {},
            "figures_from_first_pairs": min(pairs, KEPT_PAIRS),
        }
