"""All gates on one window, in a fixed order: what the daemon's gate job calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from canaryd.records import PairRecord
from gates.config import GatesConfig
from gates.core import GateDecision
from gates.drift import ReferenceStats, drift_gate
from gates.error_rate import error_gate
from gates.latency import latency_gate
from gates.liveness import liveness_gate
from gates.quality import quality_gate
from gates.speedup import speedup_gate


def evaluate_all(
    records: Sequence[PairRecord],
    config: GatesConfig,
    *,
    now: datetime,
    references: Mapping[str, ReferenceStats] | None = None,
) -> list[GateDecision]:
    """Liveness, error, latency, quality, speedup and drift decisions for `records` at `now`.

    `records` must cover the longest configured window; each gate selects its own."""
    return [
        liveness_gate(records, config.liveness, now=now),
        error_gate(records, config.error, now=now),
        latency_gate(records, config.latency, now=now),
        quality_gate(records, config.quality, now=now),
        speedup_gate(records, config.speedup, now=now),
        drift_gate(records, config.drift, now=now, references=references),
    ]
