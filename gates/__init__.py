"""Pure statistics and decisions: gates over windows of pair records, and the switch policy.

Nothing here does I/O or reads the clock: the daemon passes the records, the config and
`now` in, and stores what comes out. The names below are imported on first use (PEP 562),
each from the module its TYPE_CHECKING import names (`engine.lazy`): the switch's records
and the config need no statistics library, so a command that only moves the switch never
imports scipy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_exports

if TYPE_CHECKING:
    from gates.config import GatesConfig
    from gates.core import DetectorReading, GateDecision, GateMode, GateState, ReferenceStats
    from gates.cycle import GATES, Judgement, Verdict, combine, evaluate_all, judge
    from gates.evidence import Evidence
    from gates.pairs.drift import drift_gate, grow_references, pin_reference
    from gates.pairs.error_rate import error_gate
    from gates.pairs.latency import latency_gate
    from gates.pairs.liveness import liveness_gate
    from gates.pairs.quality import quality_gate
    from gates.pairs.speedup import speedup_gate
    from gates.switch.config import SwitchPolicyConfig
    from gates.switch.policy import (
        CategorySwitch,
        Control,
        Evaluation,
        SwitchEvent,
        SwitchMode,
        SwitchOutcome,
        SwitchState,
        Transition,
        step,
    )

__getattr__, __dir__ = lazy_exports(globals())


__all__ = [
    "GATES",
    "CategorySwitch",
    "Control",
    "DetectorReading",
    "Evaluation",
    "Evidence",
    "GateDecision",
    "GateMode",
    "GateState",
    "GatesConfig",
    "Judgement",
    "ReferenceStats",
    "SwitchEvent",
    "SwitchMode",
    "SwitchOutcome",
    "SwitchPolicyConfig",
    "SwitchState",
    "Transition",
    "Verdict",
    "combine",
    "drift_gate",
    "error_gate",
    "evaluate_all",
    "grow_references",
    "judge",
    "latency_gate",
    "liveness_gate",
    "pin_reference",
    "quality_gate",
    "speedup_gate",
    "step",
]
