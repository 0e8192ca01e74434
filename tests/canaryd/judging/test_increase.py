"""When a revision's traffic may grow (`canaryd.judging.increase.hold_reason`): the rule on
hand-built decisions, the default config's gates and `rollout.increase_evidence_share`'s
default (0.1)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from canaryd.judging.increase import INCREASE_GATES, SinceIncrease, hold_reason, needed
from gates import GateDecision, GateMode, GateState
from gates.config import GatesConfig

AT = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
P, W, F, N, U = (
    GateState.PASS,
    GateState.WARN,
    GateState.FAIL,
    GateState.NODATA,
    GateState.INCONCLUSIVE,
)
SHARE = 0.1
CONFIG = GatesConfig()


def decision(name: str, state: GateState, mode: GateMode = GateMode.ENFORCE) -> GateDecision:
    return GateDecision(name=name, state=state, mode=mode, critical=False, evaluated_at=AT)


def decisions(**states: GateState) -> list[GateDecision]:
    """Liveness PASS, then each named gate (dots as `__`) in the given state."""
    return [decision("liveness", P)] + [
        decision(name.replace("__", "."), state) for name, state in states.items()
    ]


def hold(
    found: list[GateDecision],
    *,
    pairs: int = 1000,
    requests: int = 0,
    covered: tuple[str, ...] = (),
    verdict: str = "INCONCLUSIVE",
    fresh: bool = True,
) -> str | None:
    return hold_reason(
        verdict, fresh, found, covered, SinceIncrease(AT, pairs, requests), CONFIG, SHARE
    )


class TestHoldReason:
    def test_liveness_alone_never_grows_traffic(self) -> None:
        """Liveness PASS with error, latency and quality NODATA holds the weight, naming
        each of them."""
        why = hold(decisions(error=N, latency=N, quality=N))
        assert why is not None and why.startswith("no evidence from the revision since")
        assert "error NODATA; latency NODATA; quality NODATA" in why
        assert hold([decision("liveness", P)]) is not None

    def test_every_gate_with_evidence_and_enough_new_pairs_grows_it(self) -> None:
        """Error, latency and quality decided (INCONCLUSIVE counts: not NODATA) and at
        least the share of each one's min_samples new pairs: yes."""
        assert hold(decisions(error=U, latency=P, quality=U), pairs=30) is None

    def test_new_pairs_since_the_last_increase_are_counted_per_gate(self) -> None:
        """With the defaults a step needs 10 new pairs for error and quality, 30 for
        latency (a tenth of 100, 300)."""
        assert [needed(SHARE, CONFIG.error.min_samples), needed(SHARE, 300)] == [10, 30]
        why = hold(decisions(error=P, latency=P, quality=P), pairs=12)
        assert why is not None and why.endswith("for latency: 12 of 30 pairs")
        assert "error" not in why and "quality" not in why

    @pytest.mark.parametrize("state", [W, F])
    def test_an_enforce_gate_warn_or_fail_holds_it(self, state: GateState) -> None:
        """Any enforce gate WARN or FAIL holds the weight, whatever the evidence."""
        why = hold(decisions(error=P, latency=P, quality=P, speedup=state))
        assert why == f"an enforce gate is not clear: speedup {state.value}"

    def test_gates_not_enforced_count_as_evidence_never_against_it(self) -> None:
        """A warn-mode gate's decision is evidence (not NODATA), and its WARN holds
        nothing."""
        found = [
            decision("liveness", P),
            *(decision(name, W, GateMode.WARN) for name in INCREASE_GATES),
        ]
        assert hold(found) is None

    def test_a_covering_telemetry_gate_stands_in_with_requests(self) -> None:
        """With telemetry.errors and telemetry.latency enforced, error and latency have
        evidence from them (not NODATA, and 50 new production requests each) while their
        pair gates are NODATA; a covered pair gate's WARN holds nothing, its FAIL does."""
        covered = ("error", "latency", "liveness", "speedup")
        found = decisions(error=W, latency=N, quality=P, telemetry__errors=P, telemetry__latency=U)
        assert hold(found, pairs=10, requests=50, covered=covered) is None
        short = hold(found, pairs=10, requests=49, covered=covered)
        assert short is not None
        assert "telemetry.errors: 49 of 50 requests; telemetry.latency: 49 of 50" in short
        dark = decisions(error=P, latency=P, quality=P, telemetry__errors=N, telemetry__latency=P)
        assert "telemetry.errors NODATA" in (hold(dark, requests=99, covered=covered) or "")
        failing = decisions(error=F, latency=N, quality=P, telemetry__errors=P)
        assert hold(failing, requests=99, covered=covered) == (
            "an enforce gate is not clear: error FAIL"
        )

    @pytest.mark.parametrize(
        ("verdict", "fresh", "says"),
        [
            ("FAIL", True, "the revision FAILed"),
            ("PASS", False, "the verdict is not fresh"),
        ],
    )
    def test_a_fail_or_a_stale_verdict_holds_it(self, verdict: str, fresh: bool, says: str) -> None:
        """Whatever the evidence, a FAIL (latched included) or a verdict that is not fresh
        holds the weight."""
        found = decisions(error=P, latency=P, quality=P)
        why = hold(found, verdict=verdict, fresh=fresh)
        assert why is not None and why.startswith(says)
