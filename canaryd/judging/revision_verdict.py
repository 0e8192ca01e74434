"""One revision's verdict as a value: `RevisionVerdict`, its `estimate` and its JSON views.

`as_json` gives the whole body of `GET /v1/verdict` or, `compact`, one under
`COMPACT_MAX_BYTES` for a rollout tool's measurement history (verdict, freshness, pairs,
whether speculation is on, when the revision FAILed, a short reason and the estimate).
`canaryd.judging.verdict` judges it; `canaryd.judging.kayenta` and the Flagger hooks
(`canaryd.server.rollout`) answer from it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from canaryd.judging.increase import SinceIncrease
from canaryd.judging.latch import Failure
from gates import GateDecision
from gates.config import GatesConfig
from gates.cycle import Judgement, Verdict
from gates.estimate import estimate as estimate_need

__all__ = ["COMPACT_MAX_BYTES", "RevisionVerdict", "estimate", "finite"]

# `?view=compact`: Argo keeps every measurement's body in the AnalysisRun's status, so the
# compact body stays under this many bytes whatever the revision and the reason.
COMPACT_MAX_BYTES = 1000
COMPACT_REASON_CHARS = 160


def estimate(
    judgement: Judgement | None,
    config: GatesConfig | None,
    pairs_per_minute: float | None,
    *,
    min_pairs: int = 0,
) -> dict[str, Any]:
    """`pairs_to_decision` and `minutes_to_decision` at `pairs_per_minute`
    (`gates.estimate`), and the check `waiting_on`: 0 once the verdict decided (PASS or
    FAIL); None where no bound on what is still needed is known or no pair runs."""
    if judgement is None or config is None:
        return {"pairs_to_decision": None, "minutes_to_decision": None, "waiting_on": None}
    if judgement.verdict in ("PASS", "FAIL"):
        return {"pairs_to_decision": 0, "minutes_to_decision": 0.0, "waiting_on": None}
    need = estimate_need(judgement, config, pairs_per_minute=pairs_per_minute, min_pairs=min_pairs)
    return need.to_dict()


@dataclass(frozen=True, slots=True)
class RevisionVerdict:
    """One revision's verdict with everything behind it (`as_json` is the HTTP body)."""

    verdict: Verdict
    fresh: bool
    evaluated_at: datetime
    age_s: float
    revision: str
    pairs: int
    arms: dict[str, Any]
    speculative_enabled: bool
    generation: int
    reason: str
    gates: tuple[GateDecision, ...] = ()
    # The pair rate of the moment, for `estimate` (None: no pair runs).
    pairs_per_minute: float | None = None
    # The rollout burst's cost on this revision (`canaryd.daemon.burst`), None without one.
    burst: dict[str, Any] | None = None
    # Whether the revision's window is open and not superseded (not part of the body).
    window_current: bool = False
    judgement: Judgement | None = field(default=None, compare=False, repr=False)
    gates_config: GatesConfig | None = field(default=None, compare=False, repr=False)
    min_pairs: int = 0
    # The FAIL this verdict stands on (`canaryd.judging.latch`), None unless FAIL; `latched`:
    # already recorded in the revision's window.
    failure: Failure | None = None
    latched: bool = False
    # What the revision measured since its last confirmed traffic increase (None: no
    # judgement of its evidence).
    since_increase: SinceIncrease | None = field(default=None, compare=False, repr=False)

    @property
    def failed_at(self) -> datetime | None:
        """When the revision's FAIL was judged or happened (None: not FAIL)."""
        return self.failure.at if self.failure is not None else None

    @property
    def decided(self) -> bool:
        return self.verdict in ("PASS", "FAIL")

    def estimate(self) -> dict[str, Any]:
        """`pairs_to_decision`, `minutes_to_decision` at the current pair rate, and the
        check `waiting_on`."""
        if self.decided:
            return {"pairs_to_decision": 0, "minutes_to_decision": 0.0, "waiting_on": None}
        return estimate(
            self.judgement, self.gates_config, self.pairs_per_minute, min_pairs=self.min_pairs
        )

    def as_json(self, view: str = "full") -> dict[str, Any]:
        """The `/v1/verdict` body: these fields exactly, no non-finite number (null);
        `compact`: verdict, fresh, revision, pairs, whether speculation is on, when the
        FAIL was (`failed_at`), a short reason and the estimate, in under
        `COMPACT_MAX_BYTES` of JSON."""
        if view == "compact":
            return self._compact()
        body = {
            "verdict": self.verdict,
            "fresh": self.fresh,
            "evaluated_at": self.evaluated_at.isoformat(),
            "age_s": round(self.age_s, 3),
            "revision": self.revision,
            "pairs": self.pairs,
            "arms": self.arms,
            "speculative_enabled": self.speculative_enabled,
            "generation": self.generation,
            "reason": self.reason,
            "failed_at": _stamp(self.failed_at),
            "estimate": self.estimate(),
            "burst": self.burst,
            "gates": [decision.to_dict() for decision in self.gates],
        }
        cleaned: dict[str, Any] = finite(body)
        return cleaned

    def _compact(self) -> dict[str, Any]:
        reason = self.reason
        if len(reason) > COMPACT_REASON_CHARS:
            reason = reason[: COMPACT_REASON_CHARS - 1] + "…"
        while True:
            body: dict[str, Any] = finite(
                {
                    "verdict": self.verdict,
                    "fresh": self.fresh,
                    "revision": self.revision,
                    "pairs": self.pairs,
                    "speculative_enabled": self.speculative_enabled,
                    "failed_at": _stamp(self.failed_at),
                    "reason": reason,
                    "estimate": self.estimate(),
                }
            )
            size = len(json.dumps(body, sort_keys=True, allow_nan=False).encode())
            if size < COMPACT_MAX_BYTES or not reason:
                return body
            reason = reason[: len(reason) // 2] + "…" if len(reason) > 1 else ""


def _stamp(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def finite(value: Any) -> Any:
    """`value` with every non-finite float, however deeply nested, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value
