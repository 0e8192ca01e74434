"""The quality gate's distribution checks: under sampling, does the speculative arm still
draw from the target model's distribution?

A lossless speculative arm's sampled output has the same distribution as the baseline's,
so any statistic of an output, computed the same way for both arms of a pair, has the
same mean on both; with the pair's two outputs exchangeable its paired difference is
symmetric about zero. Two checks, both on sampled pairs (temperature > 0) that the
baseline model scored as teacher:
- likelihood (`quality.distribution`, `nll_delta`): the paired difference of mean token
  NLL. Two one-sided Gaussian CUSUMs, 0 → ±`distribution_margin`, sd from the window (at
  least the margin), each delta clipped to ±(margin + 3 sd); PASS when the mean's two
  one-sided t bounds lie within ±`distribution_margin`. Parametric (a Gaussian model of
  the delta with a plug-in sd), and it sees every way of being less or more likely.
- argmax (`quality.argmax`, `argmax_delta`): which arm's output has the larger excess
  of the teacher's argmax tokens, and by how much — a paired sign-flip test,
  distribution-free: with the pair's outputs exchangeable the delta is symmetric about
  zero, so given the deltas' sizes their signs are fair coins whatever the prompts, the
  model or the texts. Each untied pair (ties say nothing) bets a fraction λ of the
  running wealth on its sign, staked by its size: the increment is log(1 + λ·s·w), s
  the sign, w = min(|delta| / c, 1) with c the median size of the untied pairs before
  it (a function of sizes only, fixed before the pair's sign is seen). Under
  exchangeable arms every increment has e^increment of mean exactly 1, so the CUSUM of
  them keeps Lorden's bound with no model of the data. Staking by size is what makes
  it strong: a greedy-leaning arm wins its bets by large margins and loses them by
  small ones, which a plain sign test (w = 1) would count as full losses. Per direction
  a bank of two, λ = 0.5 and 0.9. It targets greedy-leaning bugs (argmax verification
  while sampling), which shift the argmax excess more reliably than the mean NLL. PASS
  when the t bounds of the net share (pairs where the speculative output has the larger
  excess, minus the smaller, over all pairs: identical outputs count as evidence of
  equivalence) lie within ±1/4.
The distribution detector's budget share is split equally between its six one-sided
CUSUMs (ARL0 × 6 each). Either check with no scored pair is left out, with a note.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime

from gates.config import QualityGateConfig
from gates.core import GateDecision, GateState, combine_states
from gates.detectors import (
    CALIBRATION_CONFIDENCE,
    closest,
    cusum_note,
    rate_alternatives,
    rate_check,
    sequential_state,
)
from gates.records import PairRecord, PairScores
from gates.sequential import (
    GROSS_LADDER,
    LlrCusum,
    bank_of,
    cusum_bank,
    gaussian_llr,
    gross_charts,
    llr_cusum,
    lorden_threshold,
    sd_upper_bound,
    shift_ladder,
)
from gates.stats import clopper_pearson, mean_t_bounds
from gates.window import Window, decision

__all__ = ["ONE_SIDED_CUSUMS", "distribution_checks", "sign_flip_increments"]

# Likelihood up and down; argmax up and down, each with both bets; implausible tokens.
ONE_SIDED_CUSUMS = 7
_CLIP_SDS = 3.0  # one pathological NLL delta cannot alarm alone
# The bets of the sign-flip test: a fraction of the running wealth staked on each pair.
# 0.5 and 0.9 detect a greedy-verifying arm within a few pairs of each other and of any
# single λ in 0.3 … 0.95 (measured on the embedded model's argmax deltas).
_BETS = (0.5, 0.9)
# PASS needs the net share (more − fewer) within ±2 × this, i.e. the untied share within
# 1/2 ± this.
_SIGN_TOLERANCE = 0.125
_TIE = 1e-9  # closer than this is equal (identical outputs give exactly 0)
# The gross charts' shifts: margin × 4, × 16, … up to this many nats of mean token NLL.
_LARGEST_NLL_SHIFT = 8.0
_RATE_FLOOR = 1e-4


def distribution_checks(
    prefix: str,
    config: QualityGateConfig,
    window: Window,
    now: datetime,
    scored: Sequence[tuple[PairRecord, PairScores]],
    arl0: float,
) -> tuple[list[GateDecision], list[str]]:
    """The likelihood and argmax checks of the sampled pairs in `scored`, named
    `<prefix>.distribution` and `<prefix>.argmax`, `arl0` being the distribution
    detector's share; and a note per check with nothing to judge."""
    h = lorden_threshold(ONE_SIDED_CUSUMS * arl0)
    sampled = [s for r, s in scored if r.temperature > 0.0]
    components: list[GateDecision] = []
    notes: list[str] = []
    nll = [d for s in sampled if (d := s.nll_delta) is not None]
    if nll:
        components.append(_likelihood(f"{prefix}.distribution", config, window, now, nll, h))
    else:
        notes.append("distribution: no sampled pair has a teacher-scored likelihood")
    argmax = [d for s in sampled if (d := s.argmax_delta) is not None]
    if argmax:
        components.append(_argmax(f"{prefix}.argmax", config, window, now, argmax, h))
    else:
        notes.append("argmax: no sampled pair has a teacher-scored argmax excess")
    # Identical outputs have no second forward pass: no implausible token on either side.
    judged = [s for s in sampled if s.speculative_max_nll is not None or s.exact_match]
    if judged:
        components.append(_implausible(f"{prefix}.implausible", config, window, now, judged, h))
    else:
        notes.append("implausible: no sampled pair has teacher-scored token NLLs")
    return components, notes


def _implausible(
    name: str,
    config: QualityGateConfig,
    window: Window,
    now: datetime,
    pairs: list[PairScores],
    h: float,
) -> GateDecision:
    """Pairs where only the speculative output holds a token the teacher scores above
    `implausible_nll_nats`: a Bernoulli CUSUM bank from the edge (the baseline-only
    share's upper bound + `max_implausible_rate`) to 4, 16 and 64 times it (at most 0.9),
    so an arm that emits garbage in most pairs decides in a handful of them."""
    limit = config.implausible_nll_nats

    def implausible(value: float | None) -> bool:
        return value is not None and value > limit

    hits = [
        implausible(s.speculative_max_nll) and not implausible(s.baseline_max_nll) for s in pairs
    ]
    n = len(pairs)
    baseline_only = sum(
        implausible(s.baseline_max_nll) and not implausible(s.speculative_max_nll) for s in pairs
    )
    # A healthy model samples such a token rarely (`max_implausible_rate` is that
    # assumption). Once the baseline shows some itself, the edge adds the upper bound of
    # the baseline's own rate of them (lossless arms are exchangeable: the speculative
    # output holds one as often as the baseline's). Bounding a rate never yet seen from a
    # few pairs would put the edge near one half and blind the check for tens of pairs.
    baseline_any = sum(implausible(s.baseline_max_nll) for s in pairs)
    baseline_upper = (
        clopper_pearson(baseline_any, n, CALIBRATION_CONFIDENCE)[1] if baseline_any else 0.0
    )
    p0 = min(max(baseline_upper, _RATE_FLOOR) + config.max_implausible_rate, 0.5)
    alternatives = rate_alternatives(p0, GROSS_LADDER * p0)
    return rate_check(
        name,
        config,
        window,
        now,
        hits=hits,
        tolerance=min(baseline_only / n + config.max_implausible_rate, 1.0),
        p0=p0,
        p1=alternatives,
        h=h,
        statistic="speculative-only implausible-token rate",
        note=f"; implausible: a token above {limit:g} nats under the baseline model; "
        f"baseline-only {baseline_only}/{n}",
    )


def _likelihood(
    name: str,
    config: QualityGateConfig,
    window: Window,
    now: datetime,
    deltas: list[float],
    h: float,
) -> GateDecision:
    n = len(deltas)
    margin = config.distribution_margin
    sigma = max(statistics.pstdev(deltas) if n >= 2 else 0.0, margin)
    clip = margin + _CLIP_SDS * sigma
    clipped = [min(max(d, -clip), clip) for d in deltas]
    mean, lower, upper = mean_t_bounds(deltas, config.confidence)
    within = lower >= -margin and upper <= margin
    # The gross charts' scale rests on the window's sd at CALIBRATION_CONFIDENCE: a few
    # pairs can say little about it, and an sd guessed too small would let them alarm.
    gross_sigma = max(sd_upper_bound(deltas, CALIBRATION_CONFIDENCE), sigma)
    gross = shift_ladder(margin, _LARGEST_NLL_SHIFT)[1:]
    bank_h = h + math.log(1 + len(gross))
    sides = {}
    for side in (1, -1):
        charts = [gaussian_llr(clipped, 0.0, side * margin, sigma)]
        charts += gross_charts(deltas, 0.0, [side * g for g in gross], gross_sigma)
        sides[side] = cusum_bank(charts, h)
    h = bank_h
    state = _two_sided(
        (c for c, _, _ in sides.values()), h, n, config, passed=within, warned=abs(mean) > margin
    )
    return decision(
        name,
        config,
        window,
        now,
        state=state,
        statistic="mean token-NLL delta speculative − baseline (nats)",
        n_baseline=n,
        n_speculative=n,
        estimate=mean,
        lower=lower,
        upper=upper,
        threshold=margin,
        detail=f"NLL delta {mean:+.4f} [{lower:+.4f}, {upper:+.4f}] vs ±{margin:g} "
        f"({n} teacher-scored sampled pairs); more likely: {_bank_note(sides[-1], margin)}; "
        f"less likely: {_bank_note(sides[1], margin)}; sd {sigma:.4g}",
        detector=closest(*((cusum, h) for cusum, _, h in sides.values())),
    )


def _argmax(
    name: str,
    config: QualityGateConfig,
    window: Window,
    now: datetime,
    deltas: list[float],
    h: float,
) -> GateDecision:
    signs = [0 if abs(d) <= _TIE else (1 if d > 0 else -1) for d in deltas]
    more = [s > 0 for s in signs if s != 0]  # the untied pairs: speculative has more
    hits, untied = sum(more), len(more)
    up = _strongest(llr_cusum(sign_flip_increments(deltas, bet), h) for bet in _BETS)
    down = _strongest(llr_cusum(sign_flip_increments(deltas, -bet), h) for bet in _BETS)
    # PASS on all pairs, ties included: identical outputs are evidence of equivalence.
    n = len(signs)
    net, lower, upper = mean_t_bounds([float(s) for s in signs], config.confidence)
    edge = 2.0 * _SIGN_TOLERANCE
    state = _two_sided(
        (up, down),
        h,
        n,
        config,
        passed=lower >= -edge and upper <= edge,
        warned=abs(net) > edge,
    )
    return decision(
        name,
        config,
        window,
        now,
        state=state,
        statistic="net share of sampled pairs whose speculative output has the larger "
        "teacher-argmax excess (more − fewer, over all pairs)",
        n_baseline=n,
        n_speculative=n,
        estimate=net,
        lower=lower,
        upper=upper,
        threshold=edge,
        detail=f"larger argmax excess on the speculative arm in {hits}/{untied} untied pairs "
        f"({n - untied} ties), net {net:+.3f} [{lower:+.3f}, {upper:+.3f}] vs ±{edge:g}, "
        f"mean argmax-excess delta {statistics.fmean(deltas):+.4f}; "
        f"more argmax: {cusum_note(up, h)}; fewer argmax: {cusum_note(down, h)} "
        f"(sign-flip bets λ {' and '.join(f'{b:g}' for b in _BETS)} on untied pairs, "
        "the stronger shown)",
        detector=closest((up, h), (down, h)),
    )


def _bank_note(bank: tuple[LlrCusum, int, float], margin: float) -> str:
    cusum, chart, h = bank
    shift = margin * GROSS_LADDER**chart
    return f"{cusum_note(cusum, h)} for a shift of {shift:.3g} nats (chart {chart + 1})"


def sign_flip_increments(deltas: Sequence[float], bet: float) -> list[float]:
    """log(1 + bet·s·w) per delta (0 for a tie): s its sign, w = min(|delta| / c, 1), c
    the median size of the untied deltas before it (the first untied one stakes fully).
    A positive `bet` wins on positive deltas; |bet| < 1."""
    if not -1.0 < bet < 1.0:
        raise ValueError(f"need |bet| < 1, got {bet!r}")
    sizes: list[float] = []  # the untied sizes so far, sorted
    increments = []
    for delta in deltas:
        size = abs(delta)
        if size <= _TIE:
            increments.append(0.0)
            continue
        scale = sizes[len(sizes) // 2] if sizes else size
        stake = min(size / scale, 1.0)
        increments.append(math.log1p(bet * stake * (1.0 if delta > 0 else -1.0)))
        bisect.insort(sizes, size)
    return increments


def _two_sided(
    sides: Iterable[LlrCusum],
    h: float,
    n: int,
    config: QualityGateConfig,
    *,
    passed: bool,
    warned: bool,
) -> GateState:
    """The worse of the two one-sided detectors' states, sharing one PASS bound."""
    return combine_states(
        [
            sequential_state(cusum, h, n, max(2, config.min_samples), passed=passed, warned=warned)
            for cusum in sides
        ]
    )


def _strongest(bank: Iterable[LlrCusum]) -> LlrCusum:
    """The CUSUM of a bank (one direction, several alternatives) closest to its alarm,
    with the bank's largest peak and earliest alarm (`bank_of`)."""
    runs = list(bank)
    return bank_of(runs, max(runs, key=lambda cusum: (cusum.statistic, cusum.peak)))
