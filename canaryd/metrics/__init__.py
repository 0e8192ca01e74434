"""canaryd's Prometheus metrics: what a pair, a cycle and the store look like from outside.

`CanarydMetrics` (`registry`) composes one family per concern on a registry of its own:
`pairs` (each pair's timings, errors, acceptance and comparison), `liveness` (cycles,
gate runs, heartbeat, engine readiness), `store`, `switch` (gates, detectors, the switch,
the leader, actuators), `probe` (capability probes), `traffic` (the mirror sink and the
traffic mix), `build` (versions and engine identities) and `telemetry` (scrapes of the
arms' serving engines). A consumer holds the family it moves (`SwitchMetrics`,
`StoreMetrics`, …); only the daemon, which hands them out, and the status server, which
renders them, hold the whole. Every label value comes from a bounded set
(`labels`), and `metrics_reference()` renders the table docs/metrics.md carries
verbatim, from the same declarations that build the registry (`declare`).
"""

from __future__ import annotations

from canaryd.metrics.build import BuildMetrics
from canaryd.metrics.labels import (
    ACCEPTANCE_LENGTH_BUCKETS,
    BUILD_IDENTITY_KEYS,
    LATENCY_BUCKETS,
    MAX_POSITION_LABEL,
    OTHER,
    QUALITY_DELTA_BUCKETS,
    SPEEDUP_BUCKETS,
    TPOT_BUCKETS,
    PairOutcome,
    pair_outcome,
    position_label,
)
from canaryd.metrics.liveness import LivenessMetrics
from canaryd.metrics.pairs import PairMetrics
from canaryd.metrics.probe import ProbeMetrics
from canaryd.metrics.registry import CanarydMetrics, metrics_reference
from canaryd.metrics.store import StoreMetrics
from canaryd.metrics.switch import SwitchMetrics
from canaryd.metrics.telemetry import TelemetryMetrics
from canaryd.metrics.traffic import TrafficMetrics

__all__ = [
    "ACCEPTANCE_LENGTH_BUCKETS",
    "BUILD_IDENTITY_KEYS",
    "LATENCY_BUCKETS",
    "MAX_POSITION_LABEL",
    "OTHER",
    "QUALITY_DELTA_BUCKETS",
    "SPEEDUP_BUCKETS",
    "TPOT_BUCKETS",
    "BuildMetrics",
    "CanarydMetrics",
    "LivenessMetrics",
    "PairMetrics",
    "PairOutcome",
    "ProbeMetrics",
    "StoreMetrics",
    "SwitchMetrics",
    "TelemetryMetrics",
    "TrafficMetrics",
    "metrics_reference",
    "pair_outcome",
    "position_label",
]
