"""Which records a gate reads: the configured window, ordered by start time, as of `now`."""

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
