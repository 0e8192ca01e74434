"""The one judging path: which pairs a judgement reads, every gate over them, one verdict.

The daemon's gate job, `GET /v1/verdict`, `canaryd judge` and the power benchmark all judge
a window here, so they cannot disagree: each gathers one `gates.evidence.Evidence` and
calls `judge(evidence, config, now)`. `GATES` is the registry: one `GateSpec` per gate,
named as its `GatesConfig` section and its decisions; a new gate is one module plus one
line there. Pair gates read a window of `PairRecord`s; the probe gate (parity) reads the
latest capability probe and runs only where the caller has one (the daemon); the
telemetry gates (`telemetry.errors`, `.latency`, `.acceptance`) read both arms' production
telemetry (and the acceptance reference pinned from it) and run only
where the caller passes it, taking their share of the budget only then. `judge` runs
them all and `combine`s the enforce gates into one `Verdict`; `window_bounds`,
`latest_window`, `may_pin`, `pins`, `suspicion` and `advisory` are the rules around a
judgement that every caller shares. Pure, as every module of `gates`: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from gates.config import GatesConfig
from gates.config_base import GateConfigBase
from gates.core import GateDecision, GateMode, GateState, ReferenceStats, checks, combine_states
from gates.evidence import Evidence
from gates.pairs.drift import drift_gate, grow_references
from gates.pairs.error_rate import error_gate
from gates.pairs.latency import latency_gate
from gates.pairs.liveness import liveness_gate
from gates.pairs.quality import quality_gate
from gates.pairs.speedup import speedup_gate
from gates.parity import UNSCHEDULED_INTERVAL_S, ProbeEvidence, parity_gate
from gates.records import PairRecord
from gates.stats.budget import (
    DEFAULT_ARL0,
    DEFAULT_DETECTOR_BUDGET,
    detector_arl0,
    detector_budget,
    rate_ratio,
    telemetry_arl0,
)
from gates.switch.policy import SwitchMode, SwitchState
from gates.telemetry.acceptance import AcceptanceReference, telemetry_acceptance_gate
from gates.telemetry.errors import telemetry_errors_gate
from gates.telemetry.intervals import TelemetryEvidence
from gates.telemetry.latency import telemetry_latency_gate
from gates.telemetry.mix import screen_past_reference

__all__ = [
    "GATES",
    "PAIR_GATES",
    "TELEMETRY_GATES",
    "Context",
    "GateSpec",
    "Judgement",
    "Verdict",
    "advisory",
    "combine",
    "distinct",
    "evaluate_all",
    "judge",
    "latest_window",
    "may_pin",
    "pins",
    "section",
    "suspicion",
    "window_bounds",
]

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE", "NODATA"]


@dataclass(frozen=True, slots=True)
class Context:
    """Everything a gate reads besides its own config section: the time, the budget's
    share, the evidence's start and the three cuts of the window.

    `records`: every pair of the window (the gates on all traffic); `own`: each category's
    pairs after its own last move (`category_since`); `split`: what the gates that may
    judge per category read (`own` under `policy.scope = "category"`, else `records`).
    `telemetry`: both arms' production telemetry, None where the caller has none;
    `telemetry_arl0`: each telemetry detector's share of the budget, in scrape intervals;
    `acceptance_reference`: the speculative arm's healthy acceptance, pinned by the caller."""

    now: datetime
    arl0: float
    budget_30d: float
    since: datetime | None
    by_category: bool
    records: Sequence[PairRecord]
    own: Sequence[PairRecord]
    split: Sequence[PairRecord]
    references: Mapping[str, ReferenceStats] | None = None
    control: Sequence[PairRecord] | None = None
    probe: ProbeEvidence | None = None
    probe_interval_s: float = UNSCHEDULED_INTERVAL_S
    telemetry: TelemetryEvidence | None = None
    telemetry_arl0: float = 0.0
    acceptance_reference: AcceptanceReference | None = None


@dataclass(frozen=True, slots=True)
class GateSpec:
    """One gate: its name (its `GatesConfig` section, dotted for a nested one, and its
    decisions' name), what it reads (`pairs`, the capability `probe` or the arms'
    production `telemetry`), and how it judges. `covers`: the pair gates whose subject a
    telemetry gate judges at production load; while it is enforced, they may still FAIL
    a verdict but a PASS no longer waits for them (`combine`)."""

    name: str
    evidence: Literal["pairs", "probe", "telemetry"]
    run: Callable[[GatesConfig, Context], GateDecision]
    covers: tuple[str, ...] = ()


def _parity(config: GatesConfig, c: Context) -> GateDecision:
    return parity_gate(
        c.probe, config.parity, now=c.now, since=c.since, probe_interval_s=c.probe_interval_s
    )


def _telemetry_errors(config: GatesConfig, c: Context) -> GateDecision:
    evidence = c.telemetry or TelemetryEvidence()
    return telemetry_errors_gate(
        evidence.baseline.counts(),
        evidence.speculative.counts(),
        config.telemetry.errors,
        now=c.now,
        arl0=c.telemetry_arl0,
        since=c.since,
    )


def _telemetry_latency(config: GatesConfig, c: Context) -> GateDecision:
    return telemetry_latency_gate(
        c.telemetry or TelemetryEvidence(),
        config.telemetry.latency,
        now=c.now,
        arl0=c.telemetry_arl0,
        since=c.since,
    )


def _telemetry_acceptance(config: GatesConfig, c: Context) -> GateDecision:
    return telemetry_acceptance_gate(
        c.telemetry or TelemetryEvidence(),
        config.telemetry.acceptance,
        now=c.now,
        arl0=c.telemetry_arl0,
        since=c.since,
        reference=c.acceptance_reference,
    )


# The registry, in the order decisions are reported.
GATES: tuple[GateSpec, ...] = (
    GateSpec(
        "liveness",
        "pairs",
        lambda g, c: liveness_gate(c.records, g.liveness, now=c.now, arl0=c.arl0),
    ),
    GateSpec(
        "error",
        "pairs",
        lambda g, c: error_gate(c.records, g.error, now=c.now, arl0=c.arl0, since=c.since),
    ),
    GateSpec(
        "latency",
        "pairs",
        lambda g, c: latency_gate(
            c.records, g.latency, now=c.now, arl0=c.arl0, budget_30d=c.budget_30d, since=c.since
        ),
    ),
    GateSpec(
        "quality",
        "pairs",
        lambda g, c: quality_gate(
            c.split,
            g.quality,
            now=c.now,
            arl0=c.arl0,
            since=c.since,
            by_category=c.by_category,
            control=c.control,
        ),
    ),
    GateSpec(
        "speedup",
        "pairs",
        lambda g, c: speedup_gate(
            c.split, g.speedup, now=c.now, arl0=c.arl0, since=c.since, by_category=c.by_category
        ),
    ),
    GateSpec(
        "drift",
        "pairs",
        lambda g, c: drift_gate(
            c.own,
            g.drift,
            now=c.now,
            references=c.references,
            arl0=c.arl0,
            budget_30d=c.budget_30d,
            since=c.since,
        ),
    ),
    GateSpec("telemetry.errors", "telemetry", _telemetry_errors, covers=("error", "liveness")),
    GateSpec("telemetry.latency", "telemetry", _telemetry_latency, covers=("latency", "speedup")),
    GateSpec("telemetry.acceptance", "telemetry", _telemetry_acceptance, covers=("drift",)),
    GateSpec("parity", "probe", _parity),
)

PAIR_GATES: tuple[str, ...] = tuple(spec.name for spec in GATES if spec.evidence == "pairs")
TELEMETRY_GATES: tuple[str, ...] = tuple(
    spec.name for spec in GATES if spec.evidence == "telemetry"
)


def section(config: GatesConfig, name: str) -> GateConfigBase:
    """The configuration section of gate `name` (`"telemetry.errors"`: its `[gates.telemetry.
    errors]`); not for the probe gate, whose section has no window."""
    found: object = config
    for part in name.split("."):
        found = getattr(found, part)
    if not isinstance(found, GateConfigBase):
        raise KeyError(f"{name!r} names no gate section of GatesConfig")
    return found


def distinct(records: Sequence[PairRecord]) -> list[PairRecord]:
    """`records` with each (prompt, seed, arm) measured by one run only: a later run that
    replays a measurement another run already made (a second daemon, a restart, a command
    on the same database with unsalted seeds) adds no evidence, and counting it twice would
    double every detector's statistic. Within one run nothing is dropped."""
    first_run: dict[tuple[str, int, str], str] = {}
    kept: list[PairRecord] = []
    for record in records:
        key = (record.prompt.id, record.sampling_seed, record.arm)
        if first_run.setdefault(key, record.run_id) == record.run_id:
            kept.append(record)
    return kept


def _context(
    evidence: Evidence,
    config: GatesConfig,
    *,
    now: datetime,
    category_since: Mapping[str, datetime] | None,
) -> Context:
    telemetry = evidence.telemetry
    with_telemetry = telemetry is not None
    by_category = config.policy.scope == "category"
    cuts = category_since or {}
    records = distinct(evidence.records)
    own = [r for r in records if (cut := cuts.get(r.prompt.category)) is None or r.started_at > cut]
    scrape_interval_s = evidence.scrape_interval_s
    return Context(
        now=now,
        arl0=detector_arl0(config, telemetry=with_telemetry),
        budget_30d=detector_budget(config, telemetry=with_telemetry),
        since=evidence.start,
        by_category=by_category,
        records=records,
        own=own,
        split=own if by_category else records,
        references=evidence.references,
        control=evidence.control,
        probe=evidence.probe,
        probe_interval_s=evidence.probe_interval_s,
        telemetry=telemetry,
        telemetry_arl0=(
            telemetry_arl0(config, scrape_interval_s) if scrape_interval_s is not None else 0.0
        ),
        acceptance_reference=evidence.acceptance_reference,
    )


def evaluate_all(
    records: Sequence[PairRecord],
    config: GatesConfig,
    *,
    now: datetime,
    references: Mapping[str, ReferenceStats] | None = None,
    since: datetime | None = None,
    category_since: Mapping[str, datetime] | None = None,
    control: Sequence[PairRecord] | None = None,
) -> list[GateDecision]:
    """Every pair gate's decision for `records` at `now`, in registry order.

    `records` must cover the longest configured window (`window_bounds`); each gate
    selects its own, and only pairs after `since` (the current evidence's start: the last
    switch transition, a revision's start or an arms change) count. Each statistical
    detector gets its share of the false-alarm budget. Under `policy.scope = "category"`
    speedup and quality judge each category on its own. The per-category checks (drift
    always; speedup and quality under that scope) also read a category's pairs only after
    `category_since[category]`, when that category last moved on its own; the gates on all
    traffic read every pair. `control`: the pairs of the A/A control arm
    (`quality.control_arm`), if one is configured.
    """
    evidence = Evidence(records=records, references=references, since=since, control=control)
    context = _context(evidence, config, now=now, category_since=category_since)
    return [spec.run(config, context) for spec in GATES if spec.evidence == "pairs"]


@dataclass(frozen=True, slots=True)
class Judgement:
    """One window judged: every decision, the verdict of the enforce gates and why.
    `covered`: the pair gates an enforced telemetry gate covers (a PASS did not wait for
    them); `requests`: the speculative arm's production requests in its telemetry
    (0 without telemetry); `rate_ratio`: the measured pair rate over the budget's design
    rate when the gates were re-budgeted for it (1: judged at the design rate)."""

    decisions: tuple[GateDecision, ...]
    verdict: Verdict
    reason: str
    pairs: int
    covered: tuple[str, ...] = ()
    requests: int = 0
    rate_ratio: float = 1.0

    @property
    def suspicion(self) -> float:
        """See `suspicion`."""
        return suspicion(self.decisions)


def judge(
    evidence: Evidence, config: GatesConfig, now: datetime, *, min_pairs: int = 0
) -> Judgement:
    """Judge `evidence` (its pairs: the longest window up to `now`, oldest first) under
    `config` with every gate that has evidence.

    The pair gates always run; the probe gate only `evidence.with_probe` (as the daemon
    judges it); the telemetry gates, after the pair gates, whenever `evidence.telemetry`
    is given (empty if nothing was scraped yet): every detector's share of the budget then
    makes room for theirs, and the verdict PASSes when the quality checks on pairs and the
    telemetry gates agree (`combine`, `covered`). Without telemetry they are absent and
    nothing else changes. The gates judge with `evidence.judged_config(config)`: the
    calibrated tie margin, and re-budgeted (`gates.stats.budget.rebudget`) when the pair
    rate on the database is faster than the budget's design rate; the quality decision
    names the tie margin when the evidence carries one. `telemetry.acceptance` judged
    against the past stands only where the drift gate agrees (`gates.telemetry.mix`).
    `min_pairs` (what the asker
    demands of the evidence, not evidence) and `evidence.subject` go to `combine`."""
    ratio = rate_ratio(config, evidence.pair_rate)
    config = evidence.judged_config(config)
    start = evidence.start
    context = _context(evidence, config, now=now, category_since=evidence.category_since)
    telemetry = evidence.telemetry
    runs = {"pairs": True, "probe": evidence.with_probe, "telemetry": telemetry is not None}
    decisions = screen_past_reference(
        [spec.run(config, context) for spec in GATES if runs[spec.evidence]]
    )
    covered = covered_by_telemetry(decisions)
    pairs = len(context.records)  # distinct measurements
    requests = sum(
        i.requests or 0
        for i in (telemetry.speculative.intervals if telemetry is not None else ())
        if i.end <= now and (start is None or i.start >= start)
    )
    verdict, reason = combine(decisions, pairs, min_pairs, evidence.subject, covered=covered)
    if ratio > 1.0:
        reason += (
            f" (judged re-budgeted for {evidence.pair_rate:.3g} pairs a minute, {ratio:.3g}x "
            "the design rate of gates.budget.design_pair_interval_s)"
        )
    if evidence.tie_margin is not None:  # after `combine`: its reason quotes the bare detail
        decisions = evidence.tie_margin.note(decisions)
    return Judgement(decisions, verdict, reason, pairs, covered, requests, ratio)


def covered_by_telemetry(decisions: Sequence[GateDecision]) -> tuple[str, ...]:
    """The pair gates among `decisions` whose subject an enforced telemetry gate among
    them judges at production load (`GateSpec.covers`), in registry order."""
    judged = {d.name for d in decisions}
    telemetry = {d.name for d in decisions if d.enforced and d.name in TELEMETRY_GATES}
    names = {name for spec in GATES if spec.name in telemetry for name in spec.covers}
    return tuple(name for name in PAIR_GATES if name in names and name in judged)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def combine(
    decisions: Sequence[GateDecision],
    pairs: int,
    min_pairs: int,
    subject: str,
    *,
    covered: Collection[str] = (),
) -> tuple[Verdict, str]:
    """The verdict of the enforce gates' `decisions` on `pairs` pairs of `subject` (e.g.
    "revision 'abc'"), and why in one line.

    A FAIL is a detector's alarm under its false-alarm budget and stands however few pairs
    raised it, a telemetry gate's as any other; `min_pairs` only holds back the other
    verdicts (NODATA below it). The gates named in `covered` (pair gates whose subject an
    enforced telemetry gate judges at production load, `covered_by_telemetry`) count
    only by their FAIL: PASS needs every other enforce gate, the quality checks on pairs
    and the telemetry gates, to PASS."""
    enforced = [d for d in decisions if d.enforced]
    if not enforced:
        return "NODATA", f"no gate is in enforce mode: nothing judges {subject}"
    failed = [d for d in enforced if d.state is GateState.FAIL]
    if failed:
        first = min(failed, key=lambda d: not d.critical)  # a critical gate's reason first
        names = ", ".join(d.name for d in failed)
        return "FAIL", _one_line(f"{names} FAILed on {pairs} pairs of {subject}: {first.detail}")
    if pairs < min_pairs:
        return "NODATA", f"{pairs} pairs of {subject}, fewer than min_pairs={min_pairs}"
    deciding = [d for d in enforced if d.name not in covered]
    left = sorted({d.name for d in enforced} & set(covered))
    state = combine_states([d.state for d in deciding])
    if state is GateState.PASS:
        if left:
            return "PASS", (
                f"every enforce gate PASSed on {pairs} pairs of {subject} "
                f"({', '.join(left)} left to telemetry: only their FAIL counts)"
            )
        return "PASS", f"every enforce gate PASSed on {pairs} pairs of {subject}"
    if state is GateState.NODATA:
        return "NODATA", f"too few pairs of {subject} for any enforce gate to decide ({pairs})"
    undecided = ", ".join(
        f"{d.name} {d.state.value}" for d in deciding if d.state is not GateState.PASS
    )
    return "INCONCLUSIVE", f"not decided on {pairs} pairs of {subject}: {undecided}"


def suspicion(decisions: Sequence[GateDecision]) -> float:
    """The largest progress (CUSUM statistic / threshold) of an enforce gate's detector
    that has not FAILed: how close the evidence is to a decision nobody has made yet."""
    return max(
        (
            check.detector.progress
            for decision in decisions
            if decision.enforced
            for check in checks([decision])
            if check.detector is not None and check.state is not GateState.FAIL
        ),
        default=0.0,
    )


def may_pin(state: SwitchState) -> bool:
    """References are pinned from healthy traffic: while speculation is on, or after a
    rollback that the drift gate did not cause (its evidence would be the drift itself)."""
    return state.mode is SwitchMode.AUTO or state.actor != "gate:drift"


def pins(
    records: Sequence[PairRecord],
    references: Mapping[str, ReferenceStats],
    state: SwitchState,
    config: GatesConfig,
    now: datetime,
) -> dict[str, ReferenceStats]:
    """The drift references to pin now: categories with pairs in `records` but no
    reference, and pins still short of `pin_target_samples` grown from them
    (`gates.grow_references`); none when `may_pin(state)` says no. A pin is held back
    while the drift check against it, at the default config's shares of the budget
    (`DEFAULT_ARL0`, `DEFAULT_DETECTOR_BUDGET`) rather than the configured ones, WARNs
    or FAILs: every stored pin grew under that rule."""
    if not records or not may_pin(state):
        return {}
    ordered = sorted(records, key=lambda r: r.started_at)
    return grow_references(
        ordered,
        references,
        config.drift,
        now=now,
        arl0=DEFAULT_ARL0,
        budget_30d=DEFAULT_DETECTOR_BUDGET,
    )


def advisory(config: GatesConfig) -> GatesConfig:
    """`config` with every pair and telemetry gate in `warn` mode: how comparison arms
    are judged."""
    warn = {"mode": GateMode.WARN}
    telemetry = config.telemetry.model_copy(
        update={
            name.removeprefix("telemetry."): section(config, name).model_copy(update=warn)
            for name in TELEMETRY_GATES
        }
    )
    return config.model_copy(
        update={
            **{name: section(config, name).model_copy(update=warn) for name in PAIR_GATES},
            "telemetry": telemetry,
        }
    )


def window_bounds(config: GatesConfig) -> tuple[float | None, int | None]:
    """The longest window any pair gate reads: (seconds, pairs); None means unbounded."""
    sections = [getattr(config, name) for name in PAIR_GATES]
    seconds = [s.window_seconds for s in sections]
    pairs = [s.window_pairs for s in sections]
    longest_s = None if None in seconds else max(s for s in seconds if s is not None)
    longest_n = None if None in pairs else max(p for p in pairs if p is not None)
    return longest_s, longest_n


def latest_window(records: Sequence[PairRecord], config: GatesConfig) -> list[PairRecord]:
    """The pairs of `records` (oldest first) that the longest window holds, ending at the
    newest: what the store's window query returns, for callers that keep pairs in memory."""
    seconds, limit = window_bounds(config)
    chosen = list(records[-limit:]) if limit is not None else list(records)
    if seconds is not None and chosen:
        oldest = chosen[-1].started_at - timedelta(seconds=seconds)
        chosen = [r for r in chosen if r.started_at > oldest]
    return chosen
