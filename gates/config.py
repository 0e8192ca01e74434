"""Gate and switch-policy configuration: one `GatesConfig` with a section per gate.

Every model forbids unknown keys, so a misspelt knob fails at start instead of being
silently ignored. The defaults are chosen to be safe (they only trip on evidence that
holds at the stated confidence) and each is justified in docs/gates.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gates.config_base import GateConfigBase, Strict, check_quantiles_and_metrics
from gates.core import GateMode
from gates.switch.config import SwitchPolicyConfig

__all__ = [
    "BudgetConfig",
    "DriftGateConfig",
    "ErrorGateConfig",
    "GateConfigBase",
    "GatesConfig",
    "LatencyGateConfig",
    "LatencyMetric",
    "LatencySLO",
    "LivenessGateConfig",
    "ParityGateConfig",
    "QualityGateConfig",
    "ReferenceConfig",
    "SpeedupGateConfig",
    "SwitchPolicyConfig",
    "TelemetryAcceptanceGateConfig",
    "TelemetryErrorGateConfig",
    "TelemetryGatesConfig",
    "TelemetryLatencyGateConfig",
]

LatencyMetric = Literal["e2e", "ttft", "tpot", "itl"]


class BudgetConfig(Strict):
    """One false-alarm budget for every enforce gate, in false rollbacks per 30 days.

    It is sized for the fastest schedule the daemon is expected to run
    (`design_pair_interval_s`): at a slower schedule false alarms are rarer still. The
    budget is split equally between the enforce gates' sequential detectors
    (gates/stats/budget.py); each detector's threshold is log(ARL0) of its share.
    """

    false_rollbacks_per_30_days: float = Field(default=0.1, gt=0)
    design_pair_interval_s: float = Field(default=10.0, gt=0)
    over_design_rate: Literal["refuse", "rebudget"] = Field(
        default="refuse",
        description="a schedule faster than one pair every design_pair_interval_s "
        "(60 x schedule.pairs_per_cycle / schedule.pair_interval_s pairs a minute): "
        "refuse: the config is refused at load; rebudget: accepted, and the gates are "
        "re-budgeted from the measured pair rate (as for several daemons on one database)",
    )


class LatencySLO(Strict):
    """An absolute limit on the speculative arm: its `quantile` of `metric` ≤ `max_seconds`."""

    metric: LatencyMetric
    quantile: float = Field(gt=0, lt=1)
    max_seconds: float = Field(gt=0)


class LatencyGateConfig(GateConfigBase):
    min_samples: int = Field(default=300, ge=1)
    metrics: tuple[LatencyMetric, ...] = ("e2e", "ttft", "tpot")
    quantiles: tuple[float, ...] = (0.99,)
    max_ratio: float = Field(default=1.2, gt=0, description="speculative / baseline quantile")
    slos: tuple[LatencySLO, ...] = ()
    alarm_factor: float = Field(
        default=3.0,
        gt=1,
        description="the tail detector's alternative: the speculative arm exceeds a tail "
        "level this many times as often as max_ratio × the baseline (an SLO: as 1 − quantile)",
    )
    median_alarm_share: float = Field(
        default=0.65,
        gt=0.5,
        lt=0.9,
        description="the median detector's alternative: this share of pairs (of a burst "
        "cycle's concurrent pairs: of cycles) above max_ratio, 0.5 at the tolerance (a "
        "second chart watches 0.9)",
    )
    bootstrap_resamples: int = Field(default=1000, ge=100)
    bootstrap_seed: int = 0
    max_regression: float = Field(
        default=0.10,
        gt=0,
        lt=1,
        description="the regression check: the arm's typical paired ratio may rise this "
        "much above its own healthy ratio, pinned from the first regression_pin_pairs "
        "pairs of the evidence (an arm 25 % faster than its baseline that turns 1.5× "
        "slower stays inside max_ratio; this check catches it)",
    )
    regression_metrics: tuple[LatencyMetric, ...] = Field(
        default=("e2e",), description="metrics with a regression check (each one detector)"
    )
    regression_pin_pairs: int = Field(
        default=1000,
        ge=10,
        description="pairs that pin the arm's healthy ratio (the first of the evidence); "
        "fewer make the pin margin, and so the time to detect, larger (gate_power's "
        "latency_x1.5, 12 seeds: 500 pairs 408, 1,000 pairs 303); more arm the check later "
        "after each transition (1,000 pairs: 8.3 h on a 30 s schedule)",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_shift_alarm_factor(cls, data: Any) -> Any:
        if isinstance(data, dict) and "shift_alarm_factor" in data:
            raise ValueError(
                "shift_alarm_factor was the alternative of a Gaussian median detector, which "
                "a few stalled pairs could trip; the median detector is a sign test now: "
                "remove the key (median_alarm_share, default 0.65, is its alternative)"
            )
        return data

    @model_validator(mode="after")
    def _quantiles_in_range(self) -> LatencyGateConfig:
        check_quantiles_and_metrics(self.quantiles, self.metrics, "e2e, ttft, tpot, itl")
        return self


class ErrorGateConfig(GateConfigBase):
    max_excess_rate: float = Field(
        default=0.01,
        ge=0,
        lt=1,
        description="speculative-only minus baseline-only failure rate tolerated",
    )
    max_error_rate: float = Field(
        default=0.02,
        gt=0,
        lt=0.5,
        description="the ceiling's floor: the speculative arm's own failure rate (where the "
        "baseline succeeded, and on the lead_pairs before) tolerated however rarely the "
        "baseline fails; the ceiling's edge is the larger of this and the baseline's own "
        "failure rate (equal arms on flaky infrastructure never FAIL it)",
    )
    alarm_factor: float = Field(
        default=2.0, gt=1, description="the ceiling detector's alternative, × its edge"
    )
    lead_pairs: int = Field(
        default=3,
        ge=0,
        description="a failure right after the other arm's may be its collateral (a shared "
        "node one arm takes down fails the other's next requests): the ceiling counts an "
        "arm's failures only where the other arm succeeded on this many pairs before, and "
        "a cluster whose such failures lean to the speculative arm is no shared outage",
    )
    outage_spans: tuple[int, ...] = Field(
        default=(5, 10, 20, 40),
        description="shared outages: spans of consecutive pairs scanned for a cluster of "
        "baseline failures too dense for the window's own baseline failure rate; a cluster "
        "is left out only where the speculative arm too failed improbably often for its own "
        "rate (an outage strikes both arms); [] turns the screen off",
    )
    outage_alpha: float = Field(
        default=0.01,
        gt=0,
        lt=0.5,
        description="shared outages: a span is a cluster when a calm baseline would fail that "
        "often in it with probability at most this (binomial tail at the window's rate)",
    )
    outage_margin_pairs: int = Field(
        default=10,
        ge=0,
        description="shared outages: pairs on each side of a cluster left out with it (an "
        "outage starts before the baseline's first failure in it)",
    )
    settle_pairs: int = Field(
        default=10,
        ge=0,
        description="the newest pairs not yet judged: a pair counts once this many later "
        "pairs show whether it was part of a shared outage (a dead arm is the liveness "
        "gate's, which reads every pair at once)",
    )
    outage_evidence_alpha: float = Field(
        default=1e-3,
        gt=0,
        lt=0.5,
        description="shared outages: none is left out when the window's clusters, pooled "
        "from first to last baseline failure, lean to the speculative arm (its failures "
        "alone, or those the baseline neither shared nor preceded within lead_pairs, "
        "against the baseline's: two one-sided binomial tests, each at half this); an "
        "outage strikes both arms alike",
    )
    max_outage_share: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="no PASS (INCONCLUSIVE) while more than this share of the newest "
        "min_samples settled pairs lie in shared outages: the gate would be judging the "
        "pairs before them",
    )
    stale_pairs: int = Field(
        default=60,
        ge=0,
        description="no PASS (INCONCLUSIVE) when the newest judged pair has more than this "
        "many settled pairs after it, all left out (both arms failed, or shared outages)",
    )

    @field_validator("outage_spans")
    @classmethod
    def _spans(cls, spans: tuple[int, ...]) -> tuple[int, ...]:
        if any(n < 2 for n in spans):
            raise ValueError(f"outage_spans {list(spans)}: every span needs at least 2 pairs")
        return tuple(sorted(set(spans)))


class QualityGateConfig(GateConfigBase):
    score_margin: float = Field(default=0.02, ge=0, description="non-inferiority margin")
    max_mismatch_rate: float = Field(default=0.005, ge=0, lt=1, description="greedy only")
    max_loop_rate: float = Field(default=0.01, ge=0, lt=1, description="speculative-only loops")
    mismatch_alarm_factor: float = Field(
        default=4.0,
        gt=1,
        description="the mismatch detector's first alternative, × max_mismatch_rate (its bank "
        "adds 4× and 16× that)",
    )
    tie_margin_nats: float = Field(
        # Measured (benchmarks/bf16_ties.py, embedded model, 54 prompts): a bf16 arm's
        # first divergent tokens lie up to 0.25 nats apart under a bf16 judge — a bf16
        # logit of 16-32 is rounded to steps of 0.125 — so 0.2 would call some ties real.
        default=0.5,
        ge=0,
        le=5,
        description="greedy: a divergence whose tokens the baseline model scores within "
        "this many nats is a numeric tie (bf16 kernels), not counted as a mismatch",
    )
    tie_margin_max_age_days: float = Field(
        default=30.0,
        gt=0,
        le=3650,
        description="a tie margin stored by `canaryd calibrate` judges this many days after "
        "it was measured (and only while the pairs come from the engines it was measured "
        "on); then tie_margin_nats again, until the next calibration",
    )
    max_tie_rate: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="greedy: the most pairs that may diverge within tie_margin_nats (numeric "
        "ties). A bf16 deployment ties on some outputs; a kernel that takes the runner-up "
        "of every close call ties on nearly all (quality.ties; the A/A control's divergence "
        "rate's upper bound raises it)",
    )
    control_arm: str | None = Field(
        default=None,
        description="an A/A control: the name of an extra arm configured exactly like the "
        "baseline (no speculation). Its greedy divergence rate from the baseline is the "
        "deployment's own floor (batching, kernels); the mismatch check's tolerance is the "
        "larger of max_mismatch_rate and that rate's 95 % upper bound. For servers whose "
        "divergences no teacher can judge (llama.cpp, SGLang)",
    )
    distribution_margin: float = Field(
        default=0.1,
        gt=0,
        description="sampled pairs: the mean token-NLL difference (nats, speculative − "
        "baseline, under the baseline model) that matters; the alternative of both detectors",
    )
    implausible_nll_nats: float = Field(
        default=12.0,
        gt=0,
        le=100,
        description="sampled pairs: a token the baseline model scores above this NLL is "
        "implausible (garbage: a random token scores about 10–20 nats)",
    )
    max_implausible_rate: float = Field(
        default=0.01,
        ge=0,
        lt=1,
        description="sampled pairs: the tolerated share of pairs where only the "
        "speculative output has an implausible token (above the baseline-only share)",
    )


class ReferenceConfig(Strict):
    """A configured acceptance-length reference for one category."""

    mean: float = Field(gt=0)
    sd: float = Field(gt=0)


class DriftGateConfig(GateConfigBase):
    min_samples: int = Field(default=20, ge=2, description="pairs per category")
    window_pairs: int | None = Field(default=2000, ge=1)
    window_seconds: float | None = Field(default=24 * 3600.0, gt=0)
    max_relative_drop: float = Field(
        default=0.15, gt=0, lt=1, description="the smallest drop of mean acceptance that matters"
    )
    pin_min_samples: int = Field(
        default=30, ge=2, description="pairs per category before its reference is pinned"
    )
    pin_target_samples: int = Field(
        default=200,
        ge=2,
        description="pairs per category a pin grows to (from its earliest healthy pairs) "
        "before it is frozen; its mean's margin shrinks as 1/√n",
    )
    sd_floor_fraction: float = Field(default=0.05, gt=0, description="of the reference mean")
    references: dict[str, ReferenceConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _target_covers_minimum(self) -> DriftGateConfig:
        if self.pin_target_samples < self.pin_min_samples:
            raise ValueError(
                f"pin_target_samples ({self.pin_target_samples}) must be at least "
                f"pin_min_samples ({self.pin_min_samples})"
            )
        return self


class SpeedupGateConfig(GateConfigBase):
    min_samples: int = Field(default=50, ge=1)
    min_speedup: float = Field(default=1.0, gt=0)
    alarm_slower_share: float = Field(
        default=0.65,
        gt=0.5,
        lt=1,
        description="the sequential detector's alternative: this share of pairs slower "
        "than min_speedup (0.5 at the median)",
    )


class LivenessGateConfig(GateConfigBase):
    critical: bool = True
    min_samples: int = Field(default=5, ge=1)
    window_pairs: int | None = Field(
        default=500,
        ge=1,
        description="how far back a run of speculative failures may reach (a dead arm "
        "beside a baseline failing 70 % needs about 57 pairs where the baseline succeeded)",
    )
    window_seconds: float | None = Field(default=6 * 3600.0, gt=0)
    max_consecutive_failures: int = Field(
        default=5,
        ge=1,
        description="the shortest run that FAILs: the last this many pairs where the "
        "baseline succeeded all failed on the speculative arm (pairs where the baseline "
        "failed are skipped); longer where the baseline fails often, so that equal arms "
        "make such a run within liveness's share of the false-alarm budget",
    )
    rate_pairs: int = Field(
        default=50,
        ge=1,
        description="the run needed is set by the baseline's failure rate over the run's own "
        "pairs, or over this many newest pairs where that is higher or the run shorter: "
        "short, so that it follows a burst of shared failures",
    )
    max_failure_rate: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="WARN (never FAIL) when the speculative failure rate where the baseline "
        "succeeded exceeds the baseline's own failure rate in the window by this much",
    )


class ParityGateConfig(Strict):
    """The parity gate reads the latest capability probe, not a window of pairs: no
    sample size, no window, no confidence; only how it acts and how old a probe may be."""

    mode: GateMode = Field(
        default=GateMode.WARN,
        description="warn: a capability regression alerts; enforce: it rolls the switch "
        "back as any enforce gate's FAIL does (then it needs the daemon's probe: "
        "schedule.probe_interval_s > 0 and both arms OpenAI-compatible servers)",
    )
    critical: bool = False
    max_probe_age_seconds: float | None = Field(
        default=None,
        gt=0,
        description="a probe older than this is no evidence (NODATA); null: twice "
        "schedule.probe_interval_s plus 10 minutes (2 h 10 min when the daemon does not "
        "probe and `canaryd probe --config` stores the probes)",
    )


class TelemetryGateConfigBase(GateConfigBase):
    """What every telemetry gate has besides `GateConfigBase`: how long its evidence may
    stop before its decision expires (`gates.telemetry.silence`)."""

    max_silence_s: float = Field(
        default=300.0,
        gt=0,
        description="evidence expires: an arm the gate reads with no interval (no successful "
        "scrape) or no request for this long, or for max_silence_intervals of its scrape "
        "intervals where that is longer, makes the gate NODATA, naming the arm and why",
    )
    max_silence_intervals: int = Field(
        default=10,
        ge=1,
        description="evidence expires after this many of the arm's scrape intervals (its "
        "median interval) without an interval or a request, where longer than max_silence_s",
    )


class TelemetryErrorGateConfig(TelemetryGateConfigBase):
    """`telemetry.errors`: the speculative arm's error rate per production request may
    exceed the baseline's by at most `max_excess_rate`, and so may its rate of 4xx answers
    where both arms' sources report status codes. The window is counted in scrape
    intervals (`window_pairs`) and seconds; `min_samples` in requests per arm."""

    min_samples: int = Field(
        default=500,
        ge=1,
        description="requests per arm before a PASS (100 s at 5 requests per second)",
    )
    window_pairs: int | None = Field(
        default=None,
        ge=1,
        description="telemetry: the last this many scrape intervals (null: window_seconds alone)",
    )
    window_seconds: float | None = Field(default=6 * 3600.0, gt=0)
    max_excess_rate: float = Field(
        default=0.01,
        ge=0,
        lt=1,
        description="speculative minus baseline error rate per request tolerated",
    )
    alarm_factor: float = Field(
        default=2.0,
        gt=1,
        description="the detector's first alternative, × the tolerated edge (the baseline's "
        "rate plus max_excess_rate); its bank adds 4× and 16× that",
    )
    outage_alpha: float = Field(
        default=0.001,
        gt=0,
        lt=0.5,
        description="shared outages: a baseline interval with more errors than a calm "
        "baseline (failing at the window's rate) makes with probability at most this is "
        "an outage; speculative intervals overlapping it are judged only on the failures "
        "beyond the outage's own rate there",
    )
    outage_margin_intervals: int = Field(
        default=1,
        ge=0,
        description="shared outages: baseline intervals on each side of an outage left "
        "out with it (an outage starts before the first error it causes is counted)",
    )


TelemetryLatencyMetric = Literal["e2e", "ttft", "itl"]


class TelemetryLatencyGateConfig(TelemetryGateConfigBase):
    """`telemetry.latency`: the speculative arm's production latency quantiles (e2e, TTFT,
    ITL) may be at most `max_ratio` × the baseline's, judged from the engines' latency
    histograms over intervals where both arms carried the same load per replica.
    `min_samples` counts requests per arm at matched load."""

    min_samples: int = Field(
        default=500,
        ge=1,
        description="requests per arm at matched load before a PASS (100 s at 5 per second)",
    )
    window_pairs: int | None = Field(
        default=None,
        ge=1,
        description="telemetry: the last this many scrape intervals (null: window_seconds alone)",
    )
    window_seconds: float | None = Field(default=3600.0, gt=0)
    metrics: tuple[TelemetryLatencyMetric, ...] = ("e2e", "ttft", "itl")
    quantiles: tuple[float, ...] = (0.5, 0.99)
    max_ratio: float = Field(
        default=1.2, gt=1, description="speculative / baseline quantile tolerated"
    )
    alarm_factor: float = Field(
        default=2.0,
        gt=1,
        description="the detector's first alternative: the speculative arm's odds of "
        "exceeding max_ratio × the baseline's quantile, × this (its bank adds 4× and 16× that)",
    )
    itl_per_token: bool = Field(
        default=True,
        description="divide an arm's inter-token latencies by its acceptance length over the "
        "window (a speculative step streams that many tokens as one observation)",
    )
    max_load_difference: float = Field(
        default=0.2,
        gt=0,
        lt=1,
        description="matched load: an interval is compared only when the arms' requests per "
        "second per replica (over the two minutes around it) differ by at most this "
        "fraction of the larger; where an arm counts no requests, their requests running + "
        "waiting per replica. 0.2 keeps a healthy arm within max_ratio 1.2 for latency up "
        "to ∝ load^0.8",
    )

    @model_validator(mode="after")
    def _quantiles_in_range(self) -> TelemetryLatencyGateConfig:
        check_quantiles_and_metrics(self.quantiles, self.metrics, "e2e, ttft, itl")
        return self


class TelemetryAcceptanceGateConfig(TelemetryGateConfigBase):
    """`telemetry.acceptance`: the speculative arm's acceptance length on all production
    traffic (1 + accepted ÷ drafts, from the engine's counters) may fall at most
    `max_relative_drop` below its reference: `reference_acceptance_length` when set,
    else one pinned from the arm's own healthy telemetry. `min_samples` counts drafts
    (verify steps)."""

    min_samples: int = Field(
        default=2000,
        ge=1,
        description="drafts (verify steps) before a PASS (10 s at 5 requests per second "
        "of ~100 tokens)",
    )
    min_intervals: int = Field(
        default=4,
        ge=3,
        description="scrape intervals with drafts before a PASS (their spread is the noise)",
    )
    window_pairs: int | None = Field(
        default=None,
        ge=1,
        description="telemetry: the last this many scrape intervals (null: window_seconds alone)",
    )
    window_seconds: float | None = Field(default=6 * 3600.0, gt=0)
    max_relative_drop: float = Field(
        default=0.15,
        gt=0,
        lt=1,
        description="drop of acceptance length below the reference tolerated",
    )
    alarm_relative_drop: float = Field(
        default=0.25,
        gt=0,
        lt=1,
        description="the detector's first alternative, a drop this large (its bank adds "
        "halfway to no acceptance at all, and none at all)",
    )
    reference_acceptance_length: float | None = Field(
        default=None,
        gt=1,
        description="a configured reference (taken as exact); null: pinned from telemetry",
    )
    pin_min_drafts: int = Field(
        default=20_000,
        ge=100,
        description="drafts the pinned reference is computed from (the first of the evidence)",
    )
    pin_min_intervals: int = Field(
        default=8,
        ge=3,
        description="scrape intervals with drafts the pinned reference spans at least",
    )

    @model_validator(mode="after")
    def _alarm_beyond_tolerance(self) -> TelemetryAcceptanceGateConfig:
        if self.alarm_relative_drop <= self.max_relative_drop:
            raise ValueError(
                f"alarm_relative_drop={self.alarm_relative_drop!r} must exceed "
                f"max_relative_drop={self.max_relative_drop!r}"
            )
        return self


class TelemetryGatesConfig(Strict):
    """`[gates.telemetry.<gate>]`: the gates over the arms' own production telemetry
    (`telemetry.errors`, `telemetry.latency`, `telemetry.acceptance`: gates/telemetry/).
    They run, and take their share of the false-alarm budget, only where the caller
    judges with telemetry evidence (canaryd's `[telemetry]` configured); their windows
    count scrape intervals and seconds, their `min_samples` production requests (drafts
    for `telemetry.acceptance`)."""

    errors: TelemetryErrorGateConfig = TelemetryErrorGateConfig()
    latency: TelemetryLatencyGateConfig = TelemetryLatencyGateConfig()
    acceptance: TelemetryAcceptanceGateConfig = TelemetryAcceptanceGateConfig()


class GatesConfig(Strict):
    budget: BudgetConfig = BudgetConfig()
    liveness: LivenessGateConfig = LivenessGateConfig()
    error: ErrorGateConfig = ErrorGateConfig()
    latency: LatencyGateConfig = LatencyGateConfig()
    quality: QualityGateConfig = QualityGateConfig()
    speedup: SpeedupGateConfig = SpeedupGateConfig()
    drift: DriftGateConfig = DriftGateConfig()
    parity: ParityGateConfig = ParityGateConfig()
    telemetry: TelemetryGatesConfig = TelemetryGatesConfig()
    policy: SwitchPolicyConfig = SwitchPolicyConfig()
