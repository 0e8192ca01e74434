"""The fallback rate as a drift signal of the drift gate, WARN-only.

A verify step falls back when it keeps none of its draft (`SpeculativeStats.fallback_rate`,
`1 − steps with ≥ 1 accepted / steps`). Per category, the speculative arm's fallback rate
per pair is pinned beside the acceptance reference, from the same earliest healthy pairs
and under the key `fallback_key(category)` of the same store of references, so a repin of
the category repins both. In a window the signal compares the share of verify steps that
kept a draft token, `1 − fallback rate`, with the pin's: it WARNs when that share fell by
more than `max_relative_drop` at the gate's confidence, counting both uncertainties
(Welch), as the acceptance check's PASS rule does in the other direction.

It only ever WARNs: it carries no sequential detector, takes no share of the false-alarm
budget and never FAILs or holds a PASS back (a category without enough fallback figures
says nothing). The data make it a poor rollback input: per pair it moves with the
acceptance length the gate already charts (correlation −0.86 in the gate benchmark's
realistic model, −0.83 in its embedded fit), a 30 % acceptance drop moves it by 1.07 and
1.27 healthy sd per pair against 1.16 and 1.17 for log acceptance length (the gate's gross
chart), and engines define and report it differently: the in-process engine counts its
last, draft-less step as a fallback (short outputs raise it), vLLM counts only steps that
drafted, and llama.cpp, TGI and SGLang without its histogram report no per-position
acceptance at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from scipy.stats import t as t_dist

from gates.config import DriftGateConfig
from gates.core import GateDecision, GateState, ReferenceStats
from gates.records import PairRecord
from gates.window import Window, decision

__all__ = [
    "FALLBACK_SUFFIX",
    "fallback_key",
    "fallback_rates",
    "fallback_warnings",
    "pin_fallback",
]

FALLBACK_SUFFIX = ":fallback"


def fallback_key(category: str) -> str:
    """The key of a category's fallback pin among the drift references."""
    return f"{category}{FALLBACK_SUFFIX}"


def fallback_rates(records: Iterable[PairRecord]) -> dict[str, list[float]]:
    """Per category, the speculative arm's fallback rate per pair, in record order (pairs
    whose engine reports acceptance per position only)."""
    by_category: dict[str, list[float]] = {}
    for record in records:
        stats = record.speculative.speculative
        if not record.speculative.ok or stats is None:
            continue
        value = stats.fallback_rate
        if value is not None and math.isfinite(value):
            by_category.setdefault(record.prompt.category, []).append(value)
    return by_category


def pin_fallback(
    records: Sequence[PairRecord],
    categories: Iterable[str],
    *,
    min_samples: int,
    max_samples: int | None = None,
) -> dict[str, ReferenceStats]:
    """The fallback pins of `categories` from `records` (oldest first): mean and sd of the
    fallback rate per pair over at most the first `max_samples` pairs that report it,
    keyed `fallback_key(category)`; a category with fewer than `min_samples` gets none."""
    wanted = set(categories)
    pinned: dict[str, ReferenceStats] = {}
    for category, measured in sorted(fallback_rates(records).items()):
        values = measured[:max_samples] if max_samples is not None else measured
        if category not in wanted or len(values) < max(2, min_samples):
            continue
        mean = sum(values) / len(values)
        variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
        pinned[fallback_key(category)] = ReferenceStats(
            mean=mean, sd=math.sqrt(variance), n=len(values)
        )
    return pinned


def _kept_drop_lower(
    values: Sequence[float], reference: ReferenceStats, config: DriftGateConfig
) -> float:
    """The lower `confidence` bound of (1 − `max_relative_drop`) × the reference's kept
    share − the window's: above 0, the share of steps keeping a draft token fell by more
    than the relevant drop."""
    n = len(values)
    mean = sum(values) / n
    kept = 1.0 - mean
    variance = sum((v - mean) ** 2 for v in values) / (n - 1) / n
    keep = 1.0 - config.max_relative_drop
    if reference.n >= 2:
        variance += (keep * reference.sd) ** 2 / reference.n
    quantile = float(t_dist.ppf(config.confidence, n - 1))
    return keep * (1.0 - reference.mean) - kept - quantile * math.sqrt(variance)


def fallback_warnings(
    records: Sequence[PairRecord],
    references: Mapping[str, ReferenceStats],
    config: DriftGateConfig,
    window: Window,
    now: datetime,
) -> list[GateDecision]:
    """A WARN per category whose steps keeping a draft token fell by more than the
    relevant drop against its fallback pin; nothing for the others."""
    warnings: list[GateDecision] = []
    for category, values in sorted(fallback_rates(records).items()):
        reference = references.get(fallback_key(category))
        n = len(values)
        if reference is None or n < max(2, config.min_samples) or reference.mean >= 1.0:
            continue
        if _kept_drop_lower(values, reference, config) <= 0.0:
            continue
        rate = sum(values) / n
        drop = 1.0 - (1.0 - rate) / (1.0 - reference.mean)
        warnings.append(
            decision(
                f"drift.{category}.fallback",
                config,
                window,
                now,
                state=GateState.WARN,
                statistic="relative drop of the share of verify steps that kept a draft "
                "token vs reference (WARN-only)",
                n_speculative=n,
                estimate=drop,
                threshold=config.max_relative_drop,
                detail=f"{category}: fallback rate {rate:.1%} vs reference "
                f"{reference.mean:.1%} from {reference.n} pairs (steps keeping a draft "
                f"token down {drop:.1%}, relevant {config.max_relative_drop:.0%}; WARN-only)",
                categories=(category,),
                category=category,
            )
        )
    return warnings
