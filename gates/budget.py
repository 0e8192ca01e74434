"""The false-alarm budget: how often, at most, healthy traffic may roll back production.

One budget (`gates.budget`, default 0.1 false rollbacks per 30 days at one pair every
10 s) is split equally between the sequential detectors of the enforce gates: the
liveness gate's run of speculative failures (a CUSUM whose alternative is a dead arm),
the error gate's paired and ceiling detectors, per latency metric one on the median
ratio and one per quantile (and one per SLO and per regression metric), the quality
gate's mismatch, score, loop and distribution detectors (the last split again between
its seven one-sided CUSUMs, gates/distribution.py), the speedup detector and the drift
gate (whose share is split again between the monitored categories): 16 by default.
False-alarm rates add, so a detector given ARL0 = N × pairs-per-30-days / budget pairs
keeps the sum within the budget. Gates in `warn` or `dry_run` mode cannot roll back and
take no share.
"""

from __future__ import annotations

from gates.config import GateConfigBase, GatesConfig
from gates.core import GateMode
from gates.sequential import lorden_threshold

SECONDS_PER_30_DAYS = 30 * 86_400.0


def detector_count(config: GatesConfig) -> int:
    """The number of enforce detectors sharing the budget (at least one)."""

    def enforced(section: GateConfigBase) -> bool:
        return section.mode is GateMode.ENFORCE

    count = 0
    if enforced(config.liveness):
        count += 1
    if enforced(config.error):
        count += 2
    if enforced(config.latency):
        count += len(config.latency.metrics) * (1 + len(config.latency.quantiles))
        count += len(config.latency.slos) + len(config.latency.regression_metrics)
    if enforced(config.quality):
        count += 4
    if enforced(config.speedup):
        count += 1
    if enforced(config.drift):
        count += 1
    return max(count, 1)


def detector_arl0(config: GatesConfig) -> float:
    """Each detector's in-control average run length, in pairs."""
    budget = config.budget
    pairs = SECONDS_PER_30_DAYS / budget.design_pair_interval_s
    return pairs * detector_count(config) / budget.false_rollbacks_per_30_days


def detector_threshold(config: GatesConfig) -> float:
    """The CUSUM threshold h = log(ARL0) of each detector."""
    return lorden_threshold(detector_arl0(config))


def detector_budget(config: GatesConfig) -> float:
    """Each detector's share of the budget, in false rollbacks per 30 days."""
    return config.budget.false_rollbacks_per_30_days / detector_count(config)


DEFAULT_ARL0 = detector_arl0(GatesConfig())
DEFAULT_DETECTOR_BUDGET = detector_budget(GatesConfig())
