"""The heads ablation's figures, from results built by hand."""

from __future__ import annotations

from benchmarks.heads_ablation import ArmFigures, goals
from engine.types import DraftCost, GenerationResult, SpeculativeStats


def result(
    tokens: tuple[int, ...], e2e_s: float, stats: SpeculativeStats | None = None
) -> GenerationResult:
    return GenerationResult(
        text="",
        token_ids=tokens,
        finish_reason="length",
        prompt_tokens=3,
        output_tokens=len(tokens),
        ttft_s=0.1,
        tpot_s=e2e_s / len(tokens),
        e2e_s=e2e_s,
        speculative=stats,
        draft_cost=DraftCost(draft_s=0.2, verify_s=0.8, tree_tokens=12) if stats else None,
    )


# prefill + 3 drafting steps keeping 2, 0 and 1 drafts: 1 + 3 + 1 + 2 = 7 tokens
STATS = SpeculativeStats(
    verify_steps=4,
    draft_tokens=6,
    accepted_tokens=3,
    accepted_per_position=(2, 1),
    drafted_per_position=(3, 3),
)
TOKENS = (1, 2, 3, 4, 5, 6, 7)


class TestArmFigures:
    def test_step_lengths_come_from_the_per_position_counts(self) -> None:
        """Drafting steps that kept 0, 1, 2 drafts give lengths 1, 2, 3; the prefill
        step is left out."""
        arm = ArmFigures()
        arm.add("qa", result(TOKENS, 1.0, STATS))
        assert sorted(arm.step_lengths()) == [1.0, 2.0, 3.0]

    def test_summary_against_the_baseline(self) -> None:
        base, heads = ArmFigures(), ArmFigures()
        base.add("qa", result(TOKENS, 2.0))
        heads.add("qa", result(TOKENS, 1.0, STATS))
        summary = heads.summary(base)
        assert summary["acceptance_length"] == 1 + 3 / 4
        assert summary["acceptance_per_position"] == [2 / 3, 1 / 3]
        assert summary["speedup"] == 2.0
        assert summary["outputs_differing_from_baseline"] == 0
        assert summary["draft_share"] == 0.2
        assert summary["tree_tokens_per_step"] == 4.0  # 12 drafts over 3 drafting steps
        assert summary["acceptance_length_by_category"] == {"qa": 7 / 4}


class TestGoals:
    def test_goals_compare_the_tree_arms(self) -> None:
        """The ratio goal reads the tree arms' ratio, the length goal the causal tree's
        acceptance length; each says whether it was met."""
        report = {
            "causal_over_independent": {"chain": 1.5, "tree": 1.15},
            "arms": {"causal-tree": {"acceptance_length": 2.1}},
        }
        out = goals(report)
        assert out["causal_over_independent_tree"] == {"goal": 1.2, "measured": 1.15, "met": False}
        assert out["causal_tree_acceptance_length"] == {"goal": 2.0, "measured": 2.1, "met": True}
