"""Which configuration of the arms a piece of evidence was measured under.

Drift references, calibrated tie margins, telemetry intervals and probes each belong to
the baseline and one speculative arm as they were configured when measured: another
draft model or server makes them say nothing about the arm as it is now. This module owns
the key they are stored and looked up under: `arm_pair_config` (of a config snapshot's
`arms` section, the baseline and the one arm), `arms_key` (a short stable hash of that)
and `arm_key` (the key of an arm as `Settings` configure it now).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from gates.records import BASELINE_ARM

if TYPE_CHECKING:
    from canaryd.config.settings import Settings

__all__ = ["arm_key", "arm_pair_config", "arms_key"]


def arm_pair_config(arms: object, arm: str) -> object:
    """Of an `arms` section of a config snapshot, what a pair of `arm` was measured with:
    the baseline and that arm (None for an arm the section does not have). A comparison
    arm added or changed leaves the switch arm's evidence and references standing."""
    if not isinstance(arms, dict) or arm not in arms:
        return None
    return {BASELINE_ARM: arms.get(BASELINE_ARM), arm: arms[arm]}


def arms_key(arms: object) -> str:
    """A short, stable key of an arms configuration (the `arms` section of a config
    snapshot): drift references belong to one."""
    encoded = json.dumps(arms, sort_keys=True, default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def arm_key(settings: Settings, arm: str) -> str:
    """The `arms_key` of the baseline and `arm` as `settings` configure them now: the key
    the drift references of `arm` are stored under."""
    return arms_key(arm_pair_config(settings.snapshot().get("arms"), arm))
