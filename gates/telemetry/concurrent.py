"""`telemetry.acceptance` against the concurrent stable: the speculative pods that still
serve the previous revision beside the one judged (Argo's stable ReplicaSet, Flagger's
primary), over the same scrapes.

Traffic mix moves acceptance: n-gram drafting copies from code and summaries, not from
chat, and a learned drafter accepts more on what it was trained on. A reference pinned in
the past compares today's mix with yesterday's; the stable serves the same traffic at the
same moment, so the mix and the time of day cancel in the difference.

**Blocks.** The two arms are read at the same instants (one scrape reads every source),
so their intervals end together. The intervals are grouped into blocks that end at a
scrape both arms were read at, each closed once both arms drafted in it: a missed scrape
of one arm, or an interval in which only one arm's counters moved (a busy engine's move
in bursts: on real vLLM servers beside each other they moved in the same 5 s interval
once in 112), joins the next block.

**Noise.** Per block i, with L = 1 + accepted ÷ drafts and keep = 1 − `max_relative_drop`,
z_i = L_canary,i − keep × L_stable,i has variance s² (1 ÷ D_i + keep² ÷ E_i) for the
canary's D_i and the stable's E_i drafts, s² the per-draft dispersion both arms share
(the same engine on the same traffic, the spread between requests included): the
larger of a binomial floor and the blocks' own, from successive differences (median
based, so a step change is one large difference, not a wider spread) once there are
enough blocks, else their weighted spread.

- FAIL: a Gaussian likelihood-ratio CUSUM bank on z, oldest first: in control 0 (the
  canary at the edge of the tolerance), alternatives the drops `alarm_relative_drop`,
  halfway to no acceptance and none at all, each (keep − (1 − drop)) × the stable's
  length below. Scales and clipping as for the pinned reference
  (`gates.telemetry.acceptance`); threshold log(`arl0`), `arl0` in intervals.
- PASS: the lower bound of the window's L_canary − keep × L_stable (t over the blocks'
  degrees of freedom, their weighted spread) at or above zero, with at least
  `min_samples` canary drafts over `min_intervals` blocks.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from scipy.stats import t as t_dist

from gates.config import TelemetryAcceptanceGateConfig
from gates.core import GateDecision
from gates.stats.detectors import reading, sequential_state
from gates.stats.sequential import GROSS_SEPARATION, cusum_bank
from gates.telemetry.errors import interval_note
from gates.telemetry.intervals import TelemetryInterval
from gates.window import Window, decision

__all__ = [
    "CONCURRENT_STATISTIC",
    "Block",
    "aligned",
    "concurrent_acceptance",
    "judged_concurrently",
]

CONCURRENT_STATISTIC = (
    "acceptance length (1 + accepted ÷ drafts), speculative arm against its concurrent "
    "stable, production traffic"
)
_CLIP_SCALES = 3.0
_MEDIAN_CHI2_1 = 0.454936  # the median of χ² with one degree of freedom
_MIN_DIFFERENCES = 5  # successive differences before the blocks' own spread counts


@dataclass(frozen=True, slots=True)
class Block:
    """Both arms' speculative counters over the same scrapes: the canary's drafts and
    accepted tokens, the stable's, and the draft tokens of both (None where unreported)."""

    drafts: int
    accepted: int
    stable_drafts: int
    stable_accepted: int
    draft_tokens: int | None = None

    def difference(self, keep: float) -> float:
        """z = L_canary − keep × L_stable."""
        return (1.0 + self.accepted / self.drafts) - keep * (
            1.0 + self.stable_accepted / self.stable_drafts
        )

    def weight(self, keep: float) -> float:
        """1 ÷ (1 ÷ D + keep² ÷ E): z's variance is s² over this."""
        return 1.0 / (1.0 / self.drafts + keep * keep / self.stable_drafts)


def aligned(
    canary: Sequence[TelemetryInterval], stable: Sequence[TelemetryInterval]
) -> list[Block]:
    """The blocks of `canary` and `stable` (each oldest first): runs of intervals that end
    at a scrape both were read at, each closed once both arms drafted in it (a busy
    engine's counters move in bursts, so an interval where only one arm drafted joins the
    next); intervals after the last close wait. An interval that reports drafts without
    accepted tokens leaves its block out."""
    common = sorted({i.end for i in canary} & {i.end for i in stable})
    blocks: list[Block] = []
    opened: datetime | None = None
    for end in common:
        mine = _between(canary, opened, end)
        theirs = _between(stable, opened, end)
        drafts = sum(i.drafts or 0 for i in mine)
        stable_drafts = sum(i.drafts or 0 for i in theirs)
        if drafts <= 0 or stable_drafts <= 0:
            continue  # the block stays open until both arms drafted
        opened = end
        if any(i.drafts and i.accepted_tokens is None for i in (*mine, *theirs)):
            continue
        tokens = [i.draft_tokens for i in (*mine, *theirs) if i.drafts]
        blocks.append(
            Block(
                drafts=drafts,
                accepted=sum(i.accepted_tokens or 0 for i in mine),
                stable_drafts=stable_drafts,
                stable_accepted=sum(i.accepted_tokens or 0 for i in theirs),
                draft_tokens=None if None in tokens else sum(t or 0 for t in tokens),
            )
        )
    return blocks


def _between(
    intervals: Sequence[TelemetryInterval], after: datetime | None, end: datetime
) -> list[TelemetryInterval]:
    return [i for i in intervals if i.end <= end and (after is None or i.end > after)]


def _floor(blocks: Sequence[Block]) -> float:
    """The per-draft variance of accepted tokens out of k independent draft tokens (k the
    draft tokens per draft of both arms), at the stable's acceptance: the least s² can be."""
    drafts = sum(b.drafts + b.stable_drafts for b in blocks)
    accepted = sum(b.accepted + b.stable_accepted for b in blocks)
    per_draft = accepted / drafts
    tokens = [b.draft_tokens for b in blocks]
    k = (
        sum(t for t in tokens if t is not None) / drafts
        if tokens and None not in tokens
        else max(per_draft + 1.0, 1.0)
    )
    share = min(max(per_draft / k, 0.0), 1.0) if k > 0 else 0.0
    return max(k * share * (1.0 - share), 1e-3)


def _weighted_spread(blocks: Sequence[Block], keep: float) -> float | None:
    """Σ w_i (z_i − z̄)² ÷ (n − 1), w_i = `Block.weight`: unbiased for s²; None below two."""
    if len(blocks) < 2:
        return None
    weights = [b.weight(keep) for b in blocks]
    values = [b.difference(keep) for b in blocks]
    mean = sum(w * z for w, z in zip(weights, values, strict=True)) / sum(weights)
    return sum(w * (z - mean) ** 2 for w, z in zip(weights, values, strict=True)) / (
        len(blocks) - 1
    )


def _successive_spread(blocks: Sequence[Block], keep: float) -> float | None:
    if len(blocks) <= _MIN_DIFFERENCES:
        return None
    scaled = [
        (b.difference(keep) - a.difference(keep)) ** 2
        / (1.0 / a.weight(keep) + 1.0 / b.weight(keep))
        for a, b in itertools.pairwise(blocks)
    ]
    return statistics.median(scaled) / _MEDIAN_CHI2_1


def _chart(blocks: Sequence[Block], keep: float, shift: float, dispersion: float) -> list[float]:
    """Per block, the log-likelihood ratio of N(shift, σ_i²) against N(0, σ_i²) for z_i,
    σ_i = max(s ÷ √w_i, |shift| ÷ 3), clipped 3 σ_i outside the two means."""
    increments = []
    for b in blocks:
        scale = max(math.sqrt(dispersion / b.weight(keep)), abs(shift) / GROSS_SEPARATION)
        low = min(0.0, shift) - _CLIP_SCALES * scale
        high = max(0.0, shift) + _CLIP_SCALES * scale
        value = min(max(b.difference(keep), low), high)
        increments.append(shift / (scale * scale) * (value - shift / 2.0))
    return increments


def concurrent_acceptance(
    blocks: Sequence[Block],
    config: TelemetryAcceptanceGateConfig,
    window: Window,
    now: datetime,
    h: float,
) -> GateDecision:
    """The gate's decision on `blocks` (at least one), `h` the CUSUM threshold."""
    keep = 1.0 - config.max_relative_drop
    drafts = sum(b.drafts for b in blocks)
    stable_drafts = sum(b.stable_drafts for b in blocks)
    length = 1.0 + sum(b.accepted for b in blocks) / drafts
    stable = 1.0 + sum(b.stable_accepted for b in blocks) / stable_drafts
    floor = _floor(blocks)
    successive = _successive_spread(blocks, keep)
    weighted = _weighted_spread(blocks, keep)
    spread = successive if successive is not None else weighted
    dispersion = max(floor, spread) if spread is not None else math.inf
    full = 1.0 - 1.0 / stable  # the drop to no acceptance at all
    drops = sorted({config.alarm_relative_drop, (config.alarm_relative_drop + full) / 2.0, full})
    shifts = [s for d in drops if (s := ((1.0 - d) - keep) * stable) < 0.0]
    if shifts and not math.isinf(dispersion):
        charts = [_chart(blocks, keep, s, dispersion) for s in shifts]
    else:  # no spread yet, or the tolerance admits no acceptance at all: nothing to detect
        shifts, charts = shifts or [0.0], [[0.0] * len(blocks)]
    cusum, chart, bank_h = cusum_bank(charts, h)
    lower = upper = None
    margin_lower = -math.inf
    if weighted is not None:
        pooled = max(weighted, floor)
        quantile = float(t_dist.ppf(config.confidence, len(blocks) - 1))
        se = math.sqrt(pooled / drafts)
        lower, upper = length - quantile * se, length + quantile * se
        margin_se = math.sqrt(pooled * (1.0 / drafts + keep * keep / stable_drafts))
        margin_lower = length - keep * stable - quantile * margin_se
    state = sequential_state(
        cusum,
        bank_h,
        drafts if len(blocks) >= config.min_intervals else 0,
        config.min_samples,
        passed=margin_lower >= 0.0,
        warned=length < keep * stable,
    )
    sd = "unknown yet" if math.isinf(dispersion) else f"{math.sqrt(dispersion):.3f}"
    return decision(
        "telemetry.acceptance",
        config,
        window,
        now,
        state=state,
        statistic=CONCURRENT_STATISTIC,
        n_baseline=stable_drafts,
        n_speculative=drafts,
        estimate=length,
        lower=lower,
        upper=upper,
        threshold=keep * stable,
        detail=f"acceptance length {length:.3f} over {drafts} drafts vs the concurrent "
        f"stable's {stable:.3f} over {stable_drafts} drafts in the same {len(blocks)} "
        f"scrape intervals: drop {1.0 - length / stable:.1%}, tolerated "
        f"{config.max_relative_drop:.0%} (length ≥ {keep * stable:.3f}); "
        f"{interval_note(cusum, bank_h)} for L − {keep:.2f} × L_stable 0 → "
        f"{shifts[chart]:.3f} (per-draft sd {sd})",
        detector=reading(cusum, bank_h),
    )


def judged_concurrently(decision: GateDecision) -> bool:
    """Whether a `telemetry.acceptance` decision was judged against the concurrent stable."""
    return decision.statistic == CONCURRENT_STATISTIC
