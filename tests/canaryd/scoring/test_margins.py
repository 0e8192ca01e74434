"""Judging greedy divergences (canaryd.scoring.margins): the baseline's own top log-probs
at the first divergence (`first`, or a lower bound `bound` when the speculative token is
unlisted), teacher-forced gaps over every token (`forced`), absolute margins; and how
the quality gate reads them: a bound never proves a tie, a negative margin is no tie."""

from __future__ import annotations

from dataclasses import replace

import pytest

from canaryd.scoring.margins import Judged, combined, top_logprobs_margin
from engine.types import GenerationResult, TokenLogprobs
from gates.records import PairScores


def baseline(*tokens: TokenLogprobs) -> GenerationResult:
    text = "".join(t.token for t in tokens)
    return GenerationResult(
        text=text, token_ids=(), finish_reason="stop", prompt_tokens=0,
        output_tokens=len(tokens), ttft_s=None, tpot_s=None, e2e_s=0.1,
        token_logprobs=tokens,
    )  # fmt: skip


def token(text: str, logprob: float, *top: tuple[str, float]) -> TokenLogprobs:
    return TokenLogprobs(text, logprob, top or ((text, logprob),))


RED = token("Red", -0.1)
THE = token(" the", -0.6, (" the", -0.6), (" a", -0.9), (" then", -1.0), (" an", -3.0))
SKY = token(" sky", -0.2)
BASE = baseline(RED, THE, SKY)


class TestTopLogprobs:
    def test_a_listed_speculative_token_gives_the_margin(self) -> None:
        assert top_logprobs_margin(BASE, "Red a sky") == Judged(pytest.approx(0.3), "first")

    def test_the_longest_listed_token_the_text_continues_with(self) -> None:
        """ " then" and " the" both start " thence": the longer one is the token taken."""
        judged = top_logprobs_margin(BASE, "Red thence")
        assert judged == Judged(pytest.approx(0.4), "first")

    def test_an_unlisted_token_is_a_lower_bound(self) -> None:
        """ " dog" is not among the four listed: its log-prob is at most the last one's."""
        assert top_logprobs_margin(BASE, "Red dog") == Judged(pytest.approx(2.4), "bound")

    def test_a_speculative_token_the_baseline_prefers_is_judged_by_its_size(self) -> None:
        """The chosen token need not be the listed best (a server's penalties): the margin
        is absolute."""
        chosen = token(" a", -2.0, (" the", -0.5), (" a", -2.0))
        assert top_logprobs_margin(baseline(RED, chosen), "Red the") == Judged(1.5, "first")

    def test_no_judgement_for_a_prefix_an_agreement_or_misaligned_log_probs(self) -> None:
        assert top_logprobs_margin(BASE, "Red") is None  # the speculative arm stopped
        assert top_logprobs_margin(BASE, "Red the sky and more") is None
        assert top_logprobs_margin(replace(BASE, text="Blue the sky"), "Red a sky") is None
        assert top_logprobs_margin(replace(BASE, token_logprobs=()), "Red a sky") is None


class TestCombined:
    def test_forced_gaps_judge_every_token(self) -> None:
        """A later token 2 nats from the teacher's argmax makes a divergence whose first
        token tied a real one."""
        assert combined(0.1, (0.0, 0.1, 2.0)) == Judged(2.0, "forced")
        assert combined(-1.2, (0.0, 0.3)) == Judged(1.2, "forced")

    def test_without_gaps_the_first_divergence_decides(self) -> None:
        assert combined(-0.7, ()) == Judged(0.7, "first")
        assert combined(Judged(3.0, "bound"), ()) == Judged(3.0, "bound")
        assert combined(None, ()) is None

    def test_gaps_replace_a_bound(self) -> None:
        assert combined(Judged(3.0, "bound"), (0.2, 0.1)) == Judged(0.2, "forced")


def scores(margin: float | None, judge: str | None) -> PairScores:
    return PairScores(
        exact_match=False, first_divergence=3, token_edit_similarity=0.9, rouge_l=0.9,
        chrf=90.0, length_ratio=1.0, baseline_loop=False, speculative_loop=False,
        baseline_task_score=None, speculative_task_score=None, task_score_delta=None,
        divergence_margin=margin, divergence_judge=judge,
    )  # fmt: skip


class TestTie:
    def test_ties_are_absolute_and_a_bound_never_ties(self) -> None:
        assert scores(0.3, "first").tie(0.5)
        assert not scores(-0.8, None).tie(0.5)  # a margin stored signed, before
        assert scores(-0.3, None).tie(0.5)
        assert not scores(0.3, "bound").tie(0.5)
        assert not scores(None, None).tie(0.5)
