"""Whether a `telemetry.acceptance` decision against the past may stand: the traffic mix
shown comparable.

Acceptance is a property of the traffic as much as of the engine: n-gram drafting copies
from code and summaries, not from chat. A reference from the past (pinned from the arm's
first healthy intervals, the previous revision's newest, or configured) compares today's
mix with that moment's, so a drop may be the mix, and a hold may hide a fault behind a
kinder mix. Production telemetry has no categories; the pairs have: the drift gate
judges the suites' acceptance per category, which the mix cannot move. So a decision
against the past stands only where the drift gate agrees with it (both PASS, or both
WARN or FAIL). Otherwise it is set aside: NODATA, in `warn` mode (it neither trips nor
holds back the verdict, and the drift gate, no longer covered by it, judges acceptance
on pairs), its detail saying what it read and why it was set aside. A decision against
the concurrent stable (`gates.telemetry.concurrent`) always stands: the stable serves the
same traffic at the same moment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gates.core import GateDecision, GateMode, GateState
from gates.telemetry.concurrent import judged_concurrently

__all__ = ["screen_past_reference"]

NAME = "telemetry.acceptance"
_DRIFT = "drift"
_DECIDED = (GateState.PASS, GateState.WARN, GateState.FAIL)
_DOWN = (GateState.WARN, GateState.FAIL)
STABLE_HINT = (
    "configure the concurrent stable ([telemetry.arms.<arm>.stable]) to judge production "
    "acceptance against the pods that serve beside it"
)


def screen_past_reference(decisions: Sequence[GateDecision]) -> tuple[GateDecision, ...]:
    """`decisions` with `telemetry.acceptance` set aside where it was judged against the
    past and the drift gate among `decisions` does not agree with it."""
    drift = next((d for d in decisions if d.name == _DRIFT), None)
    return tuple(
        _screened(d, drift)
        if d.name == NAME and d.state in _DECIDED and not judged_concurrently(d)
        else d
        for d in decisions
    )


def _screened(acceptance: GateDecision, drift: GateDecision | None) -> GateDecision:
    drift_state = drift.state if drift is not None else GateState.NODATA
    fell = acceptance.state in _DOWN
    if (drift_state is GateState.PASS and not fell) or (drift_state in _DOWN and fell):
        return acceptance
    if drift_state is GateState.PASS:
        why = (
            "production acceptance fell against a reference from the past while the "
            "suites' per-category acceptance held (drift PASS): a shift in the traffic "
            "mix, not shown to be the engine"
        )
    elif drift_state in _DOWN:
        why = (
            "production acceptance held against a reference from the past while the "
            f"suites' per-category acceptance fell (drift {drift_state.value}): the "
            "traffic mix may hide the drop"
        )
    else:
        why = (
            "nothing shows today's traffic mix comparable with the reference's: no "
            f"concurrent stable, and the suites' per-category acceptance (drift) is "
            f"{drift_state.value}"
        )
    return dataclasses.replace(
        acceptance,
        state=GateState.NODATA,
        mode=GateMode.WARN if acceptance.enforced else acceptance.mode,
        detail=f"set aside ({acceptance.state.value} as read): {why}; {STABLE_HINT}. "
        f"Read: {acceptance.detail}",
    )
