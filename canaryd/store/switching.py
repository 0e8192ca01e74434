"""The switch's and the gates' records as the store keeps them: the switch row as a
`gates.SwitchState` plus how far it has been applied, audit entries, and gate decisions
rebuilt from their stored JSON (`GateDecision.to_dict()` round-trips through
`decision_from_dict`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gates import DetectorReading, GateDecision, GateMode, GateState, SwitchState

__all__ = ["AuditEntry", "RevisionWindow", "SwitchRecord", "decision_from_dict"]


@dataclass(frozen=True, slots=True)
class SwitchRecord:
    """The stored switch: its state, and the last generation whose state file and hooks
    all succeeded (`applied_generation`; None: never), with the failures of the last
    attempt by actuator name."""

    state: SwitchState
    applied_generation: int | None = None
    actuator_errors: dict[str, str] = field(default_factory=dict)
    actuated_at: datetime | None = None
    gates_completed_at: datetime | None = None  # the leader's last completed gate run

    @property
    def applied(self) -> bool:
        return self.applied_generation is not None and (
            self.applied_generation >= self.state.generation
        )


@dataclass(frozen=True, slots=True)
class RevisionWindow:
    """The evidence window of one revision of a speculative arm: from the first verdict
    request that named it to the start of the arm's next revision (`ended_at`; None while
    it is the arm's latest).

    `failed_at` and `failure`: the revision's latched FAIL, when and why (None: none
    stands); `restored_at` and `restore`: an operator's last restore (who and why), which
    cleared it and where the revision's evidence restarts; `increased_at`: the last
    traffic increase a rollout tool was told yes to."""

    arm: str
    revision: str
    started_at: datetime
    ended_at: datetime | None = None
    failed_at: datetime | None = None
    failure: str = ""
    restored_at: datetime | None = None
    restore: str = ""
    increased_at: datetime | None = None

    @property
    def current(self) -> bool:
        """Whether the arm still serves this revision (no later one has started)."""
        return self.ended_at is None

    @property
    def evidence_start(self) -> datetime:
        """Where the revision's evidence starts: its window's start, or an operator's
        later restore."""
        if self.restored_at is not None and self.restored_at > self.started_at:
            return self.restored_at
        return self.started_at


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit row: a transition (`generation` is the new one) or a refused command."""

    at: datetime
    kind: str  # "transition" or "refused"
    generation: int
    previous: str
    target: str
    control: str
    actor: str
    reason: str
    evidence: list[dict[str, Any]]
    category: str | None = None  # the category that moved; None: the top level

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "kind": self.kind,
            "generation": self.generation,
            "previous": self.previous,
            "target": self.target,
            "control": self.control,
            "actor": self.actor,
            "reason": self.reason,
            "evidence": self.evidence,
            "category": self.category,
        }


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def decision_from_dict(data: dict[str, Any]) -> GateDecision:
    """The `GateDecision` that `to_dict()` produced (non-finite floats come back as None)."""
    evaluated_at = _time(data["evaluated_at"])
    if evaluated_at is None:  # pragma: no cover - to_dict always writes it
        raise ValueError("a stored gate decision has no evaluated_at")
    return GateDecision(
        name=data["name"],
        state=GateState(data["state"]),
        mode=GateMode(data["mode"]),
        critical=bool(data["critical"]),
        evaluated_at=evaluated_at,
        statistic=data.get("statistic", ""),
        n_baseline=int(data.get("n_baseline", 0)),
        n_speculative=int(data.get("n_speculative", 0)),
        estimate=_float(data.get("estimate")),
        lower=_float(data.get("lower")),
        upper=_float(data.get("upper")),
        threshold=_float(data.get("threshold")),
        confidence=_float(data.get("confidence")),
        window_start=_time(data.get("window_start")),
        window_end=_time(data.get("window_end")),
        detail=data.get("detail", ""),
        categories=tuple(data.get("categories", ())),
        components=tuple(decision_from_dict(c) for c in data.get("components", ())),
        category=data.get("category"),
        detector=_detector(data.get("detector")),
    )


def _detector(data: dict[str, Any] | None) -> DetectorReading | None:
    """A stored `DetectorReading` (decisions stored before it existed have none)."""
    if not data:
        return None
    return DetectorReading(
        statistic=float(data["statistic"]),
        peak=float(data["peak"]),
        threshold=float(data["threshold"]),
    )
