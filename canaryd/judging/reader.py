"""The one reader of evidence: everything a judgement reads from the store, gathered once.

`gather` reads, for one arm at one time, the tie margin calibrated for the arms
(`tie_margin_for`: while it applies to the engines behind the pairs, `judged_engines`,
and has not expired), the pairs of the longest gate window (`canaryd.judging.evidence.
read_window`), the drift references, the arms' production telemetry (`read_telemetry`)
and the acceptance reference pinned from it, the capability probe, the control arm's pairs
and the pair rate, into one `gates.evidence.Evidence` that `gates.cycle.judge` judges. The
daemon's gate job, the verdict per revision and `canaryd judge` all gather here, and
differ only in the arguments: the gate job's own judgement passes the switch's state and
reads the probe and the control arm; every gate job judgement pins drift references
(`pin`, the only write here); a comparison arm is judged under `advisory` config with no
state; the verdict reads a revision's window and never writes; `canaryd judge` holds its
pairs and its recorder's telemetry in memory (`Held`). The quality decision names the tie
margin in `gates.cycle.judge`, from the evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import structlog

from canaryd.config import Settings
from canaryd.config.arms import arm_key
from canaryd.judging.calibration import expires_at, not_applicable, run_engines_key
from canaryd.judging.evidence import (
    acceptance_reference,
    prior_acceptance_reference,
    read_telemetry,
    read_window,
)
from canaryd.parity.stored import latest_probe
from canaryd.store import CalibrationStore, HistoryStore, RevisionWindow, Store
from gates import ReferenceStats, SwitchState
from gates.config import GatesConfig
from gates.cycle import may_pin, pins
from gates.evidence import Evidence, MarginSource
from gates.records import PairRecord
from gates.telemetry.acceptance import AcceptanceReference
from gates.telemetry.intervals import TelemetryEvidence

__all__ = [
    "Held",
    "RateReader",
    "gather",
    "judged_engines",
    "pinned_references",
    "tie_margin_for",
]

log = structlog.get_logger(__name__)

# How a caller reads the pair rate: `canaryd.judging.rate.pair_rate`, or the gate job's
# copy of it measured again every `RATE_REFRESH`.
RateReader = Callable[[Store, str, datetime], float]


@dataclass(frozen=True, slots=True)
class Held:
    """Evidence a caller holds in memory instead of reading it from the store (`canaryd
    judge`): the pairs it ran, the drift references it read at its start, and the
    telemetry its recorder scraped (None: telemetry is not configured)."""

    pairs: Sequence[PairRecord]
    references: Mapping[str, ReferenceStats]
    telemetry: TelemetryEvidence | None = None


def tie_margin_for(
    store: CalibrationStore,
    settings: Settings,
    arm: str,
    config: GatesConfig,
    now: datetime,
    engines: str | None = None,
) -> MarginSource:
    """The tie margin to judge `arm` with at `now`: the one calibrated (`canaryd
    calibrate`) under `arm`'s current arms key when the store holds one that still
    applies to pairs run on `engines` (`canaryd.judging.calibration.not_applicable`:
    not expired, the same engines; None: unknown), else `config`'s, saying why the
    stored one did not judge. A changed arm configuration has another key, so its old
    calibration is never read."""
    stored = store.tie_margin(arm_key(settings, arm))
    configured = MarginSource(config.quality.tie_margin_nats, "configured")
    if stored is None:
        return configured
    max_age = config.quality.tie_margin_max_age_days
    reason = not_applicable(stored, now, max_age, engines)
    if reason is not None:
        return replace(configured, calibrated_at=stored.calibrated_at, not_applied=reason)
    return MarginSource(
        stored.margin,
        "calibrated",
        stored.calibrated_at,
        pairs=stored.aa_divergent_pairs or 0,
        aa_arm=stored.aa_arm or "",
        expires_at=expires_at(stored.calibrated_at, max_age),
    )


def judged_engines(store: HistoryStore, records: Sequence[PairRecord], arm: str) -> str | None:
    """The `engines_key` of the run behind the newest of `records` (the engines judged
    now); None without records or when that run is not stored."""
    if not records:
        return None
    run_id = records[-1].run_id
    run = store.runs_by_id([run_id]).get(run_id)
    return None if run is None else run_engines_key(run.info, arm)


def pinned_references(
    store: Store,
    settings: Settings,
    records: Sequence[PairRecord],
    arm: str,
    now: datetime,
    state: SwitchState | None,
) -> dict[str, ReferenceStats]:
    """The drift references of `arm` as configured now; categories without one are
    first pinned from `records`, and pins still short of `pin_target_samples` pairs
    grow from them, when the pin rule allows (`gates.cycle.pins`; `state` None: always,
    as for a comparison arm, whose traffic is its own whatever the switch does)."""
    arms = arm_key(settings, arm)
    references = store.drift_references(arms)
    pinned = pins(records, references, state or SwitchState(), settings.gates, now)
    if pinned:
        store.pin_drift_references(pinned, now, arms, replace=True)
        log.info(
            "gates.references_pinned",
            categories=sorted(pinned),
            pairs={c: r.n for c, r in sorted(pinned.items())},
            arms=arms,
            arm=arm,
        )
        references = store.drift_references(arms)
    return references


def _acceptance(
    store: Store,
    settings: Settings,
    arm: str,
    now: datetime,
    config: GatesConfig,
    telemetry: TelemetryEvidence | None,
    state: SwitchState | None,
    window: RevisionWindow | None,
) -> AcceptanceReference | None:
    """The speculative arm's acceptance reference: a revision's is pinned from the
    revision it replaces (`prior_acceptance_reference`), else from its own first
    intervals; the switch's from the telemetry since its last transition, and only from
    healthy telemetry (`gates.cycle.may_pin`), as the drift references are."""
    if telemetry is None:
        return None
    if window is not None:
        return prior_acceptance_reference(
            store, settings, arm, window.started_at
        ) or acceptance_reference(telemetry, config, now, since=window.started_at)
    if state is not None and not may_pin(state):
        return None
    return acceptance_reference(
        telemetry, config, now, since=state.since if state is not None else None
    )


def gather(
    store: Store,
    settings: Settings,
    arm: str,
    now: datetime,
    *,
    config: GatesConfig | None = None,
    state: SwitchState | None = None,
    window: RevisionWindow | None = None,
    category: str | None = None,
    pin: bool = False,
    probe: bool = False,
    control: bool = False,
    rate: RateReader | None = None,
    held: Held | None = None,
    subject: str = "the window",
) -> Evidence:
    """The evidence on `arm` at `now`, read once.

    `config`: the gates config it will be judged under (default `settings.gates`;
    `advisory` for a comparison arm). `state`: the switch's state, for the switch's own
    judgement. `window`: a revision's evidence window, which cuts the pairs and the
    telemetry and starts the evidence (at its start, or an operator's later restore);
    `category`: only that category's pairs, and no telemetry (production telemetry has
    no categories). `pin`: pin and grow the drift
    references from the window first (`pinned_references`; else they are only read).
    `probe`: judge the latest capability probe; `control`: read the A/A control arm's
    pairs (`quality.control_arm`). `rate`: how to read the pair rate (None: judged at the
    design rate). `held`: the pairs, references and telemetry the caller holds; the store
    then gives only the tie margin (and the pair rate, with `rate`). `subject` names the
    evidence in the verdict's reason."""
    config = settings.gates if config is None else config
    start = window.evidence_start if window is not None else None
    end = window.ended_at if window is not None else None
    if held is not None:
        records, references, telemetry = held.pairs, held.references, held.telemetry
    else:
        records = read_window(store, settings, arm, now, start=start, end=end, category=category)
        references = (
            pinned_references(store, settings, records, arm, now, state)
            if pin
            else store.drift_references(arm_key(settings, arm))
        )
        telemetry = (
            None
            if category is not None
            else read_telemetry(store, settings, arm, now, start=start, end=end)
        )
    engines = judged_engines(store, records, arm)
    tie_margin = tie_margin_for(store, settings, arm, config, now, engines)
    control_arm = config.quality.control_arm if control else None
    return Evidence(
        records=records,
        references=references,
        state=state,
        since=start,
        control=read_window(store, settings, control_arm, now) if control_arm else None,
        subject=subject,
        probe=latest_probe(store, settings) if probe else None,
        with_probe=probe,
        probe_interval_s=settings.schedule.probe_interval_s,
        telemetry=telemetry,
        scrape_interval_s=settings.telemetry.scrape_interval_s,
        acceptance_reference=_acceptance(
            store, settings, arm, now, config, telemetry, state, window
        ),
        tie_margin=tie_margin,
        pair_rate=rate(store, arm, now) if rate is not None else None,
    )
