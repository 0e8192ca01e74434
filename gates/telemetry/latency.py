"""The `telemetry.latency` gate: is the speculative arm slower than the baseline on
production traffic, at the same load?

It reads both arms' latency histograms (end-to-end, time to first token, inter-token)
from their serving engines, interval by interval, and compares each metric's median and
P99 (`quantiles`) as a ratio speculative ÷ baseline against `max_ratio`.

**Matched load.** Speculative decoding most often loses at high batch sizes, so a
comparison is fair only where both arms carry the same load. Where both arms count
requests, the load is what they are given: requests per second per replica, each arm's
over its intervals within two minutes of the speculative interval (a single 15 s
interval at a few requests a second is too noisy to match on). A speculative interval
is compared when the two differ by at most `max_load_difference` (0.2) of the larger.
In flight alone is no such measure: by Little's law an arm slower at the same arrivals
holds more of them. Where arrivals differ but the requests in flight agree (a balancer
keeping as many open on each arm), the concurrency is the same and the slower arm merely
got fewer arrivals: matched too, or it would hide behind what its slowness cost. Where
an arm counts no requests, requests running + waiting per replica are matched alone
(within the same tolerance, or one request). The tolerance bounds what load alone can
move: with latency ∝ load^γ, a load ratio of 1 ÷ (1 − 0.2) = 1.25 moves latency by
1.25^γ, within `max_ratio` 1.2 for γ up to 0.8 (1.12 at γ = 0.5); a 2× difference of
arrivals and of concurrency (latency ×1.41 at γ = 0.5, a false FAIL) is left out. With
too few requests left at matched load the decision is NODATA, its detail saying why.

**Inter-token latency per token.** vLLM observes one inter-token latency per engine step
and request; a speculative verify step streams several tokens at once and takes longer
than a plain decode step, so its raw gaps are longer even where the arm is faster per
token. With `itl_per_token` (default) an arm's gaps are divided by its acceptance length
over the window (1 + accepted ÷ drafts; 1 without speculation) before the arms are
compared: the time per token of a step, as the end-to-end latency sees it. A drop of
acceptance itself is `telemetry.acceptance`'s to judge.

**Comparing at bucket bounds.** A histogram says how many observations fell in each
bucket, not where inside it, but both arms count exactly at a bucket bound b. If the
speculative arm is at most `max_ratio` times slower, P_spec(X > b) ≤ P_base(X > b ÷
`max_ratio`); the baseline's side is read on its interpolated CDF (Prometheus'
`histogram_quantile` rule), which inside the bucket below b never reads less than its
share above b, so equal arms sit inside the tolerance whatever the buckets and coarse
buckets cost power, never false alarms. The bounds judged are the speculative arm's (at
most two) whose baseline share above b ÷ `max_ratio` is nearest 1 − q (within a factor
3). Every check's detail names the buckets holding both quantiles, the ratio their
bounds alone allow, and the bounds judged. A baseline quantile in the +inf bucket has
no reading: that check is INCONCLUSIVE and says so.

Per (metric, quantile), the statistic is the speculative arm's share of requests above
the limit `max_ratio` × the baseline's q-quantile; the tolerance is a share of 1 − q:
- FAIL: per bound b, a Bernoulli likelihood-ratio CUSUM over the speculative arm's
  matched intervals, oldest first, on its observations above b. In control each
  interval's share is at most the edge p0: the baseline's share above b ÷ `max_ratio`
  over its intervals within two minutes (load drifts), its Clopper–Pearson upper bound
  at the calibration level; the alternatives multiply p0's odds by `alarm_factor`, 4×
  and 16× that. Bounds × alternatives form one bank. Each interval adds its
  exceedances' log-likelihood ratio, so the unit of evidence is the request: an
  inter-token interval's observations are weighted by requests ÷ observations (a
  request's tokens count once together: exp of a mean is at most the mean of exps).
  Batches that run slower together make an interval's share vary more than its requests
  would: the increments and the baseline's requests are divided by that dispersion (the
  larger arm's, from successive intervals' shares, at least 1). The threshold is
  log(`arl0`), `arl0` counted in intervals. WARN: the detector half-way, or a bound's
  speculative share above the baseline's edge.
- PASS: the share above `max_ratio` × the baseline quantile's lower bound at most 1 − q
  at the gate's confidence (Clopper–Pearson on requests; each bound at half the error),
  with at least `min_samples` requests per arm at matched load.
When either arm has had no interval, or served nothing, for longer than the gate's
silence bound (`gates.telemetry.silence`), the gate is NODATA and says which and since
when.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from scipy.stats import beta as beta_dist
from scipy.stats import norm

from gates.config import TelemetryLatencyGateConfig, TelemetryLatencyMetric
from gates.core import GateDecision, GateState
from gates.stats.detectors import CALIBRATION_CONFIDENCE, reading, sequential_state
from gates.stats.histogram import (
    BucketCounts,
    BucketQuantile,
    add_buckets,
    bucket_quantile,
    count_above,
    count_at_or_below,
)
from gates.stats.sequential import bernoulli_llr, cusum_bank, lorden_threshold
from gates.telemetry.errors import interval_note
from gates.telemetry.intervals import (
    TelemetryEvidence,
    TelemetryInterval,
)
from gates.telemetry.silence import silence
from gates.window import Window, combined, decision

NAME = "telemetry.latency"
_LOAD_FLOOR = 1.0  # requests in flight per replica: closer than this is the same load
_ALTERNATIVES = 3  # alarm_factor × 4^k on the odds, k = 0, 1, 2
_MAX_ALTERNATIVE = 0.99
_BOUNDS = 2  # bucket bounds judged per check
_SHARE_RANGE = 3.0  # a bound's baseline share above bound ÷ max_ratio: within ×/÷ this of 1 − q
_MAX_SHARE = 0.9
_LOCAL_SECONDS = 120.0  # the baseline beside a speculative interval: within this of it


@dataclass(frozen=True, slots=True)
class MatchedLoad:
    """The intervals compared: speculative ones at matched load and the baseline ones
    beside them; how many speculative intervals were left out, and why."""

    speculative: tuple[TelemetryInterval, ...]
    baseline: tuple[TelemetryInterval, ...]
    mismatched: int = 0
    unknown_load: int = 0
    uncovered: int = 0

    @property
    def note(self) -> str:
        return (
            f"{len(self.speculative)} speculative intervals at matched load; left out: "
            f"{self.mismatched} at mismatched load, {self.unknown_load} with no load signal "
            f"on an arm, {self.uncovered} with no baseline interval beside them"
        )


def telemetry_latency_gate(
    evidence: TelemetryEvidence,
    config: TelemetryLatencyGateConfig,
    *,
    now: datetime,
    arl0: float,
    since: datetime | None = None,
) -> GateDecision:
    """One component per (metric, quantile), combined (the worst decides): FAIL when a
    check's CUSUM alarms, PASS when every check's share bound holds; NODATA below
    `min_samples` requests per arm at matched load. `arl0` is each detector's
    in-control run length in intervals; `since` (the start of the current evidence)
    drops intervals that started before it."""
    base = evidence.baseline.window(
        now, window_seconds=config.window_seconds, window_intervals=config.window_pairs, since=since
    )
    spec = evidence.speculative.window(
        now, window_seconds=config.window_seconds, window_intervals=config.window_pairs, since=since
    )
    stopped = silence({"baseline": base, "speculative": spec}, now, config)
    if stopped is not None:
        return decision(
            NAME,
            config,
            Window(
                (),
                min((i.start for i in [*base, *spec]), default=None),
                max((i.end for i in [*base, *spec]), default=None),
            ),
            now,
            state=GateState.NODATA,
            statistic="speculative / baseline latency quantile at matched load",
            threshold=float(config.min_samples),
            detail=stopped,
        )
    matched = match_load(base, spec, config.max_load_difference)
    window = Window(
        (),
        min((i.start for i in [*matched.baseline, *matched.speculative]), default=None),
        max((i.end for i in [*matched.baseline, *matched.speculative]), default=None),
    )
    if not matched.speculative:
        reason = (
            "no speculative interval at matched load"
            if spec and base
            else f"{len(base)} baseline and {len(spec)} speculative intervals in the window"
        )
        return decision(
            NAME,
            config,
            window,
            now,
            state=GateState.NODATA,
            statistic="speculative / baseline latency quantile at matched load",
            threshold=float(config.min_samples),
            detail=f"{reason}; {matched.note}",
        )
    h = lorden_threshold(arl0)
    components = [
        quantile_check(matched, metric, q, config, window, now, h)
        for metric in config.metrics
        for q in config.quantiles
    ]
    return combined(NAME, config, window, now, components, [matched.note])


def match_load(
    baseline: Sequence[TelemetryInterval],
    speculative: Sequence[TelemetryInterval],
    tolerance: float,
) -> MatchedLoad:
    """The speculative intervals whose load per replica matches the baseline's beside
    them (module docstring), and the baseline intervals beside those, oldest first."""
    judged: list[TelemetryInterval] = []
    beside: dict[int, TelemetryInterval] = {}
    mismatched = unknown = uncovered = 0
    ends = [b.end for b in baseline]
    spec_load = _Smoothed(speculative)
    base_load = _Smoothed(baseline)
    for interval in speculative:
        near = []
        index = bisect.bisect_right(ends, interval.start)
        while index < len(baseline) and baseline[index].start < interval.end:
            if (overlap := _overlap(interval, baseline[index])) > 0:
                near.append((overlap, index, baseline[index]))
            index += 1
        if not near:
            uncovered += 1
            continue
        middle = _middle(interval)
        spec_rate, base_rate = spec_load.rate(middle), base_load.rate(middle)
        in_flight = _differs(
            spec_load.in_flight(middle), base_load.in_flight(middle), tolerance, _LOAD_FLOOR
        )
        if spec_rate is not None and base_rate is not None:
            # Arrivals are the load given; the same concurrency is the same load too.
            differs = _differs(spec_rate, base_rate, tolerance, 0.0) and in_flight is not False
        else:
            differs = in_flight
        if differs is None:
            unknown += 1
            continue
        if differs:
            mismatched += 1
            continue
        judged.append(interval)
        beside.update({index: b for _, index, b in near})
    return MatchedLoad(
        tuple(judged),
        tuple(beside[i] for i in sorted(beside)),
        mismatched=mismatched,
        unknown_load=unknown,
        uncovered=uncovered,
    )


class _Smoothed:
    """One arm's load per replica around a moment: over its intervals whose middles lie
    within `_LOCAL_SECONDS` of it, weighted by their lengths (one 15 s interval at a few
    requests a second is Poisson noise of a third)."""

    def __init__(self, intervals: Sequence[TelemetryInterval]) -> None:
        self._intervals = sorted(intervals, key=_middle)
        self._middles = [_middle(i) for i in self._intervals]

    def _near(self, middle: datetime) -> Sequence[TelemetryInterval]:
        reach = timedelta(seconds=_LOCAL_SECONDS)
        lo = bisect.bisect_left(self._middles, middle - reach)
        hi = bisect.bisect_right(self._middles, middle + reach)
        return self._intervals[lo:hi]

    def rate(self, middle: datetime) -> float | None:
        """Requests finished per second per replica; None where none is counted."""
        counted = [i for i in self._near(middle) if i.requests is not None]
        seconds = sum(i.seconds for i in counted)
        if not counted or seconds <= 0:
            return None
        return sum(i.per_replica(float(i.requests or 0)) for i in counted) / seconds

    def in_flight(self, middle: datetime) -> float | None:
        """Requests running + waiting per replica; None where unknown."""
        return _weighted([(i.seconds, _load(i)) for i in self._near(middle)])


def _middle(interval: TelemetryInterval) -> datetime:
    return interval.start + (interval.end - interval.start) / 2


def _overlap(a: TelemetryInterval, b: TelemetryInterval) -> float:
    return (min(a.end, b.end) - max(a.start, b.start)).total_seconds()


def _load(interval: TelemetryInterval) -> float | None:
    load = interval.load
    return None if load is None else interval.per_replica(load)


def _weighted(values: Sequence[tuple[float, float | None]]) -> float | None:
    known = [(w, v) for w, v in values if v is not None]
    total = sum(w for w, _ in known)
    return sum(w * v for w, v in known) / total if total > 0 else None


def _differs(a: float | None, b: float | None, tolerance: float, floor: float) -> bool | None:
    """Whether two loads differ by more than `tolerance` of the larger and more than
    `floor`; None when either is unknown."""
    if a is None or b is None:
        return None
    return abs(a - b) > max(tolerance * max(a, b), floor)


# --- one (metric, quantile) check -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Arm:
    """One arm's observations of a metric: per interval its buckets, the weight of each
    observation (requests ÷ observations) and its midpoint; pooled."""

    intervals: tuple[tuple[BucketCounts, float, datetime], ...]
    pooled: BucketCounts | None
    requests: float  # the observations, weighted: requests

    @classmethod
    def of(
        cls,
        intervals: Sequence[TelemetryInterval],
        metric: TelemetryLatencyMetric,
        itl_per_token: bool,
    ) -> _Arm:
        read: list[tuple[BucketCounts, float, datetime]] = []
        # One length for the arm's window, so that its intervals share bounds and pool
        # into one histogram of the buckets' own resolution.
        length = acceptance_length(intervals) if metric == "itl" and itl_per_token else None
        for interval in intervals:
            buckets = getattr(interval, metric)
            if buckets is None or buckets.count <= 0:
                continue
            weight = observation_weight(interval, metric, buckets)
            if weight is None:
                continue
            if length is not None and interval.drafts:
                buckets = per_token(buckets, length)
            read.append((buckets, weight, interval.start + (interval.end - interval.start) / 2))
        pooled = BucketCounts.of(add_buckets(b.as_mapping() for b, _, _ in read)) if read else None
        return cls(tuple(read), pooled, sum(b.count * w for b, w, _ in read))


def acceptance_length(intervals: Sequence[TelemetryInterval]) -> float | None:
    """1 + accepted ÷ drafts over the intervals with draft counters; None without any."""
    counted = [i for i in intervals if i.drafts and i.accepted_tokens is not None]
    drafts = sum(i.drafts or 0 for i in counted)
    if not drafts:
        return None
    return 1.0 + sum(i.accepted_tokens or 0 for i in counted) / drafts


def per_token(buckets: BucketCounts, length: float) -> BucketCounts:
    """Inter-token latency per token: vLLM observes one inter-token latency per engine
    step, and a speculative verify step streams `length` tokens at once (the arm's
    acceptance length), so the bounds are divided by it."""
    return BucketCounts(tuple(b / length for b in buckets.bounds), buckets.cumulative)


def observation_weight(
    interval: TelemetryInterval, metric: TelemetryLatencyMetric, buckets: BucketCounts
) -> float | None:
    """What one observation weighs, in requests: 1 for end-to-end and first-token
    latency (one per request); requests ÷ observations for inter-token latency (one per
    token), the requests from the interval's count or its end-to-end histogram; None for
    inter-token latency without either."""
    if metric != "itl":
        return 1.0
    requests = interval.requests
    if requests is None and interval.e2e is not None:
        requests = round(interval.e2e.count)
    if requests is None:
        return None
    return min(1.0, requests / buckets.count)


def odds_alternatives(p0: float, factor: float) -> list[float]:
    """Exceedance probabilities whose odds are `factor` × 4^k times p0's, capped."""
    odds = p0 / (1.0 - p0)
    alternatives = set()
    for k in range(_ALTERNATIVES):
        scaled = odds * factor * 4.0**k
        alternatives.add(min(scaled / (1.0 + scaled), _MAX_ALTERNATIVE))
    return sorted(p for p in alternatives if p > p0)


def _rank_bound(q: float, n: float, confidence: float, upper: bool) -> float:
    """The level whose quantile bounds the q-quantile from above (or below) at
    `confidence` from n observations (normal approximation of the order statistic's
    rank, one observation of continuity)."""
    if n <= 0:
        return 1.0 if upper else 0.0
    z = float(norm.ppf(confidence))
    step = z * math.sqrt(q * (1.0 - q) / n) + 1.0 / n
    return min(1.0, q + step) if upper else max(0.0, q - step)


def _pct(q: float) -> str:
    return f"p{q * 100:g}"


def quantile_check(
    matched: MatchedLoad,
    metric: TelemetryLatencyMetric,
    q: float,
    config: TelemetryLatencyGateConfig,
    window: Window,
    now: datetime,
    h: float,
) -> GateDecision:
    """The check of one metric's q-quantile ratio (module docstring)."""
    name = f"{NAME}.{metric}.{_pct(q)}"
    statistic = (
        f"speculative share of {metric} above {config.max_ratio:g} × the baseline's "
        f"{_pct(q)}, at matched load"
    )
    base = _Arm.of(matched.baseline, metric, config.itl_per_token)
    spec = _Arm.of(matched.speculative, metric, config.itl_per_token)
    n_base, n_spec = round(base.requests), round(spec.requests)
    p0 = 1.0 - q
    if base.pooled is None or spec.pooled is None or min(base.requests, spec.requests) <= 0:
        return decision(
            name,
            config,
            window,
            now,
            state=GateState.NODATA,
            statistic=statistic,
            n_baseline=n_base,
            n_speculative=n_spec,
            threshold=p0,
            detail=f"{metric} {_pct(q)}: no {metric} histogram at matched load "
            f"({n_base} baseline, {n_spec} speculative requests weighed)",
        )
    edge = bucket_quantile(_rank_bound(q, base.requests, CALIBRATION_CONFIDENCE, True), base.pooled)
    base_q = bucket_quantile(q, base.pooled)
    spec_q = bucket_quantile(q, spec.pooled)
    if edge is None or base_q is None or spec_q is None or edge.beyond_buckets:
        return decision(
            name,
            config,
            window,
            now,
            state=GateState.INCONCLUSIVE,
            statistic=statistic,
            n_baseline=n_base,
            n_speculative=n_spec,
            threshold=p0,
            detail=f"{metric} {_pct(q)}: the baseline's quantile lies in the +inf bucket "
            "(beyond the largest finite bound): the buckets cannot read it",
        )
    bounds = tail_bounds(spec.pooled, base.pooled, q, config.max_ratio)
    charts, exceed = [], 0.0
    for bound in bounds:
        weights = [w * b.count for b, w, _ in spec.intervals]
        above = [w * count_above(b, bound) for b, w, _ in spec.intervals]
        base_n = [w * b.count for b, w, _ in base.intervals]
        base_above = [
            w * (b.count - count_at_or_below(b, bound / config.max_ratio))
            for b, w, _ in base.intervals
        ]
        spread = max(dispersion(above, weights), dispersion(base_above, base_n))
        local = local_shares(base, spec, bound / config.max_ratio, spread)
        edge_share = sum(p * n for p, n in zip(local, weights, strict=True)) / spec.requests
        exceed = max(exceed, sum(above) / spec.requests - edge_share)
        for k in range(_ALTERNATIVES):
            increments = []
            for (b, w, _), over, p_edge in zip(spec.intervals, above, local, strict=True):
                alternatives = odds_alternatives(p_edge, config.alarm_factor)
                if k >= len(alternatives):
                    increments.append(0.0)
                    continue
                up, down = bernoulli_llr(p_edge, alternatives[k])
                increments.append((over * up + (w * b.count - over) * down) / spread)
            charts.append(increments)
    cusum, chart, bank_h = cusum_bank(charts or [[0.0]], h)
    fired = bounds[chart // _ALTERNATIVES] if bounds else math.inf
    ratio = spec_q.value / base_q.value if base_q.value > 0 else math.inf
    # PASS reads the speculative arm's share above max_ratio × the baseline's quantile
    # (its lower bound) on the interpolated CDF: continuous in the data, and equal arms
    # read equal whatever the buckets. WARN, like FAIL, compares the arms at a bucket
    # bound both read exactly.
    half = 1.0 - (1.0 - config.confidence) / 2.0
    base_lo = bucket_quantile(_rank_bound(q, base.requests, half, False), base.pooled)
    pass_limit = config.max_ratio * (base_lo.value if base_lo is not None else 0.0)
    share = sum(w * (b.count - count_at_or_below(b, pass_limit)) for b, w, _ in spec.intervals)
    share /= spec.requests
    lower, upper = share_bounds(share, spec.requests, half)
    state = sequential_state(
        cusum,
        bank_h,
        min(n_base, n_spec),
        config.min_samples,
        passed=upper <= p0,
        warned=exceed > 0.0,
    )
    return decision(
        name,
        config,
        window,
        now,
        state=state,
        statistic=statistic,
        n_baseline=n_base,
        n_speculative=n_spec,
        estimate=share,
        lower=lower,
        upper=upper,
        threshold=p0,
        detail=f"{metric} {_pct(q)}: speculative {spec_q.value:.4g} s, baseline "
        f"{base_q.value:.4g} s, ratio {ratio:.3f} vs max {config.max_ratio:g} "
        f"({_resolution(spec_q, base_q)}); speculative share above {pass_limit:.4g} s "
        f"({config.max_ratio:g} × the baseline's lower {base_lo.value if base_lo else 0:.4g} s) "
        f"{share:.4f} (upper bound {upper:.4f}) vs {p0:.4g}; {_bounds_note(bounds, fired)}, "
        f"speculative share above it less the baseline's edge {exceed:+.4f}; "
        f"{interval_note(cusum, bank_h)}, odds × {config.alarm_factor * 4.0 ** (chart % 3):g}",
        detector=reading(cusum, bank_h),
    )


def tail_bounds(spec: BucketCounts, base: BucketCounts, q: float, max_ratio: float) -> list[float]:
    """The speculative arm's finite bucket bounds b judged: the (at most `_BOUNDS`) whose
    baseline share above b ÷ `max_ratio` (interpolated) is nearest 1 − q in log-odds,
    among those where it lies within a factor `_SHARE_RANGE` of 1 − q."""
    p = 1.0 - q
    scored = []
    for bound in spec.bounds:
        if math.isinf(bound) or bound <= 0:
            continue
        above = (base.count - count_at_or_below(base, bound / max_ratio)) / base.count
        if p / _SHARE_RANGE <= above <= min(p * _SHARE_RANGE, _MAX_SHARE):
            scored.append((abs(_logit(above) - _logit(p)), bound))
    return sorted(bound for _, bound in sorted(scored)[:_BOUNDS])


def _logit(p: float) -> float:
    p = min(max(p, 1e-9), 1.0 - 1e-9)
    return math.log(p / (1.0 - p))


def dispersion(above: Sequence[float], n: Sequence[float]) -> float:
    """How much more an arm's share above a bound varies between successive intervals
    than binomial sampling of its requests allows (batches that run slower together):
    the mean of (s_i − s_{i+1})² ÷ (v_i + v_{i+1}), v the binomial variance at the pooled
    share, at least 1. Successive differences, so a slow drift of load does not count."""
    total = sum(n)
    share = sum(above) / total if total > 0 else 0.0
    if not 0.0 < share < 1.0:
        return 1.0
    pairs = [
        (above[i] / n[i] - above[i + 1] / n[i + 1]) ** 2
        / (share * (1.0 - share) * (1.0 / n[i] + 1.0 / n[i + 1]))
        for i in range(len(n) - 1)
        if n[i] > 0 and n[i + 1] > 0
    ]
    return max(1.0, sum(pairs) / len(pairs)) if pairs else 1.0


def local_shares(base: _Arm, spec: _Arm, x: float, spread: float = 1.0) -> list[float]:
    """Per speculative interval, the most the baseline's share above x can be near it: the
    Clopper–Pearson upper bound, at the calibration level, of its share above x (read on
    each interval's interpolated CDF) over the baseline intervals within
    `_LOCAL_SECONDS` of the speculative one (all of them where none is that near), its
    requests counted ÷ `spread` (the dispersion between intervals)."""
    times = [t for _, _, t in base.intervals]
    reach = timedelta(seconds=_LOCAL_SECONDS)
    edges = []
    for _, _, middle in spec.intervals:
        lo = bisect.bisect_left(times, middle - reach)
        hi = bisect.bisect_right(times, middle + reach)
        near = base.intervals[lo:hi] if hi > lo else base.intervals
        n = sum(w * b.count for b, w, _ in near)
        above = sum(w * (b.count - count_at_or_below(b, x)) for b, w, _ in near)
        _, upper = share_bounds(above / n, n / spread, CALIBRATION_CONFIDENCE)
        edges.append(min(upper, _MAX_ALTERNATIVE))
    return edges


def share_bounds(share: float, n: float, confidence: float) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds, each at `confidence`, on a share observed as
    `share` of n (weighted, so fractional) requests."""
    if n <= 0:
        return 0.0, 1.0
    hits = share * n
    alpha = 1.0 - confidence
    lower = 0.0 if hits <= 0 else float(beta_dist.ppf(alpha, hits, n - hits + 1))
    upper = 1.0 if hits >= n else float(beta_dist.ppf(confidence, hits + 1, n - hits))
    return lower, upper


def _bounds_note(bounds: Sequence[float], fired: float) -> str:
    if not bounds:
        return "no bucket bound near the baseline's quantile ÷ max_ratio"
    listed = ", ".join(f"{b:.4g}" for b in bounds)
    return f"bounds judged {listed} s, the detector's at {fired:.4g} s"


def _resolution(spec: BucketQuantile, base: BucketQuantile) -> str:
    """The ratio the bucket bounds alone allow, from the buckets holding each quantile."""
    low = spec.low / base.high if base.high > 0 and not base.beyond_buckets else 0.0
    high = spec.high / base.low if base.low > 0 else math.inf
    return (
        f"buckets: speculative ({spec.low:g}, {spec.high:g}], baseline ({base.low:g}, "
        f"{base.high:g}], ratio between {low:.3g} and {high:.3g} by bounds alone"
    )
