"""The domain records that flow from the pair runner to scoring, the store and gates.

They live in `gates` because gates are the lowest layer that judges them: `canaryd`
imports `gates`, never the other way round.

`Prompt` is one item of a suite; `PairRecord` is one prompt run on the baseline and one
speculative arm with the same sampling parameters, plus its `PairScores`. A run with
several speculative arms sends each prompt to all of them: one `PairRecord` per
speculative arm (named by `arm`), sharing the baseline result and a `group_id`. These
are plain frozen dataclasses so that gates (pure) can consume them without importing SQL
or engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from engine.types import GenerationResult, Message

CheckKind = Literal["exact", "contains", "regex", "json_schema", "numeric"]
# An arm's role within one pair; a speculative arm's configured name is `PairRecord.arm`.
Arm = Literal["baseline", "speculative"]
ARMS: tuple[Arm, Arm] = ("baseline", "speculative")
BASELINE_ARM = "baseline"  # the baseline arm's name; every other arm is speculative
# The name of the speculative arm of a configuration that names only one.
DEFAULT_ARM = "speculative"
# Where a pair's prompt came from: a suite (`control`: a fixed set only an engine change
# can move) or a mirrored production request (`live`: the treatment, canaryd.traffic).
PairSource = Literal["control", "live"]


class TimedArm(Protocol):
    """What a pair's speedup needs of each arm: whether it answered, and how long it took
    end to end (a `GenerationResult`, or the lean figures of a stored one)."""

    @property
    def ok(self) -> bool: ...

    @property
    def e2e_s(self) -> float: ...


def e2e_speedup(baseline: TimedArm, speculative: TimedArm) -> float | None:
    """Baseline end-to-end time over speculative end-to-end time (>1: faster); None
    unless both arms answered and the speculative one took time."""
    if not (baseline.ok and speculative.ok) or speculative.e2e_s <= 0:
        return None
    return baseline.e2e_s / speculative.e2e_s


@dataclass(frozen=True, slots=True)
class Check:
    """How to decide whether an answer is right.

    exact: normalised answer equals `value` (str); contains: `value` (str) appears,
    case-insensitively; regex: `value` (str pattern) matches anywhere; json_schema: the
    first JSON object/array in the answer validates against `value` (dict schema);
    numeric: the last number in the answer is within `tolerance` of `value` (float).
    """

    kind: CheckKind
    value: Any
    tolerance: float = 1e-6


@dataclass(frozen=True, slots=True)
class Prompt:
    id: str
    category: str
    messages: tuple[Message, ...]
    max_tokens: int
    reference: str | None = None
    check: Check | None = None
    suite: str = ""
    source: str = ""  # "file:line" where it was defined, for error messages


@dataclass(frozen=True, slots=True)
class PairScores:
    """Consistency and quality of the speculative arm against the baseline arm."""

    exact_match: bool
    first_divergence: int | None  # index of the first differing output token; None if equal
    token_edit_similarity: float  # 1 - normalised Levenshtein distance over token ids
    rouge_l: float  # F-measure, speculative text vs baseline text, 0..1
    chrf: float  # chrF, speculative vs baseline, 0..100
    length_ratio: float | None  # speculative / baseline output tokens
    baseline_loop: bool  # degenerate repetition detected in the baseline output
    speculative_loop: bool
    baseline_task_score: float | None  # 0..1 against the prompt's check/reference
    speculative_task_score: float | None
    task_score_delta: float | None  # speculative - baseline
    # Mean token NLL of the speculative output minus the baseline's, both scored by the
    # baseline (target) model; sampled pairs only, None where the teacher cannot score.
    nll_delta: float | None = None
    # Excess of the teacher's argmax tokens (their share minus the mean top-token
    # probability, engine.types.TeacherScore), speculative minus baseline (same pairs as
    # `nll_delta`): greedy-leaning sampling makes it positive.
    argmax_delta: float | None = None
    # Greedy pairs that diverge: the largest absolute margin the baseline (target) model
    # puts between the arms' tokens over the divergent tokens it judged (nats; how, in
    # `divergence_judge`, canaryd.scoring.margins). Small: a numeric tie (both tokens
    # nearly equally likely, bf16 kernels may pick either); large: a real divergence.
    # None where the outputs agree or nothing could judge them.
    divergence_margin: float | None = None
    # Sampled pairs the teacher scored: the largest single-token NLL of each arm's output
    # (nats, engine.types.TeacherScore.max_nll). A token the target model would all but
    # never sample is garbage: the quality gate's implausible-token check counts the pairs
    # where only the speculative output has one. None where the outputs are identical (no
    # second forward pass) or the teacher cannot say.
    baseline_max_nll: float | None = None
    speculative_max_nll: float | None = None
    # How `divergence_margin` was judged: "forced" (the speculative output teacher-forced
    # through the baseline, every token), "first" (the first divergent token only, from
    # the baseline's top log-probs), "bound" (the same, the speculative token unlisted:
    # the margin is a lower bound). None: the first divergent token, judged before the
    # judge was recorded, or not judged.
    divergence_judge: str | None = None

    def tie(self, margin_nats: float) -> bool:
        """A greedy divergence the teacher calls a numeric tie: within `margin_nats` (a
        lower bound never proves one)."""
        return (
            not self.exact_match
            and self.divergence_margin is not None
            and self.divergence_judge != "bound"
            and abs(self.divergence_margin) <= margin_nats
        )


@dataclass(frozen=True, slots=True)
class PairRecord:
    pair_id: str
    run_id: str
    prompt: Prompt
    started_at: datetime  # UTC, timezone-aware
    arm_order: tuple[Arm, Arm]
    baseline: GenerationResult
    speculative: GenerationResult
    scores: PairScores | None  # None when either arm failed
    sampling_seed: int = 0
    temperature: float = 0.0
    arm: str = DEFAULT_ARM  # the speculative arm's configured name
    # The records of one prompt sent to several speculative arms share it (and their
    # baseline result); empty: the record is its own group, `group_id` is its `pair_id`.
    group_id: str = ""
    source: PairSource = "control"

    def __post_init__(self) -> None:
        if not self.group_id:
            object.__setattr__(self, "group_id", self.pair_id)

    @property
    def complete(self) -> bool:
        return self.baseline.ok and self.speculative.ok

    @property
    def speedup(self) -> float | None:
        """Baseline end-to-end time over speculative end-to-end time (>1: faster)."""
        return e2e_speedup(self.baseline, self.speculative)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run: one `canaryd once`, one daemon lifetime, one bench, one `canaryd judge` or
    one `canaryd probe`."""

    run_id: str
    kind: Literal["once", "daemon", "bench", "judge", "probe"]
    started_at: datetime
    config: dict[str, Any]
    config_hash: str
    baseline_identity: dict[str, str]
    speculative_identity: dict[str, str]  # of the switch's arm
    software: dict[str, str] = field(default_factory=dict)
    # Every speculative arm's identity by arm name (empty: runs recorded before arms had
    # names, whose one speculative arm is `speculative_identity`).
    arm_identities: dict[str, dict[str, str]] = field(default_factory=dict)
