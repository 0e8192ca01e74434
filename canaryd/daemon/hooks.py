"""The daemon's one seam toward the gates and the switch: `GateHook`, what the gate job,
/readyz and the adaptive pace ask of them, and `NoGates`, the default that evaluates
nothing (a daemon that only measures, or a test of the soak alone)."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

__all__ = ["GateHook", "NoGates"]


class GateHook(Protocol):
    """What the gate job calls on its interval; the gates/switch work plugs in here.
    `start` runs once the store is open and before the engines load; `role` is this
    daemon's part among those on one database (`leader`, `follower`), and
    `state_file_problem` why the state file could not be written, both for /readyz."""

    def start(self) -> None: ...

    def evaluate(self, now: datetime) -> None: ...

    def role(self) -> str: ...

    def state_file_problem(self) -> str | None: ...

    @property
    def suspicion(self) -> float | None:
        """The largest progress of an undecided enforce detector at the last gate run
        this daemon led (None: not leading, or nothing evaluated)."""
        ...


class NoGates:
    """The default gate hook: nothing is evaluated."""

    def start(self) -> None:
        return None

    def evaluate(self, now: datetime) -> None:
        return None

    def state_file_problem(self) -> str | None:
        return None

    def role(self) -> str:
        return "none"

    @property
    def suspicion(self) -> float | None:
        return None
