"""score_pair: consistency scores, loops, task scores and failed arms."""

from __future__ import annotations

import pytest

from canaryd.scoring import first_divergence, load_metrics, score_pair, task_score
from canaryd.scoring.pair import TeacherDeltas, teacher_deltas
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from engine.types import ErrorKind, GenerationResult, Message, TeacherScore
from gates.records import Check, Prompt


def result(
    text: str, token_ids: tuple[int, ...] | list[int], output_tokens: int | None = None
) -> GenerationResult:
    """A successful generation with the given text and token ids."""
    return GenerationResult(
        text=text,
        token_ids=tuple(token_ids),
        finish_reason="stop",
        prompt_tokens=12,
        output_tokens=len(token_ids) if output_tokens is None else output_tokens,
        ttft_s=0.05,
        tpot_s=0.02,
        e2e_s=1.0,
    )


def prompt(reference: str | None = None, check: Check | None = None) -> Prompt:
    return Prompt(
        id="p1",
        category="qa",
        messages=(Message("user", "question"),),
        max_tokens=128,
        reference=reference,
        check=check,
    )


FAILED = GenerationResult.failed(ErrorKind.TIMEOUT, "deadline", e2e_s=30.0)


class TestFirstDivergence:
    @pytest.mark.parametrize(
        ("baseline", "speculative", "expected"),
        [
            ([1, 2, 3], [1, 2, 3], None),
            ([1, 2, 3], [1, 9, 3], 1),
            ([1, 2, 3], [9, 2, 3], 0),
            ([1, 2, 3], [1, 2], 2),
            ([1, 2], [1, 2, 3, 4], 2),
            ([], [], None),
            ([], [5], 0),
        ],
    )
    def test_cases(self, baseline: list[int], speculative: list[int], expected: int | None) -> None:
        """The first differing index; the shorter length for a prefix; None when equal."""
        assert first_divergence(baseline, speculative) == expected


class TestScorePair:
    def test_failed_arm_gives_none(self) -> None:
        """A pair with a failed arm on either side has no scores."""
        ok = result("a", [1])
        assert score_pair(prompt(), FAILED, ok) is None
        assert score_pair(prompt(), ok, FAILED) is None

    def test_identical_outputs(self) -> None:
        """Identical outputs match exactly and score perfectly."""
        scores = score_pair(
            prompt(), result("The cat sat.", [5, 6, 7]), result("The cat sat.", [5, 6, 7])
        )
        assert scores is not None
        assert scores.exact_match
        assert scores.first_divergence is None
        assert (scores.token_edit_similarity, scores.rouge_l, scores.chrf) == (1.0, 1.0, 100.0)
        assert scores.length_ratio == 1.0

    def test_two_empty_outputs(self) -> None:
        """Two empty outputs are an exact match with edit similarity 1 and no length ratio."""
        scores = score_pair(prompt(), result("", []), result("", []))
        assert scores is not None
        assert scores.exact_match and scores.token_edit_similarity == 1.0
        assert scores.length_ratio is None

    def test_different_outputs(self) -> None:
        """A one-token deletion: divergence at 2, similarity 0.75, ROUGE-L F 6/7, ratio 0.75."""
        scores = score_pair(
            prompt(), result("the cat sat down", [1, 2, 3, 4]), result("the cat down", [1, 2, 4])
        )
        assert scores is not None
        assert not scores.exact_match
        assert scores.first_divergence == 2
        assert scores.token_edit_similarity == pytest.approx(0.75)
        assert scores.rouge_l == pytest.approx(6 / 7)  # LCS 3; P 3/3, R 3/4
        assert 0.0 < scores.chrf < 100.0
        assert scores.length_ratio == pytest.approx(0.75)

    def test_same_ids_different_text_is_not_exact(self) -> None:
        """Equal token ids with different texts (detokenisation differs) are not an exact match."""
        scores = score_pair(prompt(), result("Hello", [1, 2]), result("Hello ", [1, 2]))
        assert scores is not None
        assert not scores.exact_match
        assert scores.first_divergence is None

    def test_length_ratio_uses_reported_counts(self) -> None:
        """The ratio is speculative over baseline output tokens as the engines report them."""
        scores = score_pair(prompt(), result("a b", [1, 2], 4), result("a b c", [1, 2, 3], 6))
        assert scores is not None
        assert scores.length_ratio == pytest.approx(1.5)

    def test_text_only_engines_compare_characters(self) -> None:
        """Without token ids the arms are compared character by character, not as equal."""
        scores = score_pair(prompt(), result("abc", [], 1), result("abd", [], 1))
        assert scores is not None
        assert not scores.exact_match
        assert scores.first_divergence == 2
        assert scores.token_edit_similarity == pytest.approx(2 / 3)

    def test_loops_per_arm(self) -> None:
        """A looping speculative arm is flagged while the clean baseline is not."""
        clean = list(range(100, 140))
        looping = [*range(100, 110), *[7, 8, 9] * 10]
        scores = score_pair(prompt(), result("clean", clean), result("loop", looping))
        assert scores is not None
        assert (scores.baseline_loop, scores.speculative_loop) == (False, True)

    def test_no_task_score_without_check_or_reference(self) -> None:
        """A prompt with neither check nor reference has no task scores."""
        scores = score_pair(prompt(), result("a", [1]), result("b", [2]))
        assert scores is not None
        assert scores.baseline_task_score is None
        assert scores.speculative_task_score is None
        assert scores.task_score_delta is None

    def test_task_scores_from_check(self) -> None:
        """The check grades each arm 1/0 and the delta is speculative minus baseline."""
        scores = score_pair(
            prompt(check=Check("numeric", 42)), result("It is 42.", [1]), result("It is 41.", [2])
        )
        assert scores is not None
        assert (scores.baseline_task_score, scores.speculative_task_score) == (1.0, 0.0)
        assert scores.task_score_delta == -1.0

    def test_task_scores_from_reference(self) -> None:
        """Without a check, ROUGE-L F against the reference grades each arm."""
        scores = score_pair(
            prompt(reference="the cat sat on the mat"),
            result("the cat sat on the mat", [1]),
            result("the cat sat", [2]),
        )
        assert scores is not None
        assert scores.baseline_task_score == pytest.approx(1.0)
        assert scores.speculative_task_score == pytest.approx(2 / 3)  # P 1, R 1/2
        assert scores.task_score_delta == pytest.approx(-1 / 3)

    def test_check_wins_over_reference(self) -> None:
        """A prompt with both grades by its check."""
        p = prompt(reference="Paris is the capital", check=Check("contains", "paris"))
        assert task_score(p, "paris") == 1.0
        assert task_score(p, "Lyon") == 0.0

    def test_a_long_differing_pair(self) -> None:
        """A differing pair of 128-token, ~100-word outputs diverges at its first differing
        token and scores below an exact match on every similarity (its cost is a speed
        figure, not a unit test: the daemon's overhead benchmark measures it)."""
        load_metrics()
        words = [f"word{i % 37}" for i in range(100)]
        baseline = result(" ".join(words), list(range(128)))
        speculative = result(" ".join(words[:40] + words[:60]), [*range(50), *range(1000, 1078)])
        scores = score_pair(prompt(reference=" ".join(words[:80])), baseline, speculative)
        assert not scores.exact_match
        assert scores.first_divergence == 50
        assert scores.token_edit_similarity < 1.0
        assert scores.rouge_l < 1.0


class TestTeacherScores:
    """nll_delta and argmax_delta: both outputs scored by the baseline model, speculative
    minus baseline."""

    class Teacher(FakeEngine):
        """Scores a reply by the mean of its token ids (NLL) and its share of even ids
        (argmax, against a top-token probability of 1/2 everywhere); no reply: None."""

        def __init__(self, unavailable: bool = False) -> None:
            super().__init__(FakeEngineConfig())
            self.calls = 0
            self.unavailable = unavailable

        def score(
            self, messages: tuple[Message, ...], output: GenerationResult
        ) -> TeacherScore | None:
            self.calls += 1
            ids = output.token_ids or tuple(len(word) for word in output.text.split())
            if self.unavailable or not ids:
                return None
            return TeacherScore(
                tokens=len(ids),
                mean_nll=sum(ids) / len(ids),
                argmax_share=sum(1 for t in ids if t % 2 == 0) / len(ids),
                mean_top_probability=0.5,
                max_nll=float(max(ids)),
            )

    def test_differences_of_mean_nll_and_argmax_excess(self) -> None:
        teacher = self.Teacher()
        deltas = teacher_deltas(teacher, prompt(), result("a b", [2, 4]), result("a c", [2, 7]))
        assert (deltas.nll_delta, deltas.argmax_delta) == pytest.approx((4.5 - 3.0, 0.5 - 1.0))

    def test_largest_token_nll_of_each_output(self) -> None:
        """Each arm's worst token, for the implausible-token check."""
        deltas = teacher_deltas(self.Teacher(), prompt(), result("a b", [2, 4]), result("c", [9]))
        assert (deltas.baseline_max_nll, deltas.speculative_max_nll) == (4.0, 9.0)

    def test_identical_outputs_need_no_scoring(self) -> None:
        teacher = self.Teacher()
        same = result("a b", [2, 4])
        assert teacher_deltas(teacher, prompt(), same, same) == TeacherDeltas(0.0, 0.0)
        assert teacher.calls == 0

    def test_outputs_without_ids_are_scored_by_text(self) -> None:
        """HTTP results carry text only: the teacher gets them, and identical texts
        need no scoring."""
        teacher = self.Teacher()
        deltas = teacher_deltas(teacher, prompt(), result("ab cd", []), result("abc d", []))
        assert (deltas.nll_delta, deltas.argmax_delta) == pytest.approx((0.0, -1.0))
        same = teacher_deltas(teacher, prompt(), result("ab", []), result("ab", []))
        assert same == TeacherDeltas(0.0, 0.0)
        assert teacher.calls == 2

    def test_unscorable_is_none_never_zero(self) -> None:
        teacher = self.Teacher(unavailable=True)
        base, spec = result("a b", [2, 4]), result("a c", [2, 8])
        assert teacher_deltas(teacher, prompt(), base, spec) == TeacherDeltas()
        assert teacher_deltas(self.Teacher(), prompt(), base, result("", [])) == TeacherDeltas()

    def test_without_a_teacher_there_is_no_delta(self) -> None:
        scores = score_pair(prompt(), result("a b", [2, 4]), result("a c", [2, 8]))
        assert scores is not None and scores.nll_delta is None and scores.argmax_delta is None

    def test_the_runner_scores_sampled_pairs_with_the_baseline(self) -> None:
        """Sampled pairs get an nll_delta from the baseline engine; greedy pairs none."""
        from canaryd.pairs.runner import PairParams, PairRunner

        def runner(temperature: float) -> PairRunner:
            return PairRunner(
                FakeEngine(FakeEngineConfig()),
                FakeEngine(FakeEngineConfig(speculative=True, greedy_bias=0.5)),
                run_id="r",
                params=PairParams(temperature=temperature),
            )

        sampled = runner(0.8).run_pair(prompt()).scores
        greedy = runner(0.0).run_pair(prompt()).scores
        assert sampled is not None and sampled.nll_delta is not None
        assert sampled.nll_delta < 0  # the biased arm is likelier under the teacher
        assert sampled.argmax_delta is not None and sampled.argmax_delta > 0
        assert greedy is not None and greedy.nll_delta is None and greedy.argmax_delta is None
