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
  distribution-free: exchanging a pair's two outputs flips the sign of every paired
  delta at once, so with the outputs exchangeable, given the past and the sizes, the
  signs are fair coins whatever the prompts, the model or the texts. The test bets on
  a score z = a/c_a − 0.2·n/c_n (`joint_scores`): a the argmax delta and n the NLL
  delta, each in units of the median size of its earlier deltas, so it flips with the
  pair and greedy-leaning arms (argmax-heavier and likelier at once) push it up. Each
  untied pair (ties say nothing) bets a fraction λ of the running wealth on the sign
  of z, staked by its size: the increment is log(1 + λ·s·w), s the sign, w = min(|z| /
  c, 1) with c the median |z| of the untied pairs before it (a function of sizes only,
  fixed before the pair's sign is seen). Under exchangeable arms every increment has
  e^increment of mean exactly 1 whatever came before, so the wealth from any start is
  a test martingale. The detector is the Shiryaev-Roberts statistic of these e-values,
  R_n = (1 + R_(n-1))·e^increment, the sum over every start of the wealth since it
  (the e-SR detector of Shin, Ramdas and Rinaldo, "E-detectors: a nonparametric
  framework for sequential change detection", 2024): R_n − n is a martingale under
  exchangeable arms, so the alarm at log R ≥ h keeps the in-control run length of at
  least e^h that a CUSUM at h has (Pollak 1985), with no model of the data, and it
  alarms no later than that CUSUM (the CUSUM is the largest term of the sum; a
  greedy-leaning arm lifts many starts at once). Staking by size is what makes it
  strong: a greedy-leaning arm wins its bets by large margins and loses them by small
  ones, which a plain sign test (w = 1) would count as full losses. Per direction a
  bank of two, λ = 0.5 and 0.9, each on its own share. It targets greedy-leaning bugs
  (argmax verification while sampling), which shift the argmax excess more reliably
  than the mean NLL. PASS when the t bounds of the net share of the argmax delta's
  signs (pairs where the speculative output has the larger excess, minus the smaller,
  over all pairs: identical outputs count as evidence of equivalence) lie within ±1/4.
The distribution detector's budget share is split equally between its seven one-sided
detectors (ARL0 × 7 each). Either check with no scored pair is left out, with a note.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime

from gates.config import QualityGateConfig
from gates.core import GateDecision, GateState, combine_states
from gates.records import PairRecord, PairScores
from gates.stats.descriptive import clopper_pearson, mean_t_bounds
from gates.stats.detectors import (
    CALIBRATION_CONFIDENCE,
    closest,
    cusum_note,
    rate_alternatives,
    rate_check,
    sequential_state,
)
from gates.stats.sequential import (
    GROSS_LADDER,
    LlrCusum,
    bank_of,
    cusum_bank,
    gaussian_llr,
    gross_charts,
    lorden_threshold,
    sd_upper_bound,
    shift_ladder,
)
from gates.window import Window, decision

__all__ = [
    "ONE_SIDED_CUSUMS",
    "distribution_checks",
    "joint_scores",
    "shiryaev_roberts",
    "sign_flip_increments",
]

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
# The NLL delta's weight in the score the sign-flip test bets on (`joint_scores`), both
# deltas in units of their median size: greedy-leaning arms are argmax-heavier and
# likelier at once, and a fifth of the likelihood's noisier evidence sharpens the sign
# (measured on the embedded model's lossy pairs: 0.1 … 0.3 all help, 0.2 in the middle).
_NLL_WEIGHT = 0.2
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
    argmax = [s for s in sampled if s.argmax_delta is not None]
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
    pairs: list[PairScores],
    h: float,
) -> GateDecision:
    deltas = [s.argmax_delta or 0.0 for s in pairs]
    joint = joint_scores(deltas, [s.nll_delta for s in pairs])
    signs = [0 if abs(d) <= _TIE else (1 if d > 0 else -1) for d in deltas]
    more = [s > 0 for s in signs if s != 0]  # the untied pairs: speculative has more
    hits, untied = sum(more), len(more)
    up = _strongest(shiryaev_roberts(sign_flip_increments(joint, bet), h) for bet in _BETS)
    down = _strongest(shiryaev_roberts(sign_flip_increments(joint, -bet), h) for bet in _BETS)
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
        f"more argmax: {_sr_note(up, h)}; fewer argmax: {_sr_note(down, h)} "
        f"(sign-flip bets λ {' and '.join(f'{b:g}' for b in _BETS)} on the argmax delta "
        f"− {_NLL_WEIGHT:g} × the NLL delta, each in median sizes; the stronger shown)",
        detector=closest((up, h), (down, h)),
    )


def _bank_note(bank: tuple[LlrCusum, int, float], margin: float) -> str:
    cusum, chart, h = bank
    shift = margin * GROSS_LADDER**chart
    return f"{cusum_note(cusum, h)} for a shift of {shift:.3g} nats (chart {chart + 1})"


def joint_scores(argmax: Sequence[float], nll: Sequence[float | None]) -> list[float]:
    """The score the sign-flip test bets on, per pair: a / c_a − `_NLL_WEIGHT` · n / c_n,
    a the argmax-excess delta and n the mean token-NLL delta (0 when unscored), each in
    units of the median size of its nonzero deltas before it (its own size for the
    first). Exchanging a pair's two outputs flips a and n together and leaves the scales
    (sizes of earlier pairs) alone, so the score flips sign: under exchangeable arms it
    is symmetric about zero given the past, as each delta is."""
    a_sizes: list[float] = []
    n_sizes: list[float] = []
    out = []
    for a, n in zip(argmax, nll, strict=True):
        n = n or 0.0
        out.append(_in_units(a, a_sizes) - _NLL_WEIGHT * _in_units(n, n_sizes))
        for value, sizes in ((a, a_sizes), (n, n_sizes)):
            if abs(value) > _TIE:
                bisect.insort(sizes, abs(value))
    return out


def _in_units(value: float, sizes: list[float]) -> float:
    if abs(value) <= _TIE:
        return 0.0
    return value / (sizes[len(sizes) // 2] if sizes else abs(value))


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


def shiryaev_roberts(increments: Sequence[float], h: float) -> LlrCusum:
    """The Shiryaev-Roberts detector of log e-value `increments`: log R_n with R_n =
    (1 + R_(n-1)) · e^increment, R_0 = 0 — the sum over every start of the wealth since
    it. Shown as `statistic` (floored at 0, like a CUSUM's), with its `peak`, the first
    observation at which it reached `h`, and `change_index`, the start whose wealth was
    the largest term at the peak (the CUSUM's excursion start). When every e^increment
    has conditional mean at most 1, R_n − n is a supermartingale, so the in-control run
    length to log R ≥ h is at least e^h, as for a CUSUM at h (Pollak 1985; for e-values,
    Shin, Ramdas and Rinaldo 2024); it never alarms later than that CUSUM."""
    log_r = -math.inf  # log R_n
    cusum = 0.0  # log of the largest term of the sum, floored at 0
    start: int | None = None
    statistic = peak = 0.0
    peak_start: int | None = None
    alarm: int | None = None
    for index, increment in enumerate(increments):
        # log(1 + R) without overflow: R can pass e^700 under a gross fault.
        grown = log_r + math.log1p(math.exp(-log_r)) if log_r > 0.0 else math.log1p(math.exp(log_r))
        log_r = grown + increment
        if cusum == 0.0:
            start = index
        cusum = max(0.0, cusum + increment)
        statistic = max(log_r, 0.0)
        if statistic > peak:
            peak, peak_start = statistic, start
        if alarm is None and statistic >= h:
            alarm = index
    return LlrCusum(statistic, peak, alarm, peak_start, len(increments))


def _sr_note(detector: LlrCusum, h: float) -> str:
    return "Shiryaev-Roberts" + cusum_note(detector, h).removeprefix("CUSUM")


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
