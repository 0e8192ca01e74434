"""What the report reads from the store besides pairs: the run it is about, and the
switch flips and gate decisions of its span. Typed on the store protocols, so any
`HistoryStore`/`SwitchStore` serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from canaryd.errors import RunNotFoundError
from canaryd.store import HistoryStore, StoredRun, SwitchStore


def find_run(store: HistoryStore, run_id: str) -> StoredRun:
    run = store.runs_by_id([run_id]).get(run_id)
    if run is not None:
        return run
    raise RunNotFoundError(run_id)


@dataclass(frozen=True, slots=True)
class Flip:
    at: datetime
    target: str
    actor: str
    reason: str


@dataclass(frozen=True, slots=True)
class GateMark:
    at: datetime
    gate: str
    state: str


@dataclass(frozen=True, slots=True)
class Audit:
    flips: tuple[Flip, ...] = ()
    gates: tuple[GateMark, ...] = ()
    notes: tuple[str, ...] = ()


GATE_DECISIONS_READ = 100_000  # evaluations read back for a window; about a year at 5 min


def read_audit(store: SwitchStore, since: datetime | None, until: datetime | None) -> Audit:
    """Switch transitions and gate decisions in [since, until) (a run: the run's span)."""
    flips = tuple(
        Flip(at=entry.at, target=entry.target, actor=entry.actor, reason=entry.reason)
        for entry in store.audit(since=since)
        if entry.kind == "transition" and _in(entry.at, since, until)
    )
    gates = tuple(
        GateMark(at=evaluation.at, gate=decision.name, state=decision.state.value)
        for evaluation in store.evaluations(GATE_DECISIONS_READ)
        if _in(evaluation.at, since, until)
        for decision in evaluation.decisions
    )
    notes = []
    if not gates:
        notes.append("no gate decisions recorded in this span: gate timeline skipped")
    return Audit(flips=flips, gates=gates, notes=tuple(notes))


def _in(moment: datetime, since: datetime | None, until: datetime | None) -> bool:
    return (since is None or moment >= since) and (until is None or moment < until)
