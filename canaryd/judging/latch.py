"""A revision's FAIL latches: once it FAILs, every later verdict of it says FAIL.

A FAIL of a revision is either a judgement (an enforce gate FAILed on the revision's own
evidence: the verdict's judging, or the gate job's judgement of the switch's arm on pairs
all measured within the revision's evidence) or the switch's: speculation rolled back (by
a gate, the kill switch `canaryd switch rollback`, an emergency rollback adopted from the
state file) while the revision was being judged, that is, an audit transition from `auto`
to `rolled_back` of the top level at or after the revision's evidence start and before
its window ended. The first FAIL stands, with its time and reason, on every later read,
until the arm's next revision opens (a new window has no failure) or an operator restores
(`canaryd switch restore --reason …`): the restore clears it and the revision's evidence
restarts at the restore (`RevisionWindow.evidence_start`), as the switch's own evidence
restarts at every transition. A category's own rollback is not the revision's: it turns
speculation off for one category, and the gates that caused it FAIL the revision anyway
when they FAIL on its evidence.

Reads derive the FAIL from what is stored (the window's latched failure, the audit trail,
the judgement) and never write; the explicit writes (`POST /v1/verdict`, Flagger's
opening hooks and `confirm-traffic-increase`, the gate job after each run) record it in
the window (`SwitchStore.latch_revision`), so that it outlives the audit's retention and a
daemon's restart. This module holds the pure rules; `canaryd.judging.verdict` applies
them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from canaryd.store import AuditEntry, RevisionWindow

__all__ = [
    "RESTORE_HINT",
    "Failure",
    "first_failure",
    "latched_reason",
    "switch_failure",
    "window_failure",
]

# What an operator does about a latched FAIL, as every latched reason says.
RESTORE_HINT = (
    "it stands until the arm's next revision opens or an operator restores with "
    "`canaryd switch restore --reason …`"
)


@dataclass(frozen=True, slots=True)
class Failure:
    """A revision's FAIL: when it was judged or happened, and why."""

    at: datetime
    reason: str


def _stamp(at: datetime) -> str:
    return at.isoformat(timespec="seconds")


def window_failure(window: RevisionWindow) -> Failure | None:
    """The FAIL latched in `window` (None: none stands)."""
    if window.failed_at is None:
        return None
    return Failure(window.failed_at, window.failure)


def switch_failure(window: RevisionWindow, audit: Iterable[AuditEntry]) -> Failure | None:
    """The first rollback of speculation (top level, `auto` to `rolled_back`) in `audit`
    that happened within the revision's evidence: at or after `window.evidence_start`,
    before the window ended."""
    start, end = window.evidence_start, window.ended_at
    for entry in sorted(audit, key=lambda e: (e.at, e.generation)):
        if (
            entry.kind == "transition"
            and entry.category is None
            and entry.previous == "auto"
            and entry.target == "rolled_back"
            and entry.at >= start
            and (end is None or entry.at < end)
        ):
            return Failure(
                entry.at,
                f"speculation was rolled back at {_stamp(entry.at)} by {entry.actor}: "
                f"{entry.reason}",
            )
    return None


def first_failure(*failures: Failure | None) -> Failure | None:
    """The earliest of `failures` (None when there is none)."""
    found = [f for f in failures if f is not None]
    return min(found, key=lambda f: f.at) if found else None


def latched_reason(failure: Failure, judged: str) -> str:
    """The reason of a verdict that is FAIL by `failure` whatever is judged now (`judged`:
    the reason of the current judgement, quoted after it)."""
    return (
        f"FAIL latched at {_stamp(failure.at)}: {failure.reason} ({RESTORE_HINT}; "
        f"judged now: {judged})"
    )
