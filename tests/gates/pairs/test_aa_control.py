"""The A/A control (issue #23 part 1): where no teacher can tell a numeric tie from a
bug (llama.cpp, SGLang), an extra arm configured like the baseline measures how often
the deployment disagrees with itself, and the mismatch check's tolerance rises to that
floor — never lower than `max_mismatch_rate`."""

from __future__ import annotations

from gates import GateDecision, GateState, quality_gate
from gates.config import QualityGateConfig
from gates.pairs.testing import at, record, scores
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0


def greedy(n: int, every: int, first: int = 0) -> list[PairRecord]:
    """n greedy pairs, one in `every` divergent with no teacher judgement."""
    return [record(first + i, pair_scores=scores(exact=(first + i) % every != 0)) for i in range(n)]


def mismatch(decision: GateDecision) -> GateDecision:
    return next(c for c in decision.components if c.name == "quality.mismatch")


class TestControlFloor:
    def test_a_deployment_that_disagrees_with_itself_is_not_rolled_back(self) -> None:
        """4 % unjudged divergences on the speculative arm: FAIL against the 0.5 %
        tolerance; with an A/A control diverging 4 % too, the tolerance is the control's
        upper bound and the check never FAILs over 2,000 pairs."""
        arm, control = greedy(2000, 25), greedy(2000, 25)
        config = QualityGateConfig()
        alone = quality_gate(arm, config, now=at(2000), arl0=DEFAULT_ARL0)
        assert mismatch(alone).state is GateState.FAIL
        for n in range(400, 2001, 400):
            judged = quality_gate(
                arm[:n], config, now=at(n), control=control[:n], arl0=DEFAULT_ARL0
            )
            check = mismatch(judged)
            assert check.state is not GateState.FAIL, check.detail
        assert "A/A control: 80/2000 greedy pairs diverged" in check.detail

    def test_a_real_bug_above_the_floor_still_fails(self) -> None:
        """30 % divergences against a 4 % floor: FAIL within 100 pairs."""
        arm, control = greedy(400, 3), greedy(400, 25)
        config = QualityGateConfig()
        for n in range(10, 401, 10):
            decision = quality_gate(
                arm[:n], config, now=at(n), control=control[:n], arl0=DEFAULT_ARL0
            )
            if mismatch(decision).state is GateState.FAIL:
                break
        assert n <= 100, n

    def test_a_quiet_control_never_loosens_the_tolerance(self) -> None:
        """An A/A control with no divergence leaves max_mismatch_rate as the tolerance."""
        arm, control = greedy(2000, 25), greedy(2000, 10**9, first=1)[:1999]
        decision = quality_gate(
            arm, QualityGateConfig(), now=at(2000), control=control, arl0=DEFAULT_ARL0
        )
        assert mismatch(decision).state is GateState.FAIL
        assert mismatch(decision).threshold == 0.005
