"""Pure statistics and decisions: gates over windows of pair records, and the switch policy.

Nothing here does I/O or reads the clock: the daemon passes the records, the config and
`now` in, and stores what comes out. The names below are imported on first use (PEP 562):
the switch's records and the config need no statistics library, so a command that only
moves the switch never imports scipy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gates.config import GatesConfig
    from gates.core import DetectorReading, GateDecision, GateMode, GateState, ReferenceStats
    from gates.cycle import GATES, Judgement, Verdict, combine, evaluate_all, judge
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

# Each public name and the module that defines it.
_MODULES = {
    "gates.config": ("GatesConfig",),
    "gates.switch.config": ("SwitchPolicyConfig",),
    "gates.core": ("DetectorReading", "GateDecision", "GateMode", "GateState", "ReferenceStats"),
    "gates.cycle": ("GATES", "Judgement", "Verdict", "combine", "evaluate_all", "judge"),
    "gates.pairs.drift": ("drift_gate", "grow_references", "pin_reference"),
    "gates.pairs.error_rate": ("error_gate",),
    "gates.pairs.latency": ("latency_gate",),
    "gates.pairs.liveness": ("liveness_gate",),
    "gates.pairs.quality": ("quality_gate",),
    "gates.pairs.speedup": ("speedup_gate",),
    "gates.switch.policy": (
        "CategorySwitch",
        "Control",
        "Evaluation",
        "SwitchEvent",
        "SwitchMode",
        "SwitchOutcome",
        "SwitchState",
        "Transition",
        "step",
    ),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'gates' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


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
