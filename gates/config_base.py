"""What every gate's configuration section is built on: the strict model and
`GateConfigBase` (mode, evidence size, window, confidence).

Kept apart from `gates.config` so that what reads only a section's common fields (the
window rules in `gates.window`, the detectors in `gates.stats.detectors`) and the switch
policy's own section (`gates.switch.config`, held by `GatesConfig`) sit below it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.bounds import check_bounds
from gates.core import GateMode


class Strict(BaseModel):
    """Unknown keys refused, values frozen, no inf or NaN, every duration and count bounded."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _bounded = field_validator("*")(check_bounds)


class GateConfigBase(Strict):
    """What every gate has: how it acts, how much evidence it needs, which window it reads.

    The window is the last `window_pairs` pairs that started within `window_seconds`
    before `now`; either limit may be None, not both. `confidence` is the one-sided level
    of each bound a decision rests on.
    """

    mode: GateMode = GateMode.ENFORCE
    critical: bool = False
    min_samples: int = Field(default=100, ge=1)
    window_pairs: int | None = Field(default=5000, ge=1)
    window_seconds: float | None = Field(default=24 * 3600.0, gt=0)
    confidence: float = Field(default=0.8, gt=0.5, lt=1.0)

    @model_validator(mode="after")
    def _some_window(self) -> GateConfigBase:
        if self.window_pairs is None and self.window_seconds is None:
            raise ValueError("a gate needs window_pairs, window_seconds, or both")
        return self


def check_quantiles_and_metrics(
    quantiles: Sequence[float], metrics: Sequence[str], names: str
) -> None:
    """The latency sections' rule: quantiles a non-empty list within (0, 1), at least one
    metric (`names` lists the ones the section takes, for the message)."""
    if not quantiles or any(not 0 < q < 1 for q in quantiles):
        raise ValueError("quantiles must be a non-empty list of values in (0, 1)")
    if not metrics:
        raise ValueError(f"metrics must name at least one of {names}")
