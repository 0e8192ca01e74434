"""Judging greedy divergences (canaryd.scoring.margins): the baseline's own top log-probs
at the first divergence (`first`, or a lower bound `bound` when the speculative token is
unlisted), where one output ends inside the other too; teacher-forced gaps over every
token (`forced`), absolute margins; and how the quality gate reads them: a bound never
proves a tie, a negative margin is no tie."""

from __future__ import annotations

from dataclasses import replace

import pytest

from canaryd.scoring import score_pair
from canaryd.scoring.margins import NOTHING_LISTED, Judged, combined, top_logprobs_margin
from engine.config import OpenAIEngineConfig
from engine.http import OpenAIEngine
from engine.types import GenerationResult, Message, TokenLogprobs
from gates.records import PairScores, Prompt


def baseline(*tokens: TokenLogprobs, finish: str = "stop") -> GenerationResult:
    text = "".join(t.token for t in tokens)
    return GenerationResult(
        text=text, token_ids=(), finish_reason=finish, prompt_tokens=0,
        output_tokens=len(tokens), ttft_s=None, tpot_s=None, e2e_s=0.1,
        token_logprobs=tokens,
    )  # fmt: skip


def speculative(text: str, finish: str = "length") -> GenerationResult:
    return GenerationResult(
        text=text, token_ids=(), finish_reason=finish, prompt_tokens=0,
        output_tokens=len(text.split()), ttft_s=None, tpot_s=None, e2e_s=0.1,
    )  # fmt: skip


def token(text: str, logprob: float, *top: tuple[str, float]) -> TokenLogprobs:
    return TokenLogprobs(text, logprob, top or ((text, logprob),))


RED = token("Red", -0.1)
THE = token(" the", -0.6, (" the", -0.6), (" a", -0.9), (" then", -1.0), (" an", -3.0))
SKY = token(" sky", -0.2)
BASE = baseline(RED, THE, SKY)

# llama-cpp-python 0.3.36 on SmolLM2-135M-Instruct Q4_1, greedy, top_logprobs 5: the
# baseline of the pair extraction-001 as OpenAIEngine read its streamed chat chunks.
RECORDED = (
    (
        "1",
        -1.819,
        (("1", -1.819), ("Inv", -1.963), ("The", -2.339), ("Number", -2.698), ("2", -3.408)),
    ),
    ("2", -0.295, (("2", -0.295), ("\n", -2.765), ("3", -3.392), ("4", -3.775), ("1", -3.953))),
    (
        " March",
        -0.594,
        ((" March", -0.594), ("3", -1.644), ("/", -2.337), (" Mar", -3.904), (".", -3.990)),
    ),
    (" ", -0.009, ((" ", -0.009), (",", -4.971), ("-", -7.243), (" -", -7.845), ("  ", -8.507))),
    ("2", -0.0, (("2", -0.0), ("1", -8.795), ("3", -10.844), ("8", -11.037), ("0", -11.287))),
    ("0", -0.0, (("0", -0.0), ("2", -9.268), (",", -11.113), ("3", -11.144), ("1", -12.256))),
    ("2", -0.0, (("2", -0.0), ("1", -9.434), (",", -9.734), ("0", -9.779), ("3", -11.032))),
    ("4", -0.006, (("4", -0.006), ("5", -5.879), ("3", -6.550), ("6", -7.388), ("2", -8.264))),
    (",", -0.896, ((",", -0.896), (";", -2.335), (":", -2.600), ("\n", -2.662), (" -", -2.688))),
    (
        " ",
        -0.563,
        ((" ", -0.563), (" to", -3.169), (" H", -3.538), (" Harbour", -3.620), (" Issue", -3.630)),
    ),
    ("3", -1.862, (("1", -0.614), ("3", -1.862), ("4", -2.006), ("2", -2.523), ("0", -3.234))),
    (
        "8",
        -0.708,
        (("8", -0.708), ("0", -1.808), (":", -3.067), (" August", -3.258), ("1", -3.573)),
    ),
    (
        "7",
        -0.547,
        (("7", -0.547), (" days", -2.699), ("8", -2.961), (" July", -3.212), ("th", -3.640)),
    ),
    (".", -1.831, ((",", -0.860), (".", -1.831), (" days", -2.755), (":", -3.429), (";", -3.509))),
    ("6", -1.827, (("4", -1.736), ("3", -1.790), ("6", -1.827), ("1", -2.196), ("0", -2.411))),
    ("0", -0.770, (("0", -0.770), ("6", -2.301), ("1", -2.909), ("5", -3.051), ("3", -3.286))),
    (
        " EUR",
        -0.203,
        ((" EUR", -0.203), (",", -3.175), (" (", -3.668), (".", -3.903), (" USD", -3.916)),
    ),
    (
        ",",
        -0.318,
        ((",", -0.318), (" (", -2.701), ("\n", -3.085), (" payable", -3.380), (".", -4.091)),
    ),
    (
        " payable",
        -0.368,
        ((" payable", -0.368), (" ", -1.650), (" paid", -4.653), (" due", -4.721), (" £", -5.382)),
    ),
    (
        " within",
        -0.079,
        ((" within", -0.079), (" in", -4.501), (" by", -4.612), (" to", -4.643), (" with", -4.661)),
    ),
    (
        " ",
        -0.004,
        ((" ", -0.004), (" a", -6.414), (" the", -7.363), (" one", -7.493), (" three", -7.545)),
    ),
    ("3", -0.089, (("3", -0.089), ("1", -3.712), ("6", -3.876), ("2", -4.116), ("4", -4.924))),
    (
        "0",
        -0.008,
        (("0", -0.008), (" days", -5.396), (" months", -6.639), ("6", -7.307), ("1", -7.376)),
    ),
    (
        " days",
        -0.013,
        (
            (" days", -0.013),
            (" DA", -4.709),
            (" minutes", -6.623),
            (" D", -7.278),
            (" hours", -7.792),
        ),
    ),
)
EXTRACTION_BASELINE = baseline(*(token(text, value, *top) for text, value, top in RECORDED))
EXTRACTION = Prompt(
    id="extraction-001",
    category="extraction",
    messages=(Message("user", "Extract the invoice number, the date and the total."),),
    max_tokens=32,
)


def llamacpp_judge() -> OpenAIEngine:
    """The tie judge of a llama.cpp pair: the baseline's HTTP engine (it scores nothing)."""
    return OpenAIEngine(
        OpenAIEngineConfig(base_url="http://127.0.0.1:9", model="m", server_kind="llamacpp")
    )


class TestTopLogprobs:
    def test_a_listed_speculative_token_gives_the_margin(self) -> None:
        judged = top_logprobs_margin(BASE, speculative("Red a sky"))
        assert judged == Judged(pytest.approx(0.3), "first")

    def test_the_longest_listed_token_the_text_continues_with(self) -> None:
        """ " then" and " the" both start " thence": the longer one is the token taken."""
        judged = top_logprobs_margin(BASE, speculative("Red thence"))
        assert judged == Judged(pytest.approx(0.4), "first")

    def test_an_unlisted_token_is_a_lower_bound(self) -> None:
        """ " dog" is not among the four listed: its log-prob is at most the last one's."""
        judged = top_logprobs_margin(BASE, speculative("Red dog"))
        assert judged == Judged(pytest.approx(2.4), "bound")

    def test_a_speculative_token_the_baseline_prefers_is_judged_by_its_size(self) -> None:
        """The chosen token need not be the listed best (a server's penalties): the margin
        is absolute."""
        chosen = token(" a", -2.0, (" the", -0.5), (" a", -2.0))
        judged = top_logprobs_margin(baseline(RED, chosen), speculative("Red the"))
        assert judged == Judged(1.5, "first")

    def test_no_judgement_for_an_agreement_or_misaligned_log_probs(self) -> None:
        assert top_logprobs_margin(BASE, speculative("Red the sky")) is None
        misaligned = replace(BASE, text="Blue the sky")
        assert top_logprobs_margin(misaligned, speculative("Red a sky")) is None
        assert top_logprobs_margin(replace(BASE, token_logprobs=()), speculative("Red")) is None
        short = replace(BASE, text="Red the sky.")  # the log-probs stop short of the text
        assert top_logprobs_margin(short, speculative("Red the sky. And more")) is None


class TestOneOutputEndsInsideTheOther:
    """Where one output is a prefix of the other the arms chose differently at its end:
    judged there, never left unjudged."""

    def test_a_speculative_end_is_judged_by_the_listed_end_candidate(self) -> None:
        """llama.cpp lists the end token as a candidate that spells nothing."""
        the = token(" the", -0.6, (" the", -0.6), ("", -0.8), (" a", -0.9))
        judged = top_logprobs_margin(baseline(RED, the, SKY), speculative("Red", "stop"))
        assert judged == Judged(pytest.approx(0.2), "first")

    def test_a_speculative_end_not_listed_is_a_lower_bound(self) -> None:
        judged = top_logprobs_margin(BASE, speculative("Red", "stop"))
        assert judged == Judged(pytest.approx(2.4), "bound")

    def test_a_baseline_end_listed_by_the_server_is_judged_there(self) -> None:
        """A last entry past the baseline's text is its end token, however it is spelled."""
        end = token("<|im_end|>", -0.3, ("<|im_end|>", -0.3), ("\n", -0.7))
        judged = top_logprobs_margin(baseline(RED, THE, SKY, end), speculative("Red the sky\nAnd"))
        assert judged == Judged(pytest.approx(0.4), "first")

    def test_a_baseline_end_the_server_did_not_list_is_a_bound_at_zero(self) -> None:
        """llama-cpp-python streams no entry for the end token: the baseline took the end
        where the speculative arm went on, by a margin nothing bounds above 0."""
        judged = top_logprobs_margin(BASE, speculative("Red the sky and more"))
        assert judged == NOTHING_LISTED == Judged(0.0, "bound")

    def test_an_output_out_of_tokens_on_the_shared_text_is_a_bound_at_zero(self) -> None:
        """Both ran to max_tokens, one spelling more: their tokens parted somewhere."""
        cut = baseline(RED, THE, SKY, finish="length")
        assert top_logprobs_margin(cut, speculative("Red the sky and more")) == NOTHING_LISTED
        assert top_logprobs_margin(BASE, speculative("Red the", "length")) == NOTHING_LISTED

    def test_the_recorded_llamacpp_pair_is_judged(self) -> None:
        """The real case: llama-cpp-python's baseline ended after 24 tokens ("stop"; no
        entry for its end token) where the prompt-lookup arm went on to max_tokens; it
        came back unjudged (divergence_margin None) and now counts as a bound."""
        base = EXTRACTION_BASELINE  # finish_reason "stop"
        spec = speculative(base.text + "\nInvoice INV-20", "length")
        scores = score_pair(EXTRACTION, base, spec, tie_judge=llamacpp_judge())
        assert scores is not None and not scores.exact_match
        assert scores.first_divergence == 49 == len(base.text)
        assert (scores.divergence_margin, scores.divergence_judge) == (0.0, "bound")
        assert not scores.tie(0.5)


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
