"""The vocabulary every gate speaks: states, modes and the `GateDecision` with its evidence.

A decision is an immutable value: the gate's verdict on one window of pair records at
one instant, with the numbers that justify it (n per arm, estimate, confidence bounds,
threshold, window). Gates that check several statistics (latency per metric, quality per
sub-check) keep each check as a component decision and lift the deciding one's evidence
to the top level, so an operator sees both the verdict and every number behind it. A
per-category gate's components each judge one category; the switch policy reads them back
per category (`per_category`, `judged_state`, `category_decisions`, `category_passed`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any


class GateState(enum.StrEnum):
    """PASS and FAIL are backed by a confidence bound; NODATA is never counted as PASS."""

    PASS = "PASS"  # noqa: S105  (a gate state, not a password)
    WARN = "WARN"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    NODATA = "NODATA"


class GateMode(enum.StrEnum):
    """enforce: may trip the switch; warn: alerts only; dry_run: recorded only."""

    ENFORCE = "enforce"
    WARN = "warn"
    DRY_RUN = "dry_run"


@dataclass(frozen=True, slots=True)
class DetectorReading:
    """A check's sequential detector at the decision: its CUSUM statistic S now, the
    largest S reached in the window, and the threshold h it FAILs at. `progress` (S / h)
    says how close the check is to tripping: 1 is a FAIL, 0.5 a WARN."""

    statistic: float
    peak: float
    threshold: float

    @property
    def progress(self) -> float:
        return self.statistic / self.threshold if self.threshold > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {
            "statistic": self.statistic,
            "peak": self.peak,
            "threshold": self.threshold,
            "progress": self.progress,
        }


@dataclass(frozen=True, slots=True)
class GateDecision:
    """One gate's verdict on one window, with the evidence behind it.

    `estimate`, `lower` and `upper` are in the unit named by `statistic`; `lower` and
    `upper` are one-sided bounds, each at the gate's `confidence` (None: the sample is too
    small for a distribution-free bound to exist). `threshold` is the limit the bound was
    compared with. `categories` names the prompt categories a per-category gate (drift)
    flagged; `components` holds the individual checks of a multi-check gate. `detector`
    is the check's sequential detector (None on a combined gate and on checks without
    one, or before it has data). `category`
    is set on a check that judges one traffic category's pairs alone (drift's per
    category, speedup's and quality's under `scope = "category"`), whatever its state:
    the switch policy acts on that category only, and a restore of it reads these.
    """

    name: str
    state: GateState
    mode: GateMode
    critical: bool
    evaluated_at: datetime
    statistic: str = ""
    n_baseline: int = 0
    n_speculative: int = 0
    estimate: float | None = None
    lower: float | None = None
    upper: float | None = None
    threshold: float | None = None
    confidence: float | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    detail: str = ""
    categories: tuple[str, ...] = ()
    components: tuple[GateDecision, ...] = ()
    category: str | None = None
    detector: DetectorReading | None = None

    @property
    def enforced(self) -> bool:
        return self.mode is GateMode.ENFORCE

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (audit rows, `canaryd gates --json`); non-finite floats are None."""
        return {
            "name": self.name,
            "state": self.state.value,
            "mode": self.mode.value,
            "critical": self.critical,
            "evaluated_at": self.evaluated_at.isoformat(),
            "statistic": self.statistic,
            "n_baseline": self.n_baseline,
            "n_speculative": self.n_speculative,
            "estimate": _finite(self.estimate),
            "lower": _finite(self.lower),
            "upper": _finite(self.upper),
            "threshold": _finite(self.threshold),
            "confidence": self.confidence,
            "window_start": self.window_start.isoformat() if self.window_start else None,
            "window_end": self.window_end.isoformat() if self.window_end else None,
            "detail": self.detail,
            "categories": list(self.categories),
            "components": [c.to_dict() for c in self.components],
            "category": self.category,
            "detector": self.detector.to_dict() if self.detector else None,
        }


def checks(decisions: Iterable[GateDecision]) -> Iterator[GateDecision]:
    """The individual checks of `decisions`: each decision without components, and the
    components of the others, recursively."""
    for decision in decisions:
        if decision.components:
            yield from checks(decision.components)
        else:
            yield decision


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


# Severity when several checks are combined into one gate: the worst one decides.
_SEVERITY = {
    GateState.PASS: 0,
    GateState.INCONCLUSIVE: 1,
    GateState.NODATA: 1,
    GateState.WARN: 2,
    GateState.FAIL: 3,
}


def combine_states(states: Sequence[GateState]) -> GateState:
    """FAIL if any FAIL, else WARN if any WARN; all NODATA (or none) is NODATA; a NODATA
    or INCONCLUSIVE check next to passing ones makes the whole INCONCLUSIVE (never PASS);
    PASS only when every check passed."""
    if not states or all(s is GateState.NODATA for s in states):
        return GateState.NODATA
    worst = max(states, key=lambda s: _SEVERITY[s])
    if worst is GateState.NODATA:
        return GateState.INCONCLUSIVE
    return worst


def deciding(components: Sequence[GateDecision]) -> GateDecision:
    """The component whose state is the combined state's cause: the first most severe."""
    return max(components, key=lambda c: _SEVERITY[c.state])


def judged_state(decision: GateDecision, off: Collection[str] = ()) -> GateState:
    """The gate's state for the top level: a per-category gate leaves out its checks of the
    categories in `off` (rolled back on their own, so not riding on the top level); with
    none left it has nothing against the top level (PASS)."""
    if not off or not per_category(decision):
        return decision.state
    kept = [c.state for c in decision.components if c.category not in off]
    return combine_states(kept) if kept else GateState.PASS


def per_category(decision: GateDecision) -> bool:
    """A gate whose components each judge one category (drift; speedup and quality under
    `scope = "category"`)."""
    return bool(decision.components) and all(c.category is not None for c in decision.components)


def category_decisions(decisions: Sequence[GateDecision], category: str) -> list[GateDecision]:
    """The enforce gates' components that judge `category` alone."""
    return [c for d in decisions if d.enforced for c in d.components if c.category == category]


def category_passed(decisions: Sequence[GateDecision], category: str) -> bool:
    """True when at least one enforce check judged `category` and every one PASSed."""
    checks = category_decisions(decisions, category)
    return bool(checks) and all(c.state is GateState.PASS for c in checks)


@dataclass(frozen=True, slots=True)
class ReferenceStats:
    """A category's healthy acceptance length: mean and sd per pair, from n pairs (the drift
    gate's reference; here, beside the decisions, so that the store needs no statistics)."""

    mean: float
    sd: float
    n: int = 0
    # The same over log(acceptance length), where a proportional drop is a plain shift;
    # None for references configured or pinned without them.
    log_mean: float | None = None
    log_sd: float | None = None
