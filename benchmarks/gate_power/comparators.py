"""The judges canaryd is compared with, on the same simulated pairs from a fault's onset:
a Kayenta-style Mann–Whitney judge over fixed windows on its own clock (`kayenta_pairs`),
plain, with Kayenta's tolerance rule (`kayenta_tolerance`) or calibrated at the edge of
canaryd's tolerance (`kayenta_edge_test`); and the oracle CUSUMs (`Oracle`) that know the
pre- and post-change distributions (`oracle_for`) or the fault and the edge of the
tolerance (`edge_oracle_for`), run by `oracle_pairs` with the detectors' h."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import ndtr, xlogy
from scipy.stats import binomtest, gaussian_kde, mannwhitneyu

from benchmarks.gate_power.faults import DRIFT_CATEGORY, Fault, base_model
from benchmarks.gate_power.noise import DeploymentNoise, realistic
from benchmarks.gate_power.sample import HealthySample, latency_by_metric
from benchmarks.gate_power.streams import FaultStream
from gates import GatesConfig
from gates.records import PairRecord
from gates.stats.sequential import bernoulli_llr, llr_cusum

KAYENTA_WINDOWS = (50, 100, 200, 500, 1000)


SELF_REFERENCED = ("acceptance", "e2e")


def metric_values(
    fault: Fault, records: Sequence[PairRecord], *, ties: bool = True
) -> tuple[list[float], list[float]]:
    """(speculative, comparison) values of the fault's metric over `records`; for
    acceptance and e2e the comparison is the speculative arm's healthy reference, filled
    in by the caller (the arms differ by design: speculation is faster). With `ties`
    False a greedy mismatch is a real divergence only (the quality gate's tie rule)."""
    if fault.metric == "acceptance":
        values = [
            length
            for r in records
            if r.prompt.category == DRIFT_CATEGORY
            and r.speculative.ok
            and (length := r.speculative.acceptance_length) is not None
        ]
        return values, []
    if fault.metric == "e2e":
        return [r.speculative.e2e_s for r in records if r.speculative.ok], []
    if fault.metric == "error":
        return (
            [float(not r.speculative.ok) for r in records],
            [float(not r.baseline.ok) for r in records],
        )
    greedy = [r for r in records if r.scores is not None and r.temperature <= 0.0]
    if not ties:
        return [float(real_divergence(r)) for r in greedy], [0.0] * len(greedy)
    return [float(not r.scores.exact_match) for r in greedy if r.scores], [0.0] * len(greedy)


def real_divergence(record: PairRecord) -> bool:
    """A greedy divergence that is not a numeric tie (the quality gate's own rule)."""
    scores = record.scores
    margin = GatesConfig().quality.tie_margin_nats
    return scores is not None and not scores.exact_match and not scores.tie(margin)


def kayenta_phase(seed: int, width: int) -> int:
    """Where the fault falls in the judge's first window: the judge runs on its own clock
    and cannot know when a fault will start, so the onset is uniform within a window."""
    return random.Random(seed * 7_919 + width).randrange(width)


def kayenta_pairs(
    fault: Fault,
    prefix: Sequence[PairRecord],
    stream: FaultStream,
    reference: list[float],
    width: int,
    alpha: float,
    phase: int,
    tolerance: Callable[[list[float], list[float]], bool] | None = None,
    edge: Callable[[list[float], list[float]], float] | None = None,
) -> int | None:
    """End of the first fixed window of `width` pairs whose Mann–Whitney U test rejects at
    `alpha`, in pairs from the onset (None: not within the cap). The windows tile the run
    with the onset `phase` pairs into the first one, which holds healthy pairs before it.
    With `tolerance` (Kayenta's allowedIncrease / allowedDecrease on the effect size), a
    window counts only when the effect is also past the tolerance. With `edge` (a
    one-sided p-value against the edge of the tolerance, `kayenta_edge_test`), that test
    replaces both, and greedy mismatches count real divergences only."""
    before = list(prefix[len(prefix) - phase :]) if phase else []
    for end in range(width, stream.cap + phase + 1, width):
        window = [*before, *stream.upto(end - phase)][end - width : end]
        canary, comparison = metric_values(fault, window, ties=edge is None)
        comparison = comparison or reference
        if not canary or not comparison:
            continue
        if edge is not None:
            if edge(canary, comparison) < alpha:
                return end - phase
            continue
        if len(set(canary) | set(comparison)) == 1:
            continue  # identical samples: nothing to reject
        p = float(mannwhitneyu(canary, comparison, alternative="two-sided").pvalue)
        if p < alpha and (tolerance is None or tolerance(canary, comparison)):
            return end - phase
    return None


def kayenta_tolerance(
    fault: Fault, config: GatesConfig
) -> Callable[[list[float], list[float]], bool]:
    """The effect a tolerant Kayenta-style judge needs besides significance, at canaryd's
    own tolerance (Kayenta's MannWhitneyClassifier: the mean ratio past allowedIncrease
    / allowedDecrease): acceptance below 1 − `max_relative_drop` of its healthy mean; e2e
    above 1 + `max_regression` of it; a speculative error rate above the baseline's plus
    `max_excess_rate`; a mismatch rate above `max_mismatch_rate`."""

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else 0.0

    if fault.metric == "acceptance":
        keep = 1.0 - config.drift.max_relative_drop
        return lambda canary, comparison: mean(canary) < keep * mean(comparison)
    if fault.metric == "e2e":
        allowed = 1.0 + config.latency.max_regression
        return lambda canary, comparison: mean(canary) > allowed * mean(comparison)
    if fault.metric == "error":
        excess = config.error.max_excess_rate
        return lambda canary, comparison: mean(canary) > mean(comparison) + excess
    limit = config.quality.max_mismatch_rate
    return lambda canary, comparison: mean(canary) > limit


def excess_score_pvalue(failed: int, n: int, base_failed: int, base_n: int, excess: float) -> float:
    """One-sided p-value of H0: p − p_base ≤ `excess` for two binomial samples, the
    Farrington–Manning score test: the variance at the rates that maximise the likelihood
    under p = p_base + excess (found numerically), a normal tail."""
    if not n or not base_n:
        return 1.0
    rate, base = failed / n, base_failed / base_n

    def negative_log_likelihood(p_base: float) -> float:
        p = p_base + excess
        return -float(
            xlogy(failed, p)
            + xlogy(n - failed, 1.0 - p)
            + xlogy(base_failed, p_base)
            + xlogy(base_n - base_failed, 1.0 - p_base)
        )

    tiny = 1e-12
    restricted = minimize_scalar(
        negative_log_likelihood, bounds=(tiny, 1.0 - excess - tiny), method="bounded"
    ).x
    p = restricted + excess
    variance = p * (1.0 - p) / n + restricted * (1.0 - restricted) / base_n
    if variance <= 0.0:
        return 1.0
    return float(ndtr(-(rate - base - excess) / math.sqrt(variance)))


def kayenta_edge_test(
    fault: Fault, config: GatesConfig
) -> Callable[[list[float], list[float]], float]:
    """A Kayenta-style judge calibrated where canaryd's detectors are: at the edge of the
    tolerance. Kayenta's classifier needs a significant Mann–Whitney test *and* an
    effect past allowedIncrease / allowedDecrease; with alpha set for a healthy arm, an
    arm sitting exactly at the tolerance passes both in about half the windows once they
    are long enough to be significant, far above the false-alarm budget that canaryd keeps
    at the edge. Here the null hypothesis is the edge itself, one-sided, so `alpha` is
    the false-alarm rate of an arm at the tolerance, as canaryd's is:
    - acceptance: the category's lengths scaled up by 1 / (1 − `max_relative_drop`)
      against the healthy reference, Mann–Whitney "less";
    - e2e: the speculative e2e scaled down by 1 + `max_regression` against its healthy
      prefix, Mann–Whitney "greater";
    - errors: the Farrington–Manning score test of the speculative error rate against
      the baseline's plus `max_excess_rate` (`excess_score_pvalue`);
    - mismatches: an exact binomial test of real divergences (ties excluded, the quality
      gate's rule) against `max_mismatch_rate`."""

    def scaled(factor: float, alternative: str) -> Callable[[list[float], list[float]], float]:
        def test(canary: list[float], comparison: list[float]) -> float:
            shifted = [value * factor for value in canary]
            if len(set(shifted) | set(comparison)) == 1:
                return 1.0
            return float(mannwhitneyu(shifted, comparison, alternative=alternative).pvalue)

        return test

    if fault.metric == "acceptance":
        return scaled(1.0 / (1.0 - config.drift.max_relative_drop), "less")
    if fault.metric == "e2e":
        return scaled(1.0 / (1.0 + config.latency.max_regression), "greater")
    if fault.metric == "error":
        excess = config.error.max_excess_rate

        def errors(canary: list[float], comparison: list[float]) -> float:
            return excess_score_pvalue(
                int(sum(canary)), len(canary), int(sum(comparison)), len(comparison), excess
            )

        return errors
    limit = config.quality.max_mismatch_rate

    def mismatches(canary: list[float], comparison: list[float]) -> float:
        del comparison
        return float(binomtest(int(sum(canary)), len(canary), limit, "greater").pvalue)

    return mismatches


@dataclass(frozen=True)
class Oracle:
    """Per-pair log-likelihood ratios of the known post-change against the known
    pre-change distribution of the fault's statistic."""

    increment: Callable[[PairRecord], float]
    description: str


def error_oracle(p0: float, p1: float, description: str) -> Oracle:
    """The speculative error indicator, Bernoulli(p1) against Bernoulli(p0); a dead arm
    (p1 = 1) makes a success impossible after the change."""
    hit, miss = bernoulli_llr(p0, p1) if p1 < 1.0 else (-math.log(p0), -math.inf)
    return Oracle(lambda r: hit if not r.speculative.ok else miss, description)


def tie_oracle(p0: float, what: str) -> Oracle:
    """Greedy pairs that tie (diverge within the margin), Bernoulli(p0) → Bernoulli(0.99)
    (a runner-up kernel ties on nearly every output); on a deployment that never ties
    (p0 = 0) the first tie alarms (the exact likelihood ratio)."""
    if p0 > 0.0:
        hit, miss = bernoulli_llr(p0, RUNNER_UP_TIE_RATE)
    else:
        hit, miss = math.inf, math.log(1.0 - RUNNER_UP_TIE_RATE)
    margin = GatesConfig().quality.tie_margin_nats
    return Oracle(
        lambda r: (
            0.0
            if r.scores is None or r.temperature > 0.0
            else (hit if r.scores.tie(margin) else miss)
        ),
        f"greedy tie rate {p0:g} ({what}) -> {RUNNER_UP_TIE_RATE:g}",
    )


RUNNER_UP_TIE_RATE = 0.99


def oracle_for(fault: Fault, healthy: HealthySample, drift_after: list[float]) -> Oracle:
    noise = realistic()
    if fault.metric == "error":
        p0, p1 = noise.speculative.error_rate, float(fault.update["error_rate"])
        return error_oracle(p0, p1, f"Bernoulli speculative error {p0:g} -> {p1:g}")
    if fault.metric == "ties":
        deployment = base_model(fault.base).deployment or DeploymentNoise()
        return tie_oracle(deployment.tie_rate, "plain")
    if fault.metric == "mismatch":
        p1 = float(fault.update["corrupt_rate"])
        miss = math.log(1.0 - p1)
        return Oracle(
            lambda r: 0.0 if r.scores is None else (math.inf if real_divergence(r) else miss),
            f"greedy mismatch 0 -> {p1:g}: exact likelihood ratio (a mismatch is impossible "
            "before the change, so the first one alarms; each match adds log(1 - p1))",
        )
    if fault.metric == "e2e":
        shift = math.log(float(fault.update["latency_factor"]))
        data = np.asarray(healthy.log_e2e_ratio[:20_000])
        kde = gaussian_kde(data)
        grid = np.linspace(data.min() - 1.0, data.max() + 1.0 + shift, 4096)
        log_density = np.log(np.maximum(kde(grid), 1e-12))

        def log_f0(x: float) -> float:
            return float(np.interp(x, grid, log_density))

        return Oracle(
            lambda r: (
                0.0
                if r.speedup is None
                else log_f0(-math.log(r.speedup) - shift) - log_f0(-math.log(r.speedup))
            ),
            "log(speculative e2e / baseline e2e): healthy density by Gaussian KDE, the fault "
            f"shifts it by log {fault.update['latency_factor']} exactly",
        )
    before = healthy.acceptance_by_category[DRIFT_CATEGORY]
    mu0, sd0 = statistics.fmean(before), statistics.stdev(before)
    mu1, sd1 = statistics.fmean(drift_after), statistics.stdev(drift_after)

    def gaussian(r: PairRecord) -> float:
        length = r.speculative.acceptance_length if r.speculative.ok else None
        if r.prompt.category != DRIFT_CATEGORY or length is None:
            return 0.0
        z0, z1 = (length - mu0) / sd0, (length - mu1) / sd1
        return math.log(sd0 / sd1) + (z0 * z0 - z1 * z1) / 2.0

    return Oracle(
        gaussian,
        f"{DRIFT_CATEGORY} acceptance length N({mu0:.3f}, {sd0:.3f}^2) -> "
        f"N({mu1:.3f}, {sd1:.3f}^2) (moments of large healthy and faulty samples)",
    )


def edge_oracle_for(fault: Fault, healthy: HealthySample, config: GatesConfig) -> Oracle | None:
    """The oracle for a gate with a tolerance: the known fault against the least favourable
    in-control state such a gate must not roll back — the edge of its tolerance (errors at
    `max_error_rate`, mismatches at `max_mismatch_rate`, a typical e2e ratio of exactly
    `max_ratio`). No detector that respects the tolerance can beat it; drift judges a
    change from its own healthy reference, so its oracle is the plain one (None here)."""
    if fault.metric == "error":
        p0, p1 = config.error.max_error_rate, float(fault.update["error_rate"])
        return error_oracle(p0, p1, f"Bernoulli speculative error {p0:g} (the ceiling) -> {p1:g}")
    if fault.metric == "ties":
        return tie_oracle(config.quality.max_tie_rate, "the ceiling")
    if fault.metric == "mismatch":
        p0, p1 = config.quality.max_mismatch_rate, float(fault.update["corrupt_rate"])
        hit, miss = bernoulli_llr(p0, p1)
        return Oracle(
            lambda r: (
                0.0
                if r.scores is None or r.temperature > 0.0
                else (hit if real_divergence(r) else miss)
            ),
            f"Bernoulli greedy mismatch {p0:g} (the tolerance) -> {p1:g}",
        )
    if fault.metric == "e2e":
        fault_shift = math.log(float(fault.update["latency_factor"]))
        candidates = []
        for metric, pairs in sorted(healthy.latency.items()):
            data = np.log(np.asarray([s / b for b, s in pairs[:20_000]]))
            edge_shift = math.log(config.latency.max_ratio) - float(np.median(data))
            if edge_shift < fault_shift:  # the fault takes this metric past the tolerance
                candidates.append((metric, data, edge_shift))
        if not candidates:
            return None
        # The metric whose fault lies furthest past its edge, in units of its spread.
        metric, data, edge_shift = max(
            candidates, key=lambda c: (fault_shift - c[2]) / float(np.std(c[1]))
        )
        kde = gaussian_kde(data)
        grid = np.linspace(data.min() - 1.0, data.max() + 1.0 + fault_shift, 4096)
        log_density = np.log(np.maximum(kde(grid), 1e-12))

        def log_f(x: float) -> float:
            return float(np.interp(x, grid, log_density))

        def increment(r: PairRecord) -> float:
            values = latency_by_metric(r).get(metric) if r.complete else None
            if values is None:
                return 0.0
            x = math.log(values[1] / values[0])
            return log_f(x - fault_shift) - log_f(x - edge_shift)

        return Oracle(
            increment,
            f"log {metric} ratio (the metric the fault takes furthest past the tolerance): "
            f"the healthy density shifted to a median ratio of {config.latency.max_ratio:g} "
            f"-> shifted by log {fault.update['latency_factor']}",
        )
    return None


def oracle_pairs(oracle: Oracle, stream: FaultStream, h: float) -> int | None:
    increments: list[float] = []
    step_size = 200
    for end in range(step_size, stream.cap + step_size, step_size):
        records = stream.upto(end)
        increments.extend(oracle.increment(r) for r in records[len(increments) :])
        alarm = llr_cusum(increments, h).alarm_index
        if alarm is not None:
            return alarm + 1
        if len(records) >= stream.cap:
            break
    return None
