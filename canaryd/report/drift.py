"""Acceptance drift as the report draws it: per category, the acceptance length over time
against a reference band of mean ± 2 sd.

The reference is the drift gate's pinned one when the store has it, else the first 20 %
of the category's pairs in the window, so a history without a pinned reference still
shows whether acceptance moved. Pure functions of pair records; the drift gate's own
statistics are `gates.pairs.drift`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gates.core import ReferenceStats
from gates.records import PairRecord
from gates.stats.descriptive import mean

REFERENCE_FRACTION = 0.2  # the first 20 % of a category's window is its drift reference
BAND_SDS = 2.0


@dataclass(frozen=True, slots=True)
class DriftSeries:
    """One category's acceptance length over time against its reference band."""

    times: tuple[datetime, ...]
    lengths: tuple[float, ...]
    reference_n: int
    reference_mean: float | None
    reference_sd: float | None
    band: tuple[float, float] | None  # mean ± 2 sd of the reference
    reference_source: str  # "pinned" (the drift gate's stored reference) or "first 20 %"
    recent_mean: float | None  # mean of the last 20 % of the window
    outside: int  # points after the reference that lie outside the band


def _sd(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    centre = sum(values) / len(values)
    return math.sqrt(sum((v - centre) ** 2 for v in values) / (len(values) - 1))


def drift_series(pairs: Sequence[PairRecord], pinned: ReferenceStats | None = None) -> DriftSeries:
    """Against the `pinned` reference when given, else the first 20 % (at least 2) of the
    pairs in time order."""
    points = sorted(
        (p.started_at, length)
        for p in pairs
        if p.complete and (length := p.speculative.acceptance_length) is not None
    )
    lengths = [v for _, v in points]
    n_ref = max(2, math.ceil(REFERENCE_FRACTION * len(lengths))) if len(lengths) >= 2 else 0
    reference = lengths[:n_ref]
    ref_mean, ref_sd, ref_size = mean(reference), _sd(reference), len(reference)
    if pinned is not None:
        n_ref, ref_mean, ref_sd, ref_size = 0, pinned.mean, pinned.sd, pinned.n
    band = None
    if ref_mean is not None and ref_sd is not None:
        band = (ref_mean - BAND_SDS * ref_sd, ref_mean + BAND_SDS * ref_sd)
    recent = lengths[len(lengths) - max(1, math.ceil(REFERENCE_FRACTION * len(lengths))) :]
    outside = 0
    if band is not None:
        outside = sum(not band[0] <= v <= band[1] for v in lengths[n_ref:])
    return DriftSeries(
        times=tuple(t for t, _ in points),
        lengths=tuple(lengths),
        reference_n=ref_size,
        reference_mean=ref_mean,
        reference_sd=ref_sd,
        band=band,
        reference_source="first 20 %" if pinned is None else "pinned",
        recent_mean=mean(recent) if lengths else None,
        outside=outside,
    )


def drift_by_category(
    pairs: Sequence[PairRecord], pinned: Mapping[str, ReferenceStats] | None = None
) -> dict[str, DriftSeries]:
    categories = sorted({p.prompt.category for p in pairs})
    pinned = pinned or {}
    series = {
        c: drift_series([p for p in pairs if p.prompt.category == c], pinned.get(c))
        for c in categories
    }
    return {c: s for c, s in series.items() if s.lengths}
