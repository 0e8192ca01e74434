"""The acceptance-drift gate: has a category's acceptance length fallen below its reference?

Per category, the window's acceptance lengths (output tokens per verify step, speculative
arm) are standardised against a reference (mean, sd) — pinned from a healthy period with
`pin_reference` and stored by the daemon, or configured — and fed, oldest first, to a
one-sided lower CUSUM whose threshold h is set from the target in-control average run
length (Siegmund's approximation; ARL0 counts pairs of one category). A category FAILs
only when the CUSUM is above h *and* its window mean is at least `max_relative_drop`
below the reference, so a statistically clear but tiny drift does not roll back; either
alone is a WARN. The detector is recomputed from the window each time: no hidden state.
Categories without a reference or with fewer than `min_samples` pairs in the window are
left out and named in the detail; if none is left, NODATA.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from canaryd.records import PairRecord
from gates.config import DriftGateConfig
from gates.core import GateDecision, GateState
from gates.sequential import cusum_threshold, lower_cusum
from gates.stats import mean_t_bounds
from gates.window import Window, combined, decision, nodata, select

NAME = "drift"
DEFAULT_PIN_MIN_SAMPLES = 100


@dataclass(frozen=True, slots=True)
class ReferenceStats:
    """A category's healthy acceptance length: mean and sd per pair, from n pairs."""

    mean: float
    sd: float
    n: int = 0


def _acceptance_lengths(records: Sequence[PairRecord]) -> dict[str, list[float]]:
    by_category: dict[str, list[float]] = {}
    for record in records:
        if not record.speculative.ok:
            continue
        length = record.speculative.acceptance_length
        if length is not None and math.isfinite(length):
            by_category.setdefault(record.prompt.category, []).append(length)
    return by_category


def pin_reference(
    records: Sequence[PairRecord], *, min_samples: int = DEFAULT_PIN_MIN_SAMPLES
) -> dict[str, ReferenceStats]:
    """Per category, the mean and sd of the acceptance length over `records` (a healthy
    period); categories with fewer than `min_samples` measured pairs are left out."""
    pinned: dict[str, ReferenceStats] = {}
    for category, values in sorted(_acceptance_lengths(records).items()):
        if len(values) < max(2, min_samples):
            continue
        mean = sum(values) / len(values)
        variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
        pinned[category] = ReferenceStats(mean=mean, sd=math.sqrt(variance), n=len(values))
    return pinned


def drift_gate(
    records: Sequence[PairRecord],
    config: DriftGateConfig,
    *,
    now: datetime,
    references: Mapping[str, ReferenceStats] | None = None,
) -> GateDecision:
    """Configured references override pinned ones; the decision names drifted categories."""
    window = select(records, config, now)
    merged: dict[str, ReferenceStats] = dict(references or {})
    merged.update({c: ReferenceStats(r.mean, r.sd) for c, r in config.references.items()})
    by_category = _acceptance_lengths(window.records)
    h = cusum_threshold(config.target_arl0, config.cusum_k)
    components: list[tuple[float, GateDecision]] = []
    notes: list[str] = []
    for category in sorted(by_category):
        values = by_category[category]
        reference = merged.get(category)
        if reference is None:
            notes.append(f"{category}: no reference")
        elif len(values) < config.min_samples:
            notes.append(f"{category}: {len(values)} pairs < min_samples {config.min_samples}")
        else:
            components.append(_category(config, window, now, category, values, reference, h))
    if not components:
        detail = "; ".join(notes) or "no measured acceptance lengths in the window"
        return _nodata(config, window, now, detail)
    components.sort(key=lambda item: -item[0])  # largest drop first: it is the evidence shown
    decisions = [d for _, d in components]
    result = combined(NAME, config, window, now, decisions, notes)
    flagged = tuple(
        sorted(d.categories[0] for d in decisions if d.state is result.state and d.categories)
    )
    if result.state in (GateState.FAIL, GateState.WARN):
        result = combined(NAME, config, window, now, decisions, notes, categories=flagged)
    return result


def _nodata(config: DriftGateConfig, window: Window, now: datetime, detail: str) -> GateDecision:
    empty = nodata(NAME, config, window, now, 0)
    return decision(
        NAME, config, window, now, state=empty.state, threshold=empty.threshold, detail=detail
    )


def _category(
    config: DriftGateConfig,
    window: Window,
    now: datetime,
    category: str,
    values: list[float],
    reference: ReferenceStats,
    h: float,
) -> tuple[float, GateDecision]:
    sd = max(reference.sd, config.sd_floor_fraction * reference.mean)
    cusum = lower_cusum([(v - reference.mean) / sd for v in values], config.cusum_k)
    mean, mean_lower, mean_upper = mean_t_bounds(values, config.confidence)
    drop = 1.0 - mean / reference.mean
    alarm = cusum.statistic > h
    large = drop >= config.max_relative_drop
    if alarm and large:
        state = GateState.FAIL
    elif alarm or large:
        state = GateState.WARN
    else:
        state = GateState.PASS
    since = (
        f", change estimated at pair {cusum.change_index + 1} of {len(values)}"
        if cusum.change_index is not None
        else ""
    )
    return drop, decision(
        f"{NAME}.{category}",
        config,
        window,
        now,
        state=state,
        statistic="relative drop of mean acceptance length vs reference",
        n_speculative=len(values),
        estimate=drop,
        lower=1.0 - mean_upper / reference.mean,
        upper=1.0 - mean_lower / reference.mean,
        threshold=config.max_relative_drop,
        detail=f"{category}: acceptance length {mean:.3f} vs reference {reference.mean:.3f} "
        f"(drop {drop:.1%}, max {config.max_relative_drop:.0%}); CUSUM {cusum.statistic:.2f} "
        f"(peak {cusum.peak:.2f}) vs h {h:.2f}{since}",
        categories=(category,) if state is not GateState.PASS else (),
    )
