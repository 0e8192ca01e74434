"""The switch policy's configuration, `SwitchPolicyConfig` (`[gates.policy]`): hysteresis,
cooldown, latch and restore rules.

Apart from the gates' configurations (`gates.config`, which re-exports it) so that the
switch (`gates.switch.policy`) and the kill switch's commands read it without building every
gate's configuration.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gates.config_base import Strict

__all__ = ["SwitchPolicyConfig"]


class SwitchPolicyConfig(Strict):
    """The switch's hysteresis, cooldown, latch and restore rules (gates/switch/policy.py)."""

    trip_k: int = Field(default=1, ge=1)
    trip_m: int = Field(default=1, ge=1)
    cooldown_seconds: float = Field(default=1800.0, ge=0)
    latch_trips: int = Field(default=3, ge=1)
    latch_window_seconds: float = Field(default=24 * 3600.0, gt=0)
    auto_restore: bool = False
    restore_passes: int = Field(default=3, ge=1, description="consecutive all-PASS evaluations")
    evidence_max_age_seconds: float = Field(default=900.0, gt=0)
    scope: Literal["global", "category"] = Field(
        default="global",
        description="category: a per-category gate's FAIL rolls back only that category",
    )

    @model_validator(mode="after")
    def _k_of_m(self) -> SwitchPolicyConfig:
        if self.trip_k > self.trip_m:
            raise ValueError(f"trip_k={self.trip_k} exceeds trip_m={self.trip_m}")
        return self
