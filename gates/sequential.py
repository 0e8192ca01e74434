"""Sequential change detection: a one-sided (lower) CUSUM and its calibration.

The detector is recomputed from the ordered window of observations on every evaluation
(no hidden state): a restart, a second daemon or an auditor replaying the stored records
gets exactly the same statistic. Starting at zero at the window's first record makes the
windowed CUSUM never larger than one run over the whole history, so the false-alarm
rate can only go down; with a window far longer than the detection delay (tens of
samples) the sensitivity is the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.optimize import brentq

_SIEGMUND_CORRECTION = 1.166  # the overshoot correction, 2 · 0.583 (Siegmund 1985)


@dataclass(frozen=True, slots=True)
class CusumResult:
    statistic: float  # S at the last observation
    peak: float  # the largest S within the window
    change_index: int | None  # first index after S last left zero (the change-point estimate)


def lower_cusum(standardised: Sequence[float], k: float) -> CusumResult:
    """S_t = max(0, S_{t−1} − z_t − k), S_0 = 0: grows while z stays below −k."""
    statistic = peak = 0.0
    change_index: int | None = None
    for index, z in enumerate(standardised):
        previous = statistic
        statistic = max(0.0, statistic - z - k)
        if statistic > 0.0 and previous == 0.0:
            change_index = index
        if statistic == 0.0:
            change_index = None
        peak = max(peak, statistic)
    return CusumResult(statistic=statistic, peak=peak, change_index=change_index)


def siegmund_arl(h: float, k: float, shift: float = 0.0) -> float:
    """Siegmund's approximation of a one-sided CUSUM's average run length on N(shift, 1)
    observations (shift in the detected direction), reference k, threshold h."""
    delta = shift - k
    b = h + _SIEGMUND_CORRECTION
    if abs(delta) < 1e-9:
        return b * b
    return (math.exp(-2.0 * delta * b) + 2.0 * delta * b - 1.0) / (2.0 * delta * delta)


def cusum_threshold(target_arl0: float, k: float) -> float:
    """The threshold h whose in-control ARL (Siegmund) equals `target_arl0`."""
    if target_arl0 <= siegmund_arl(0.0, k):
        return 0.0
    return float(brentq(lambda h: siegmund_arl(h, k) - target_arl0, 0.0, 200.0))
