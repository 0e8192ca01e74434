"""Which records a gate reads: the configured window, ordered by start time, as of `now`;
and which of them ran at the same time (`concurrent_groups`), so that a gate can count
pairs that may share one stall as one piece of evidence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gates.config_base import GateConfigBase
from gates.core import GateDecision, GateState, combine_states, deciding
from gates.records import PairRecord


@dataclass(frozen=True, slots=True)
class Window:
    records: tuple[PairRecord, ...]
    start: datetime | None
    end: datetime | None


def select(
    records: Sequence[PairRecord],
    config: GateConfigBase,
    now: datetime,
    since: datetime | None = None,
) -> Window:
    """Records that started at or before `now` and within `window_seconds` of it (and
    after `since`, the start of the current evidence), the last `window_pairs` of them,
    oldest first. Records from the future (clock skew) are left out."""
    chosen = [r for r in records if r.started_at <= now and (since is None or r.started_at > since)]
    if config.window_seconds is not None:
        oldest = now - timedelta(seconds=config.window_seconds)
        chosen = [r for r in chosen if r.started_at > oldest]
    chosen.sort(key=lambda r: r.started_at)
    if config.window_pairs is not None:
        chosen = chosen[-config.window_pairs :]
    if not chosen:
        return Window((), None, None)
    return Window(tuple(chosen), chosen[0].started_at, chosen[-1].started_at)


def concurrent_groups(records: Sequence[PairRecord]) -> list[int]:
    """For each of `records` (ordered by start time), the index of its group of pairs that
    ran at the same time: a pair joins the group before it when it started while a pair of
    that group was still running. A pair's arms run one after the other from `started_at`,
    so it ends baseline e2e + speculative e2e later. The daemon's schedule starts a pair
    only after the one before it ended (every group one pair); a rollout burst starts
    `rollout.concurrency` pairs at once (one group per burst cycle), and records of one
    prompt on several speculative arms share a start. Pairs that overlap in time can share
    one host stall (a GC pause, a preemption, a neighbour's batch), so their latencies are
    not independent evidence."""
    groups: list[int] = []
    end: datetime | None = None
    for record in records:
        if end is None or record.started_at >= end:
            groups.append(groups[-1] + 1 if groups else 0)
        else:
            groups.append(groups[-1])
        finish = record.started_at + timedelta(
            seconds=max(record.baseline.e2e_s, 0.0) + max(record.speculative.e2e_s, 0.0)
        )
        end = finish if end is None or record.started_at >= end else max(end, finish)
    return groups


def decision(
    name: str, config: GateConfigBase, window: Window, now: datetime, **evidence: Any
) -> GateDecision:
    """A decision carrying the gate's mode, criticality, confidence and window."""
    return GateDecision(
        name=name,
        mode=config.mode,
        critical=config.critical,
        evaluated_at=now,
        confidence=config.confidence,
        window_start=window.start,
        window_end=window.end,
        **evidence,
    )


def nodata(
    name: str, config: GateConfigBase, window: Window, now: datetime, n: int
) -> GateDecision:
    """Too few samples: never a PASS."""
    return decision(
        name,
        config,
        window,
        now,
        state=GateState.NODATA,
        n_baseline=n,
        n_speculative=n,
        threshold=float(config.min_samples),
        detail=f"{n} usable pairs in the window, fewer than min_samples={config.min_samples}",
    )


def combined(
    name: str,
    config: GateConfigBase,
    window: Window,
    now: datetime,
    components: Sequence[GateDecision],
    notes: Sequence[str] = (),
    **extra: Any,
) -> GateDecision:
    """One gate decision from its checks: the combined state, the deciding check's
    evidence lifted to the top, every check's detail in `detail`."""
    state = combine_states([c.state for c in components])
    cause = deciding(components)
    details = [c.detail for c in components] + list(notes)
    return decision(
        name,
        config,
        window,
        now,
        state=state,
        statistic=cause.statistic,
        n_baseline=cause.n_baseline,
        n_speculative=cause.n_speculative,
        estimate=cause.estimate,
        lower=cause.lower,
        upper=cause.upper,
        threshold=cause.threshold,
        detail=f"{state.value} by {cause.name}; " + "; ".join(details),
        components=tuple(components),
        **extra,
    )
