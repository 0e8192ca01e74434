"""The false-alarm budget: how often, at most, healthy traffic may roll back production.

One budget (`gates.budget`, default 0.1 false rollbacks per 30 days at one pair every
10 s) is split equally between the sequential detectors of the enforce gates: the
liveness gate's run of speculative failures (a CUSUM whose alternative is a dead arm),
the error gate's paired and ceiling detectors, per latency metric one on the median
ratio and one per quantile (and one per SLO and per regression metric), the quality
gate's mismatch, score, loop and distribution detectors (the last split again between
its seven one-sided CUSUMs, gates/pairs/distribution.py), the speedup detector and the drift
gate (whose share is split again between the monitored categories): 16 by default.
False-alarm rates add, so a detector given ARL0 = N × pairs-per-30-days / budget pairs
keeps the sum within the budget. Gates in `warn` or `dry_run` mode cannot roll back and
take no share.

A detector whose alternative is gross needs little of the budget, and takes
`MINOR_SHARE` (1/16) of a share: liveness, whose every pair of a dead arm adds
log(1/q) to its statistic (at least 0.36 nats, at the 70 % baseline failure rate it
allows for; 3.5 at 3 %), and the quality gate's tie-rate chart, whose every greedy
pair under a runner-up kernel adds about 0.7 nats; their thresholds' log(16) ≈ 2.8
nats more cost them a pair or a few. N counts shares, not detectors (`budget_shares`:
15 + 2/16 by default; `detector_count` still counts detectors), so every other detector
keeps nearly a whole 15th of the budget.

The budget holds only at its design rate, one pair every `design_pair_interval_s`.
A faster rate (several pairs per cycle, several daemons on one database measuring)
spends more: `rebudget` sizes a copy of the config for the measured rate, so every
ARL0 grows by the ratio of the rates and every threshold by its log.
"""

from __future__ import annotations

from gates.config import GatesConfig
from gates.config_base import GateConfigBase
from gates.core import GateMode

SECONDS_PER_30_DAYS = 30 * 86_400.0
# The fraction of a detector's share taken by one whose alternative is gross (above).
MINOR_SHARE = 1.0 / 16.0


def _enforced(section: GateConfigBase) -> bool:
    return section.mode is GateMode.ENFORCE


def telemetry_detector_count(config: GatesConfig) -> int:
    """The enforce detectors of the telemetry gates (a bank of alternatives is one
    chart): `telemetry.errors` one, `telemetry.latency` one per metric and quantile,
    `telemetry.acceptance` one: 8 by default."""
    sections = config.telemetry
    count = 0
    if _enforced(sections.errors):
        count += 1
    if _enforced(sections.latency):
        count += len(sections.latency.metrics) * len(sections.latency.quantiles)
    if _enforced(sections.acceptance):
        count += 1
    return count


def detector_count(config: GatesConfig, *, telemetry: bool = False) -> int:
    """The number of enforce detectors sharing the budget (at least one); with
    `telemetry`, the telemetry gates' among them."""
    count = telemetry_detector_count(config) if telemetry else 0
    if _enforced(config.liveness):
        count += 1
    if _enforced(config.error):
        count += 2
    if _enforced(config.latency):
        count += len(config.latency.metrics) * (1 + len(config.latency.quantiles))
        count += len(config.latency.slos) + len(config.latency.regression_metrics)
    if _enforced(config.quality):
        count += 4
    if _enforced(config.speedup):
        count += 1
    if _enforced(config.drift):
        count += 1
    return max(count, 1)


def budget_shares(config: GatesConfig, *, telemetry: bool = False) -> float:
    """The shares the budget is split into: one per enforce detector but liveness, and
    `MINOR_SHARE` for each gross one, liveness and the quality gate's tie-rate chart (at
    least one in all)."""
    shares = float(detector_count(config, telemetry=telemetry))
    if _enforced(config.liveness):
        shares -= 1.0 - MINOR_SHARE
    if _enforced(config.quality):
        shares += MINOR_SHARE
    return max(shares, 1.0)


def detector_arl0(config: GatesConfig, *, telemetry: bool = False) -> float:
    """Each pair detector's in-control average run length, in pairs (a whole share's;
    a gross detector's is this over `MINOR_SHARE`)."""
    budget = config.budget
    pairs = SECONDS_PER_30_DAYS / budget.design_pair_interval_s
    return pairs * budget_shares(config, telemetry=telemetry) / budget.false_rollbacks_per_30_days


def telemetry_arl0(config: GatesConfig, scrape_interval_s: float) -> float:
    """Each telemetry detector's in-control average run length, in scrape intervals of
    `scrape_interval_s` seconds: its share of the budget at one observation per scrape."""
    if scrape_interval_s <= 0:
        raise ValueError(f"scrape_interval_s must be positive, got {scrape_interval_s!r}")
    intervals = SECONDS_PER_30_DAYS / scrape_interval_s
    count = budget_shares(config, telemetry=True)
    return intervals * count / config.budget.false_rollbacks_per_30_days


def design_pairs_per_minute(config: GatesConfig) -> float:
    """The pair rate the budget is sized for: 60 / `budget.design_pair_interval_s`."""
    return 60.0 / config.budget.design_pair_interval_s


def rate_ratio(config: GatesConfig, pairs_per_minute: float | None) -> float:
    """How many times faster than the design rate `pairs_per_minute` is; 1 when it is not
    (or unknown): a slower rate spends less than the budget, never more."""
    if pairs_per_minute is None:
        return 1.0
    return max(1.0, pairs_per_minute / design_pairs_per_minute(config))


def rebudget(config: GatesConfig, pairs_per_minute: float | None) -> GatesConfig:
    """`config` sized for `pairs_per_minute` pairs a minute when that is faster than its
    design rate: a copy whose `design_pair_interval_s` is 60 / `pairs_per_minute`, so
    that the false alarms per 30 days stay within the budget at that rate; `config`
    itself (never changed) otherwise."""
    if rate_ratio(config, pairs_per_minute) <= 1.0:
        return config
    assert pairs_per_minute is not None  # a ratio above 1 needs a rate
    budget = config.budget.model_copy(update={"design_pair_interval_s": 60.0 / pairs_per_minute})
    return config.model_copy(update={"budget": budget})


def detector_budget(config: GatesConfig, *, telemetry: bool = False) -> float:
    """Each detector's (whole) share of the budget, in false rollbacks per 30 days."""
    count = budget_shares(config, telemetry=telemetry)
    return config.budget.false_rollbacks_per_30_days / count


# The default config's shares without telemetry. No gate defaults to them: a gate is
# handed its share by its caller (`gates.cycle`); tests and benchmarks that judge one gate
# alone pass these, as `gates.cycle.pins` does to the drift check that holds a pin back.
DEFAULT_ARL0 = detector_arl0(GatesConfig())
DEFAULT_DETECTOR_BUDGET = detector_budget(GatesConfig())
