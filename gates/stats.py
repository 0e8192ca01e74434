"""Descriptive statistics shared by summaries, gates and reports. Pure functions.

Quantiles use the "linear" definition (numpy's default, Hyndman & Fan type 7), so a
P99 over few samples interpolates between the two largest values rather than jumping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0 ≤ q ≤ 1) of `values`; None for no values."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q={q!r} is outside [0, 1]")
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    return float(np.quantile(np.asarray(finite, dtype=float), q))


def mean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(sum(finite) / len(finite)) if finite else None


def rate(hits: int, total: int) -> float | None:
    return hits / total if total else None
