"""The mix screen (gates/telemetry/mix.py): `telemetry.acceptance` judged against the past
stands only where the drift gate (the suites' per-category acceptance, which the traffic
mix cannot move) agrees with it; set aside it is NODATA in warn mode, saying why. Against
the concurrent stable it always stands."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gates.core import GateDecision, GateMode, GateState
from gates.telemetry.acceptance import STATISTIC
from gates.telemetry.concurrent import CONCURRENT_STATISTIC
from gates.telemetry.mix import screen_past_reference

NOW = datetime(2026, 1, 1, tzinfo=UTC)
S = GateState


def made(name: str, state: GateState, statistic: str = "") -> GateDecision:
    return GateDecision(
        name=name,
        state=state,
        mode=GateMode.ENFORCE,
        critical=False,
        evaluated_at=NOW,
        statistic=statistic,
        detail=f"{name} read",
    )


def screened(acceptance: GateState, drift: GateState | None, statistic: str = STATISTIC):  # type: ignore[no-untyped-def]
    decisions = [made("telemetry.acceptance", acceptance, statistic)]
    if drift is not None:
        decisions.insert(0, made("drift", drift))
    return next(d for d in screen_past_reference(decisions) if d.name == "telemetry.acceptance")


@pytest.mark.parametrize(
    ("acceptance", "drift"),
    [(S.PASS, S.PASS), (S.FAIL, S.FAIL), (S.FAIL, S.WARN), (S.WARN, S.FAIL)],
)
def test_agreeing_with_drift_it_stands(acceptance: GateState, drift: GateState) -> None:
    kept = screened(acceptance, drift)
    assert kept.state is acceptance and kept.enforced


@pytest.mark.parametrize(
    ("acceptance", "drift", "why"),
    [
        (S.FAIL, S.PASS, "a shift in the traffic mix"),
        (S.WARN, S.PASS, "a shift in the traffic mix"),
        (S.PASS, S.FAIL, "may hide the drop"),
        (S.PASS, S.INCONCLUSIVE, "drift) is INCONCLUSIVE"),
        (S.FAIL, S.NODATA, "drift) is NODATA"),
        (S.FAIL, None, "drift) is NODATA"),
    ],
)
def test_otherwise_it_is_set_aside_and_says_why(
    acceptance: GateState, drift: GateState | None, why: str
) -> None:
    """Set aside: NODATA in warn mode (neither trips nor holds back the verdict), its
    reading kept in the detail with the hint to configure the stable."""
    aside = screened(acceptance, drift)
    assert aside.state is S.NODATA and aside.mode is GateMode.WARN
    assert why in aside.detail
    assert f"set aside ({acceptance.value} as read)" in aside.detail
    assert "[telemetry.arms.<arm>.stable]" in aside.detail
    assert "telemetry.acceptance read" in aside.detail


def test_against_the_concurrent_stable_it_always_stands() -> None:
    kept = screened(S.FAIL, S.PASS, CONCURRENT_STATISTIC)
    assert kept.state is S.FAIL and kept.enforced


@pytest.mark.parametrize("state", [S.NODATA, S.INCONCLUSIVE])
def test_undecided_readings_are_left_alone(state: GateState) -> None:
    assert screened(state, S.PASS).mode is GateMode.ENFORCE
