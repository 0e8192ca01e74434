"""The quality gate's tie-rate check (`quality.ties`): a deployment whose greedy pairs
diverge within the tie margin far more often than `max_tie_rate` is not healthy (a kernel
that takes the runner-up of every close call ties on nearly every output); ties at a
bf16 deployment's rate never FAIL; judged margins count by their size either way."""

from __future__ import annotations

from dataclasses import replace

from gates.config import QualityGateConfig
from gates.core import GateDecision, GateState
from gates.pairs.quality import quality_gate
from gates.pairs.testing import at, record, scores
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0


def component(
    records: list[PairRecord], name: str, config: QualityGateConfig | None = None
) -> GateDecision:
    decision = quality_gate(
        records, config or QualityGateConfig(), now=at(len(records)), arl0=DEFAULT_ARL0
    )
    return next(c for c in decision.components if c.name == name)


def tied(i: int, every: int, margin: float = 0.3) -> PairRecord:
    """Pair `i`: a tie (diverged within the margin) on one pair in `every`."""
    return record(i, pair_scores=scores(exact=i % every != 0, margin=None if i % every else margin))


class TestTieRate:
    def test_a_runner_up_kernel_fails_by_the_tie_rate_within_a_hundred_pairs(self) -> None:
        """Every greedy pair diverges, each within 0.5 nats: no mismatch, but the tie rate
        (1.0 against a ceiling of 0.5) FAILs quality soon after min_samples."""
        records = [tied(i, 1, margin=0.45) for i in range(100)]
        ties = component(records, "quality.ties")
        assert ties.state is GateState.FAIL, ties.detail
        assert component(records, "quality.mismatch").state is not GateState.FAIL
        assert "1 of 1 distinct prompts" in ties.detail

    def test_a_bf16_tie_rate_never_fails_and_passes(self) -> None:
        """20 % of greedy pairs tie (a bf16 deployment at long outputs): PASS."""
        records = [tied(i, 5) for i in range(3000)]
        for n in range(500, 3001, 500):
            assert component(records[:n], "quality.ties").state is not GateState.FAIL
        assert component(records, "quality.ties").state is GateState.PASS

    def test_the_ceiling_is_configured(self) -> None:
        records = [tied(i, 5) for i in range(400)]
        strict = QualityGateConfig(max_tie_rate=0.05)
        assert component(records, "quality.ties", strict).state is GateState.FAIL

    def test_a_negative_margin_is_no_tie(self) -> None:
        """The judge preferring the speculative token by 2.5 nats is as real a divergence
        as the reverse: counted as a mismatch."""
        records = [tied(i, 5, margin=-2.5) for i in range(200)]
        assert component(records, "quality.mismatch").state is GateState.FAIL

    def test_a_lower_bound_is_never_a_tie(self) -> None:
        """A margin that is only a lower bound (the speculative token not among the
        baseline's listed candidates) within the tie margin proves nothing: counted."""
        records = [tied(i, 5, margin=0.1) for i in range(200)]
        bounded = [
            replace(r, scores=replace(r.scores, divergence_judge="bound")) if r.scores else r
            for r in records
        ]
        assert component(records, "quality.mismatch").state is not GateState.FAIL
        mismatch = component(bounded, "quality.mismatch")
        assert mismatch.state is GateState.FAIL, mismatch.detail
        assert "first divergent token only" in mismatch.detail
