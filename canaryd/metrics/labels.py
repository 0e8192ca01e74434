"""The bounded label values and bucket bounds of canaryd's Prometheus metrics.

Every label value `canaryd.metrics` exports comes from here: the fixed sets (pair
outcomes, gate states, switch targets, actuators), the draft `position` label, and
`BoundedLabel`, which admits free-form values (categories, arm names, store error kinds)
up to a limit and folds the rest into `other`. The histogram bucket bounds live here too,
with `MetricDoc`, the row of the generated metrics reference.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from threading import Lock
from typing import Final, Literal

from gates.records import PairRecord

# Log-spaced, roughly x1.6 per bucket, on round values: fine enough for a P99 to be read
# within a bucket's width, few enough that arms x categories x buckets stays small.
LATENCY_BUCKETS: Final = (
    0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.15, 0.25, 0.4, 0.6,
    1.0, 1.5, 2.5, 4.0, 6.0, 10.0, 15.0, 25.0, 40.0, 60.0, 120.0,
)  # fmt: skip
TPOT_BUCKETS: Final = (
    0.001, 0.0015, 0.0025, 0.004, 0.006, 0.01, 0.015, 0.025, 0.04, 0.06,
    0.1, 0.15, 0.25, 0.4, 0.6, 1.0, 2.0,
)  # fmt: skip
# A gap between two tokens: zero inside a verify step's burst (the first bucket), up to
# the stalls a streaming user feels.
ITL_BUCKETS: Final = (*TPOT_BUCKETS, 5.0, 15.0)
# Tokens per verify step lie in 1 … k+1; quarter steps where typical values sit (1–3),
# then coarser, up to k = 16 drafted tokens.
ACCEPTANCE_LENGTH_BUCKETS: Final = (
    1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0,
    6.0, 7.0, 8.0, 9.0, 12.0, 17.0,
)  # fmt: skip
# Dense around 1.0, where "speculation stopped paying off" is decided.
SPEEDUP_BUCKETS: Final = (
    0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0,
    6.0, 8.0,
)  # fmt: skip
QUALITY_DELTA_BUCKETS: Final = (
    -1.0, -0.5, -0.25, -0.1, -0.05, -0.01, 0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip

OTHER: Final = "other"
MAX_POSITION_LABEL: Final = 16  # positions 1 … 15 are labelled alone, the rest "16+"
# A capability probe's cell states (canaryd.parity.checks.State).
PROBE_STATES = ("pass", "fail", "unsupported")
LABEL_VALUE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")  # as suites.CATEGORY_PATTERN
CHECK_VALUE = re.compile(r"^[a-z][a-z0-9_.]{0,79}$")  # a gate's check: latency.e2e.p99
LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")
BUILD_VALUE_MAX = 128
BUILD_KEYS_MAX = 8  # per identity dict: an engine identity is a handful of fields
# The engine identity fields exported as build-info labels; anything else an engine
# reports stays in the run record. URLs among them are exported by `public_url` only.
BUILD_IDENTITY_KEYS: Final = frozenset(
    {
        "kind", "mode", "model", "device", "dtype", "method", "num_draft_tokens",
        "max_ngram_size", "draft_model", "early_exit_layer", "server_kind", "api",
        "base_url", "seed",
    }
)  # fmt: skip
URL_IDENTITY_KEYS = frozenset({"base_url"})

PairOutcome = Literal["complete", "baseline_error", "speculative_error", "both_error"]
PAIR_OUTCOMES: Final[tuple[PairOutcome, ...]] = (
    "complete",
    "baseline_error",
    "speculative_error",
    "both_error",
)
GATE_STATES: Final = ("PASS", "WARN", "FAIL", "INCONCLUSIVE", "NODATA")
SWITCH_TARGETS: Final = ("auto", "rolled_back")
ACTOR_KINDS: Final = ("gate", "user")
ACTUATORS: Final = ("state_file", "command", "webhook", "alertmanager")
MetricType = Literal["counter", "gauge", "histogram", "info"]


def pair_outcome(record: PairRecord) -> PairOutcome:
    """Which arms of a pair produced a usable result."""
    if record.baseline.ok and record.speculative.ok:
        return "complete"
    if record.speculative.ok:
        return "baseline_error"
    if record.baseline.ok:
        return "speculative_error"
    return "both_error"


def position_label(position: int) -> str:
    """The `position` label of a 1-based draft position: "1" … "15", then "16+"."""
    return str(position) if position < MAX_POSITION_LABEL else f"{MAX_POSITION_LABEL}+"


class BoundedLabel:
    """Admits label values until `limit` distinct ones are seen, then folds the rest into
    `other`, so a misconfigured suite or a free-form error kind cannot explode the series
    count. Values that are not short lower-case identifiers are folded too."""

    def __init__(
        self, limit: int, allowed: Iterable[str] = (), pattern: re.Pattern[str] = LABEL_VALUE
    ) -> None:
        self._limit = limit
        self._pattern = pattern
        self._seen: set[str] = {v for v in allowed if pattern.match(v)}
        self._lock = Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if not self._pattern.match(value) or value == OTHER:
            return OTHER
        with self._lock:
            if len(self._seen) >= self._limit:
                return OTHER
            self._seen.add(value)
        return value


@dataclass(frozen=True, slots=True)
class MetricDoc:
    """One row of the metrics reference."""

    name: str  # as exposed: counters with `_total`, info with `_info`
    type: MetricType
    labels: tuple[str, ...]
    meaning: str
    example: str  # a PromQL expression a dashboard or alert would use
