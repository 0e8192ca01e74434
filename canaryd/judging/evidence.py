"""Which stored pairs and telemetry are evidence: the window of an arm that a judgement
reads.

The pieces the one reader (`canaryd.judging.reader.gather`) reads with: `read_window` asks
the store for the pairs of the longest gate window (`gates.cycle.window_bounds`) up to a
time, optionally cut to a revision's window and one category, and `under_current_arms`
keeps only the pairs measured with the arms configured now. `read_telemetry` does the same
for the arms' production telemetry: the scrape intervals of the baseline and the arm in
the longest telemetry gate window (`telemetry_seconds`), cut to a revision's window,
stored under the arms key of each as configured now (a new draft model, or a new
baseline, starts from nothing).
`acceptance_reference` pins the speculative arm's acceptance reference from that evidence
when none is configured: its earliest intervals (`gates.telemetry.acceptance.
pin_acceptance_reference`), recomputed at every judgement from what is stored, so a
restart pins the same; the reference thus slides with the window once the evidence is
older than it, and `telemetry.acceptance` catches a drop that happens within the window.
A revision is judged against what came before it: `prior_acceptance_reference` pins from
the arm's newest intervals before the revision's window opened (the revision it replaces),
so a revision that accepts less from its first request on is measured against its
predecessor, not against itself; the verdict falls back to the revision's own first
intervals when too little telemetry precedes it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import structlog

from canaryd.config import Settings
from canaryd.config.arms import arm_key, arm_pair_config
from canaryd.store import HistoryStore, TelemetryStore
from canaryd.telemetry.config import source_arm, stable_source
from gates.config import GatesConfig
from gates.cycle import TELEMETRY_GATES, section, window_bounds
from gates.records import BASELINE_ARM, PairRecord
from gates.telemetry.acceptance import AcceptanceReference, pin_acceptance_reference
from gates.telemetry.intervals import ArmTelemetry, TelemetryEvidence, TelemetryInterval

__all__ = [
    "acceptance_reference",
    "prior_acceptance_reference",
    "read_telemetry",
    "read_window",
    "telemetry_seconds",
    "under_current_arms",
]

log = structlog.get_logger(__name__)


def under_current_arms(
    settings: Settings, store: HistoryStore, records: list[PairRecord], arm: str
) -> list[PairRecord]:
    """Only pairs of `arm` measured with the baseline and `arm` configured as in `settings`
    count as evidence.

    After a reload or restart that changed the arm or the baseline (a new draft model,
    another k), the old pairs say nothing about the new ones: a restore must not rest on
    them. Other arms added, changed or removed leave them standing. A run that recorded no
    arms configuration (not written by canaryd) is kept.
    """
    run_ids = {record.run_id for record in records}
    if not run_ids:
        return records
    current = arm_pair_config(settings.snapshot().get("arms"), arm)
    arms_of = {
        run_id: run.info.config.get("arms") for run_id, run in store.runs_by_id(run_ids).items()
    }
    kept = [
        r
        for r in records
        if arms_of.get(r.run_id) is None or arm_pair_config(arms_of[r.run_id], arm) == current
    ]
    if len(kept) < len(records):
        log.info(
            "gates.window_filtered",
            arm=arm,
            dropped=len(records) - len(kept),
            reason="pairs measured with a different arms configuration",
        )
    return kept


def read_window(
    store: HistoryStore,
    settings: Settings,
    arm: str,
    at: datetime,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    category: str | None = None,
) -> list[PairRecord]:
    """The pairs of `arm` in the longest gate window up to `at` (inclusive), from `start`
    and before `end` when given (a revision's window), of `category` when given, measured
    under the arms configured now."""
    seconds, limit = window_bounds(settings.gates)
    since = at - timedelta(seconds=seconds) if seconds is not None else None
    if start is not None:
        since = start if since is None else max(since, start)
    until = at + timedelta(microseconds=1)
    if end is not None:
        until = min(until, end)
    records = store.pairs(since=since, until=until, limit=limit, arm=arm, category=category)
    return under_current_arms(settings, store, records, arm)


def telemetry_seconds(config: GatesConfig) -> float | None:
    """The longest window any telemetry gate reads, in seconds; None: unbounded (a gate
    counting scrape intervals alone)."""
    seconds = [section(config, name).window_seconds for name in TELEMETRY_GATES]
    if not seconds or None in seconds:
        return None
    return max(s for s in seconds if s is not None)


def read_telemetry(
    store: TelemetryStore,
    settings: Settings,
    arm: str,
    at: datetime,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
) -> TelemetryEvidence | None:
    """The baseline's and `arm`'s scrape intervals that lie in the longest telemetry gate
    window up to `at`, from `start` and up to `end` when given (a revision's window),
    measured under each arm's configuration of now; None when `[telemetry]` names no arm
    (the telemetry gates then do not run). An arm without a source has no intervals; the
    arm's concurrent stable (`[telemetry.arms.<arm>.stable]`) is read beside it."""
    if not settings.telemetry.enabled:
        return None
    seconds = telemetry_seconds(settings.gates)
    since = at - timedelta(seconds=seconds) if seconds is not None else None
    if start is not None:
        since = start if since is None else max(since, start)
    until = at if end is None else min(at, end)

    def intervals(name: str) -> ArmTelemetry:
        if name not in settings.telemetry.sources():
            return ArmTelemetry()
        key = arm_key(settings, source_arm(name))
        stored = store.telemetry(name, arms=key, since=since, until=until)
        return ArmTelemetry.of(s.interval for s in stored)

    return TelemetryEvidence(
        baseline=intervals(BASELINE_ARM),
        speculative=intervals(arm),
        stable=intervals(stable_source(arm)),
    )


def acceptance_reference(
    evidence: TelemetryEvidence | None,
    config: GatesConfig,
    now: datetime,
    *,
    since: datetime | None = None,
) -> AcceptanceReference | None:
    """The speculative arm's acceptance reference pinned from `evidence` (from `since`):
    None without evidence, while too few drafts are in it, or when
    `gates.telemetry.acceptance.reference_acceptance_length` is configured (the gate
    takes that one itself)."""
    section_config = config.telemetry.acceptance
    if evidence is None or section_config.reference_acceptance_length is not None:
        return None
    return pin_acceptance_reference(evidence.speculative, section_config, now=now, since=since)


def prior_acceptance_reference(
    store: TelemetryStore,
    settings: Settings,
    arm: str,
    before: datetime,
) -> AcceptanceReference | None:
    """The speculative arm's acceptance pinned from its newest stored intervals that ended
    by `before` (a revision's start), within the telemetry window: the newest intervals
    with drafts, enough for `pin_min_drafts` and `pin_min_intervals`; None when there are
    not that many, or a reference is configured."""
    config = settings.gates.telemetry.acceptance
    if config.reference_acceptance_length is not None:
        return None
    evidence = read_telemetry(store, settings, arm, before)
    if evidence is None:
        return None
    chosen: list[TelemetryInterval] = []
    drafts = 0
    for interval in reversed(evidence.speculative.window(before, window_seconds=None)):
        if not interval.drafts:
            continue
        chosen.append(interval)
        drafts += interval.drafts
        if drafts >= config.pin_min_drafts and len(chosen) >= config.pin_min_intervals:
            return pin_acceptance_reference(ArmTelemetry.of(chosen), config, now=before)
    return None
