"""When a telemetry decision's evidence has stopped: `silence`.

A telemetry gate's decision rests on intervals that keep arriving; once an arm goes dark
(it serves no request, or its scrapes fail so that no interval arrives at all) the
window still holds hours of old intervals, and a decision read from them would stand
long after the evidence stopped. `silence` says, for the arms a gate reads, whether the
newest interval, or the newest interval in which the arm served, ended longer ago than
the gate's bound: `max_silence_s`, or `max_silence_intervals` of the arm's scrape
interval (the median length of its newest intervals) where that is longer. The gate is
then NODATA, its detail starting with `SILENCE` and naming the arm and why; the caller
(the daemon's gate job) logs it once. Pure: `now` is the caller's.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from gates.config import TelemetryGateConfigBase

__all__ = ["SILENCE", "silence", "silent"]

# The first words of the detail of a decision whose evidence stopped.
SILENCE = "evidence stopped"
_TYPICAL_OF = 20  # the newest intervals whose median length is the arm's scrape interval


class Flowing(Protocol):
    """An interval of telemetry as `silence` reads it."""

    @property
    def start(self) -> datetime: ...

    @property
    def end(self) -> datetime: ...

    @property
    def served(self) -> bool: ...


def silence(
    arms: Mapping[str, Sequence[Flowing]], now: datetime, config: TelemetryGateConfigBase
) -> str | None:
    """Why the evidence of `arms` (each arm's intervals that ended at or before `now`,
    oldest first) has stopped, or None while it flows. An arm with no interval at all
    says nothing here (the gate is NODATA for want of evidence anyway)."""
    reasons = []
    for arm, intervals in arms.items():
        if not intervals:
            continue
        typical = statistics.median(
            (i.end - i.start).total_seconds() for i in intervals[-_TYPICAL_OF:]
        )
        bound = max(config.max_silence_s, config.max_silence_intervals * typical)
        newest = intervals[-1].end
        served = next((i.end for i in reversed(intervals) if i.served), None)
        if (now - newest).total_seconds() >= bound:
            reasons.append(
                f"no interval from the {arm} arm (no successful scrape) since "
                f"{newest.isoformat()}, {_minutes(now, newest)} ago"
            )
        elif (now - (served or intervals[0].start)).total_seconds() >= bound:
            since = (
                f"in its intervals since {intervals[0].start.isoformat()}"
                if served is None
                else f"since {served.isoformat()}, {_minutes(now, served)} ago"
            )
            reasons.append(f"no request served by the {arm} arm {since}")
        else:
            continue
        reasons[-1] += f" (the bound: {bound / 60:.3g} min)"
    if not reasons:
        return None
    return f"{SILENCE}: " + "; ".join(reasons)


def silent(detail: str) -> bool:
    """Whether a decision's `detail` says its evidence stopped."""
    return detail.startswith(SILENCE)


def _minutes(now: datetime, then: datetime) -> str:
    return f"{(now - then).total_seconds() / 60:.3g} min"
