"""A probe run's result: the table of capability × arm (`CapabilityResult`, one row) for
the baseline and one speculative arm (`ProbeReport`), as `canaryd probe --json` prints it
and a probe run's `probe` section stores it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from canaryd.parity.checks import Outcome

__all__ = ["CapabilityResult", "ProbeReport"]


@dataclass(frozen=True, slots=True)
class CapabilityResult:
    """One capability on both arms."""

    name: str
    baseline: Outcome
    speculative: Outcome

    @property
    def regressed(self) -> bool:
        """The baseline passes and the speculative arm does not."""
        return self.baseline.state == "pass" and self.speculative.state != "pass"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "baseline": self.baseline.to_dict(),
            "speculative": self.speculative.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """The checklist's table for the baseline and one speculative arm (`arm`)."""

    arm: str
    capabilities: tuple[CapabilityResult, ...]
    context_limit: int | None
    elapsed_s: float
    # Answers a read cap cut short, by cap (`probe_answer_bytes`, `probe_deadline`,
    # `generation_bytes`): canaryd_read_caps_total's `what`.
    read_caps: dict[str, int] = field(default_factory=dict)
    # Capabilities the run's deadline left unprobed: without them no parity is shown.
    not_run: tuple[str, ...] = ()

    @property
    def regressions(self) -> list[str]:
        return [c.name for c in self.capabilities if c.regressed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "regressions": self.regressions,
            "context_limit": self.context_limit,
            "elapsed_s": round(self.elapsed_s, 3),
            "read_caps": dict(self.read_caps),
            "not_run": list(self.not_run),
            "capabilities": [c.to_dict() for c in self.capabilities],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeReport:
        """The report `to_dict` wrote (a stored probe run's `probe` section)."""

        def outcome(side: Mapping[str, Any]) -> Outcome:
            return Outcome(side["state"], str(side["reason"]))

        return cls(
            arm=str(data["arm"]),
            capabilities=tuple(
                CapabilityResult(c["name"], outcome(c["baseline"]), outcome(c["speculative"]))
                for c in data["capabilities"]
            ),
            context_limit=data.get("context_limit"),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            read_caps={str(k): int(v) for k, v in (data.get("read_caps") or {}).items()},
            not_run=tuple(str(name) for name in data.get("not_run") or ()),
        )
