"""Scoring one pair: how far the speculative arm's output is from the baseline's.

With greedy decoding a correct speculative engine reproduces the baseline exactly, so
most pairs are identical and take a fast path; differing pairs get the full set of
similarity metrics, and both arms are graded against the prompt's check or reference.
Sampled pairs may also be scored by a teacher (the baseline engine): the differences of
the two outputs' mean token NLL and of their excess of argmax tokens under the target
model, both zero on average for a lossless speculative arm.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import structlog

from canaryd.scoring.checks import evaluate_check
from canaryd.scoring.loading import ScoringMetrics, load_metrics
from canaryd.scoring.loops import has_repetition_loop
from canaryd.scoring.margins import Judged, combined, top_logprobs_margin
from canaryd.scoring.text import comparison_units, loop_units
from engine.base import Engine
from engine.types import GenerationResult
from gates.records import PairScores, Prompt

log = structlog.get_logger(__name__)


def first_divergence(baseline: Sequence[Hashable], speculative: Sequence[Hashable]) -> int | None:
    """Index of the first differing unit; the shorter length if one is a prefix; None if equal."""
    for index, (left, right) in enumerate(zip(baseline, speculative, strict=False)):
        if left != right:
            return index
    if len(baseline) == len(speculative):
        return None
    return min(len(baseline), len(speculative))


def task_score(prompt: Prompt, text: str, metrics: ScoringMetrics | None = None) -> float | None:
    """1.0/0.0 from the prompt's check; else ROUGE-L F against its reference; else None."""
    if prompt.check is not None:
        return 1.0 if evaluate_check(prompt.check, text) else 0.0
    if prompt.reference is not None:
        return (metrics or load_metrics()).rouge_l(text, prompt.reference)
    return None


@dataclass(frozen=True, slots=True)
class TeacherDeltas:
    """What the teacher says of a sampled pair (gates.records.PairScores' fields)."""

    nll_delta: float | None = None
    argmax_delta: float | None = None
    baseline_max_nll: float | None = None
    speculative_max_nll: float | None = None


def teacher_deltas(
    teacher: Engine, prompt: Prompt, baseline: GenerationResult, speculative: GenerationResult
) -> TeacherDeltas:
    """Mean token NLL and argmax excess (engine.types.TeacherScore) under `teacher`,
    speculative minus baseline, and each output's largest token NLL; all None when it
    cannot score either output (no output, a teacher without scores) or fails."""
    if not (baseline.token_ids or baseline.text) or not (speculative.token_ids or speculative.text):
        return TeacherDeltas()
    if baseline.token_ids == speculative.token_ids and baseline.text == speculative.text:
        return TeacherDeltas(0.0, 0.0)  # one output, one score: no forward pass needed
    try:
        base = teacher.score(prompt.messages, baseline)
        spec = teacher.score(prompt.messages, speculative)
    except Exception:  # a scoring bug must not lose the pair
        log.exception("pair.teacher_score_failed")
        return TeacherDeltas()
    if base is None or spec is None:
        return TeacherDeltas()
    return TeacherDeltas(
        spec.mean_nll - base.mean_nll,
        spec.argmax_excess - base.argmax_excess,
        base.max_nll,
        spec.max_nll,
    )


def _prefix_result(token_ids: tuple[int, ...]) -> GenerationResult:
    return GenerationResult(
        text="", token_ids=token_ids, finish_reason="length", prompt_tokens=0,
        output_tokens=len(token_ids), ttft_s=None, tpot_s=None, e2e_s=0.0,
    )  # fmt: skip


def divergence_margin(
    teacher: Engine, prompt: Prompt, baseline: GenerationResult, speculative: GenerationResult
) -> Judged | None:
    """Two greedy outputs that differ, judged by the baseline (canaryd.scoring.margins):
    the first divergent token's margin — from the baseline's own top log-probs when its
    result carries them, else the teacher's log-probability of the baseline's token minus
    that of the speculative arm's given the shared prefix (the difference of the total
    NLLs of prefix + each token, whose prefix terms are the same) — and, where the
    teacher can score the speculative output token by token, every token's distance from
    its argmax. None when the outputs agree or nothing could judge them, and, judged
    without top log-probs, when one output is a prefix of the other."""
    try:
        first: float | Judged | None
        if baseline.token_logprobs:
            first = top_logprobs_margin(baseline, speculative)
        else:
            first = _two_pass_margin(teacher, prompt, baseline, speculative)
        forced = teacher.score(prompt.messages, speculative)
    except Exception:  # a scoring bug must not lose the pair
        log.exception("pair.tie_score_failed")
        return None
    if first is None and forced is None:
        return None
    return combined(first, forced.gaps if forced is not None else ())


def _two_pass_margin(
    teacher: Engine, prompt: Prompt, baseline: GenerationResult, speculative: GenerationResult
) -> float | None:
    base_ids = baseline.token_ids or tuple(teacher.count_tokens(baseline.text))
    spec_ids = speculative.token_ids or tuple(teacher.count_tokens(speculative.text))
    position = first_divergence(base_ids, spec_ids)
    if position is None or position >= min(len(base_ids), len(spec_ids)):
        return None
    prefix = tuple(base_ids[:position])
    base = teacher.score(prompt.messages, _prefix_result((*prefix, base_ids[position])))
    spec = teacher.score(prompt.messages, _prefix_result((*prefix, spec_ids[position])))
    if base is None or spec is None:
        return None
    return spec.mean_nll * spec.tokens - base.mean_nll * base.tokens


def score_pair(
    prompt: Prompt,
    baseline: GenerationResult,
    speculative: GenerationResult,
    teacher: Engine | None = None,
    tie_judge: Engine | None = None,
) -> PairScores | None:
    """The consistency and quality scores of one pair; None when either arm failed.

    Identical outputs score 1.0 ROUGE-L, 100 chrF and 1.0 edit similarity without
    running the metrics (rouge-score would give two empty texts 0). `teacher`, given for
    sampled pairs, scores both outputs (`nll_delta`, `argmax_delta`); `tie_judge`, given
    for greedy pairs, judges the divergent tokens of outputs that differ
    (`divergence_margin` and `divergence_judge`: a numeric tie or a real divergence).
    """
    if not (baseline.ok and speculative.ok):
        return None
    metrics = load_metrics()
    baseline_units, speculative_units = comparison_units(baseline, speculative)
    divergence = first_divergence(baseline_units, speculative_units)
    exact_match = divergence is None and baseline.text == speculative.text

    baseline_task = task_score(prompt, baseline.text, metrics)
    if exact_match:
        rouge_l, chrf, edit_similarity = 1.0, 100.0, 1.0
        speculative_task = baseline_task
    else:
        rouge_l = metrics.rouge_l(speculative.text, baseline.text)
        chrf = metrics.chrf(speculative.text, baseline.text)
        edit_similarity = metrics.token_edit_similarity(speculative_units, baseline_units)
        speculative_task = task_score(prompt, speculative.text, metrics)

    baseline_loop = has_repetition_loop(loop_units(baseline))
    judged_divergence = (
        None
        if exact_match or tie_judge is None
        else divergence_margin(tie_judge, prompt, baseline, speculative)
    )
    judged = (
        TeacherDeltas()
        if teacher is None
        else teacher_deltas(teacher, prompt, baseline, speculative)
    )
    return PairScores(
        exact_match=exact_match,
        first_divergence=divergence,
        token_edit_similarity=edit_similarity,
        rouge_l=rouge_l,
        chrf=chrf,
        length_ratio=(
            speculative.output_tokens / baseline.output_tokens if baseline.output_tokens else None
        ),
        baseline_loop=baseline_loop,
        speculative_loop=baseline_loop
        if exact_match
        else has_repetition_loop(loop_units(speculative)),
        baseline_task_score=baseline_task,
        speculative_task_score=speculative_task,
        task_score_delta=(
            speculative_task - baseline_task
            if baseline_task is not None and speculative_task is not None
            else None
        ),
        nll_delta=judged.nll_delta,
        argmax_delta=judged.argmax_delta,
        baseline_max_nll=judged.baseline_max_nll,
        speculative_max_nll=judged.speculative_max_nll,
        divergence_margin=None if judged_divergence is None else judged_divergence.margin,
        divergence_judge=None if judged_divergence is None else judged_divergence.judge,
    )
