"""All gates on one window, in a fixed order: what the daemon's gate job calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from gates.budget import detector_arl0, detector_budget
from gates.config import GatesConfig
from gates.core import GateDecision
from gates.drift import ReferenceStats, drift_gate
from gates.error_rate import error_gate
from gates.latency import latency_gate
from gates.liveness import liveness_gate
from gates.quality import quality_gate
from gates.records import PairRecord
from gates.speedup import speedup_gate


def evaluate_all(
    records: Sequence[PairRecord],
    config: GatesConfig,
    *,
    now: datetime,
    references: Mapping[str, ReferenceStats] | None = None,
    since: datetime | None = None,
    category_since: Mapping[str, datetime] | None = None,
    control: Sequence[PairRecord] | None = None,
) -> list[GateDecision]:
    """Liveness, error, latency, quality, speedup and drift decisions for `records` at `now`.

    `records` must cover the longest configured window; each gate selects its own, and
    only pairs after `since` (the current evidence's start: the last switch transition or
    arms change) count. Each statistical detector gets its share of the false-alarm budget.
    Under `policy.scope = "category"` speedup and quality judge each category on its own.
    The per-category checks (drift always; speedup and quality under that scope) also
    read a category's pairs only after `category_since[category]`, when that category
    last moved on its own; the gates on all traffic read every pair. `control`: the pairs
    of the A/A control arm (`quality.control_arm`), if one is configured.
    """
    arl0 = detector_arl0(config)
    by_category = config.policy.scope == "category"
    cuts = category_since or {}
    own = [r for r in records if (cut := cuts.get(r.prompt.category)) is None or r.started_at > cut]
    split = own if by_category else records
    return [
        liveness_gate(records, config.liveness, now=now),
        error_gate(records, config.error, now=now, arl0=arl0, since=since),
        latency_gate(
            records,
            config.latency,
            now=now,
            arl0=arl0,
            budget_30d=detector_budget(config),
            since=since,
        ),
        quality_gate(
            split,
            config.quality,
            now=now,
            arl0=arl0,
            since=since,
            by_category=by_category,
            control=control,
        ),
        speedup_gate(
            split, config.speedup, now=now, arl0=arl0, since=since, by_category=by_category
        ),
        drift_gate(
            own,
            config.drift,
            now=now,
            references=references,
            arl0=arl0,
            budget_30d=detector_budget(config),
            since=since,
        ),
    ]
