"""Pure statistics and decisions: gates over windows of pair records, and the switch policy.

Nothing here does I/O or reads the clock: the daemon passes the records, the config and
`now` in, and stores what comes out.
"""

from gates.config import GatesConfig, SwitchPolicyConfig
from gates.core import DetectorReading, GateDecision, GateMode, GateState
from gates.cycle import GATES, Judgement, Verdict, combine, evaluate_all, judge
from gates.drift import ReferenceStats, drift_gate, grow_references, pin_reference
from gates.error_rate import error_gate
from gates.latency import latency_gate
from gates.liveness import liveness_gate
from gates.quality import quality_gate
from gates.speedup import speedup_gate
from gates.switch import (
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

__all__ = [
    "GATES",
    "CategorySwitch",
    "Control",
    "DetectorReading",
    "Evaluation",
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
