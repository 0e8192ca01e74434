"""Per-request routing around what the speculative arm lacks: the state file's
`route_to_baseline`.

A capability that shows in the request — a `seed`, `n > 1`, `logprobs`, a
`response_format`, a `stop` list — can be routed away one request at a time: a router
sends the requests that use it to the baseline, and speculation keeps serving the rest.
`REQUEST_FIELDS` maps each such capability to the request fields a router matches and
the rule each field's value is matched by; the other capabilities (long context, over
the limit, odd input, a burst, cancellation) show in no field, and their regressions are
listed as `not_routable`: only the switch helps there.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from gates.parity import ProbeEvidence

__all__ = ["REQUEST_FIELDS", "Rule", "route_object"]

# set: present and not null, false or empty; gt_1: a number above 1; eq_1: equal to 1.
Rule = Literal["set", "gt_1", "eq_1"]

REQUEST_FIELDS: dict[str, dict[str, Rule]] = {
    "streaming_equals_plain": {"stream": "set"},
    "stop": {"stop": "set"},
    "max_tokens_1": {"max_tokens": "eq_1", "max_completion_tokens": "eq_1"},
    "logprobs": {"logprobs": "set", "top_logprobs": "set"},
    "n_gt_1": {"n": "gt_1"},
    "seed_reproducible": {"seed": "set"},
    "json_schema": {"response_format": "set"},
}


def route_object(probe: ProbeEvidence) -> dict[str, Any]:
    """`route_to_baseline` for the state file: the probe it comes from, each routable
    capability the speculative arm regresses on with its request fields and their rules,
    and the regressions no request field shows."""
    regressed = [c for c in probe.capabilities if c.regressed]
    return {
        "arm": probe.arm,
        "probe_run_id": probe.run_id,
        "probed_at": _iso(probe.finished_at),
        "capabilities": {
            c.name: {"fields": dict(REQUEST_FIELDS[c.name]), "reason": c.reason}
            for c in regressed
            if c.name in REQUEST_FIELDS
        },
        "not_routable": [c.name for c in regressed if c.name not in REQUEST_FIELDS],
    }


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")
