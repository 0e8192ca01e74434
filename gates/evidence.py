"""What one judgement reads: the `Evidence` value, and the tie margin that comes with it.

Every judging path (the daemon's gate job, the verdict per revision, `canaryd judge`,
the benchmarks) gathers its evidence once into an `Evidence` and hands it to
`gates.cycle.judge` with the gates config and the time; the daemon's side gathers it
from the store in one reader (`canaryd.judging.reader`). Evidence is what was measured or
pinned from measurements: the pairs, the drift references, the switch's state, the
capability probe, both arms' production telemetry and the acceptance reference pinned
from it, the tie margin calibrated on the deployment and where it came from, the pair
rate on the database, and the cadence at which the probe and the telemetry are taken.
What the asker demands of it (`min_pairs`) is no evidence and stays an argument of
`judge`; the configuration is the policy it is judged under. `MarginSource` and
`with_tie_margin` are the pure half of the tie margin: which one judged, and the config
copy that judges with it. Pure, as every module of `gates`: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

from gates.config import GatesConfig
from gates.core import GateDecision, ReferenceStats
from gates.parity import UNSCHEDULED_INTERVAL_S, ProbeEvidence
from gates.records import BASELINE_ARM, PairRecord
from gates.stats.budget import rebudget
from gates.switch.policy import SwitchState
from gates.telemetry.acceptance import AcceptanceReference
from gates.telemetry.intervals import TelemetryEvidence

__all__ = ["Evidence", "MarginSource", "with_tie_margin"]

# The decision whose detail names the tie margin: the only gate that judges ties.
QUALITY = "quality"


@dataclass(frozen=True, slots=True)
class MarginSource:
    """The tie margin a judgement used and where it came from: `configured`
    (`gates.quality.tie_margin_nats`; `not_applied` says why a stored calibration of
    `calibrated_at` did not judge instead, empty when none is stored) or `calibrated`
    (`canaryd calibrate` at `calibrated_at`, bounded on `pairs` divergent A/A pairs of
    the baseline against `aa_arm`, judging until `expires_at`)."""

    margin: float
    origin: Literal["configured", "calibrated"]
    calibrated_at: datetime | None = None
    pairs: int = 0
    aa_arm: str = ""
    expires_at: datetime | None = None
    not_applied: str = ""

    def describe(self) -> str:
        if self.origin == "configured" or self.calibrated_at is None:
            described = (
                f"tie margin {self.margin:.4g} nats (configured: gates.quality.tie_margin_nats)"
            )
            if self.not_applied and self.calibrated_at is not None:
                described += (
                    f"; the calibration of {_iso(self.calibrated_at)} does not judge: "
                    f"{self.not_applied}"
                )
            return described
        against = "itself" if self.aa_arm in ("", BASELINE_ARM) else f"arm {self.aa_arm}"
        until = f", until {_iso(self.expires_at)}" if self.expires_at is not None else ""
        return (
            f"tie margin {self.margin:.4g} nats (calibrated at {_iso(self.calibrated_at)} "
            f"from {self.pairs} divergent A/A pairs, the baseline against {against}{until})"
        )

    def note(self, decisions: Sequence[GateDecision]) -> tuple[GateDecision, ...]:
        """`decisions` with the quality decision's detail naming this margin."""
        described = self.describe()
        return tuple(
            replace(d, detail=f"{d.detail}; {described}" if d.detail else described)
            if d.name == QUALITY
            else d
            for d in decisions
        )


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="seconds")


def with_tie_margin(config: GatesConfig, margin: float) -> GatesConfig:
    """A copy of `config` judging ties within `margin` nats (the operator's object is not
    touched)."""
    quality = config.quality.model_copy(update={"tie_margin_nats": margin})
    return config.model_copy(update={"quality": quality})


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything one judgement reads besides the gates config and the time.

    `records`: the pairs of the longest gate window up to the judgement's time, oldest
    first (`gates.cycle.window_bounds`); `control`: the A/A control arm's pairs
    (`quality.control_arm`), None without one; `references`: the drift references of the
    arms as configured now. `state`: the switch's state when the judgement is the switch's
    own: its last transition starts the evidence and its categories' own moves start
    theirs. `since` starts the evidence instead (a revision's window) and ignores the
    state's. `subject` names the evidence in the verdict's reason ("revision 'abc'"): it
    says which pairs these are, so it travels with them.

    `probe`: the latest capability probe (None: none yet), judged only `with_probe` (the
    daemon's own judgement), taken every `probe_interval_s`. `telemetry`: both arms'
    production telemetry, scraped every `scrape_interval_s` seconds (required with it),
    empty when nothing was scraped yet and None where telemetry is not configured (the
    telemetry gates then do not run); `acceptance_reference`: the speculative arm's
    healthy acceptance pinned from it (None: not pinned yet). `tie_margin`: the tie
    margin calibrated on the deployment, or the configured one, and where it came from
    (None: the config's, unannounced); `pair_rate`: the pairs a minute measured on the
    database (None: judged at the budget's design rate)."""

    records: Sequence[PairRecord] = ()
    references: Mapping[str, ReferenceStats] | None = None
    state: SwitchState | None = None
    since: datetime | None = None
    control: Sequence[PairRecord] | None = None
    subject: str = "the window"
    probe: ProbeEvidence | None = None
    with_probe: bool = False
    probe_interval_s: float = UNSCHEDULED_INTERVAL_S
    telemetry: TelemetryEvidence | None = None
    scrape_interval_s: float | None = None
    acceptance_reference: AcceptanceReference | None = None
    tie_margin: MarginSource | None = None
    pair_rate: float | None = None

    def __post_init__(self) -> None:
        if self.telemetry is not None and self.scrape_interval_s is None:
            raise ValueError("telemetry evidence needs its scrape_interval_s (the budget's unit)")

    @property
    def start(self) -> datetime | None:
        """Where the evidence starts: `since`, else the switch's last transition."""
        if self.since is not None:
            return self.since
        return self.state.since if self.state is not None else None

    @property
    def category_since(self) -> Mapping[str, datetime] | None:
        """Where each category's own evidence starts (its own last move), from the state;
        None under an explicit `since`."""
        if self.state is None or self.since is not None:
            return None
        return self.state.category_since()

    def judged_config(self, config: GatesConfig) -> GatesConfig:
        """The config this evidence is judged with: `config` with the calibrated tie
        margin (a configured one is `config`'s own already), sized for the pair rate
        (`gates.stats.budget.rebudget`)."""
        if self.tie_margin is not None and self.tie_margin.origin == "calibrated":
            config = with_tie_margin(config, self.tie_margin.margin)
        return rebudget(config, self.pair_rate)
