"""The generation contract every engine speaks: requests in, results out.

A `GenerationResult` is what one arm produced for one prompt, with timings measured
around the real decoding loop and, for speculative arms, acceptance figures read from
that loop. A figure an engine cannot report is `None` ("not reported"), never zero.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Literal

Role = Literal["system", "user", "assistant"]


class ErrorKind(enum.StrEnum):
    """Why a generation did not produce a usable result (`NONE` when it did)."""

    NONE = "none"
    TIMEOUT = "timeout"
    HTTP = "http"  # the HTTP status is in `GenerationResult.http_status`
    CONNECTION = "connection"
    OOM = "oom"
    INVALID = "invalid"  # malformed response, or input the engine rejected
    INVALID_OUTPUT = "invalid_output"  # a well-formed answer that cannot be true (validation)
    INTERNAL = "internal"  # an unexpected exception inside the engine


class AcceptanceSource(enum.StrEnum):
    """Where a speculative arm's acceptance figures came from."""

    NOT_REPORTED = "not_reported"
    DECODING_LOOP = "decoding_loop"  # counted inside our own decoding loop, exact per request
    PER_REQUEST = "per_request"  # reported by a server for this request, exact
    WINDOW_AGGREGATE = (
        "window_aggregate"  # server counters over a window; may include other traffic
    )


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Identical on both arms of a pair (the seed too, unless `prompts.seed_per_arm`).
    temperature 0 means greedy."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    # Strings that end the output (OpenAI `stop`), sent to OpenAI-compatible servers; the
    # in-process engines ignore them, on both arms alike.
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    messages: tuple[Message, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""
    timeout_s: float | None = None
    category: str = ""  # the prompt's category: for logs, and the fault-injecting fake engine


def acceptance_length_of(verify_steps: int | None, accepted_tokens: int | None) -> float | None:
    """Tokens per verify step, 1 + accepted / steps (vLLM's mean acceptance length: the
    bonus token counted); None without verify steps or accepted tokens."""
    if not verify_steps or accepted_tokens is None:
        return None
    return 1.0 + accepted_tokens / verify_steps


@dataclass(frozen=True, slots=True)
class SpeculativeStats:
    """Acceptance figures of one speculative request, read from the decoding loop.

    `verify_steps` target forward passes each verified a draft of some length;
    `accepted_tokens` of the `draft_tokens` proposed were kept. Every step also emits
    one token from the target itself (the bonus token), so the acceptance length
    ``1 + accepted_tokens / verify_steps`` lies in 1 … k+1. Only an engine that drafts
    on every step has ``output_tokens == accepted_tokens + verify_steps``: servers that
    skip drafting when nothing matches (vLLM's n-gram proposer) count only the steps
    that drafted, so the output length says nothing about the steps.
    `accepted_per_position[i]` counts steps whose draft token at position i+1 was
    accepted; it sums to `accepted_tokens`.
    `draft_tokens` is None when the engine reports accepted tokens and verify steps but
    not how many it drafted (then `acceptance_rate` is None too); per-position figures
    the engine does not report are empty tuples, never zeros.
    """

    verify_steps: int
    draft_tokens: int | None
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]
    drafted_per_position: tuple[int, ...] = ()
    source: AcceptanceSource = AcceptanceSource.DECODING_LOOP

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens; None when drafted tokens are not reported (or zero)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def fallback_rate(self) -> float | None:
        """The share of verify steps that kept none of their draft,
        ``1 − (steps with ≥ 1 accepted) / steps``: the steps that fell back to one token
        from the target. A step the engine ran without a draft (it reports a draft of no
        tokens: a prefill, an n-gram miss) counts as a fallback. Steps with ≥ 1 accepted
        are `accepted_per_position[0]`, since a draft is kept as a prefix; None when the
        engine reports no per-position counts (or no steps)."""
        if not self.accepted_per_position or self.verify_steps <= 0:
            return None
        return 1.0 - self.accepted_per_position[0] / self.verify_steps


@dataclass(frozen=True, slots=True)
class DraftCost:
    """Where a speculative request's decoding time went, as its own loop measured it.

    `draft_s` is time spent proposing drafts; `verify_s` the target's forward passes
    (prefill included), acceptance and cache upkeep. `tree_tokens` counts the drafts
    the target verified over every branch of every tree: the verify width, which can
    exceed `SpeculativeStats.draft_tokens` (one candidate per depth and step)."""

    draft_s: float
    verify_s: float
    tree_tokens: int

    @property
    def draft_share(self) -> float | None:
        """Drafting's share of the decoding loop's time."""
        total = self.draft_s + self.verify_s
        return self.draft_s / total if total > 0 else None


@dataclass(frozen=True, slots=True)
class InterTokenLatency:
    """The gaps between a generation's output tokens as its reader received them: one gap
    per output token after the first. A delivery (a streamed chunk, a verify step's
    emitted tokens) of n tokens after a gap g gives its first token the gap g and the
    other n − 1 a gap of zero, since they arrived together: speculation's bursts show as
    a low median and a high P99. Stored as this summary (`tokens` gaps over `chunks`
    deliveries after the first token); `arrivals` keeps every delivery as
    (seconds since the request started, tokens) while the result is in memory, for
    pooled distributions and the Prometheus histogram, and is never stored."""

    tokens: int
    chunks: int
    p50_s: float
    p95_s: float
    p99_s: float
    max_s: float
    arrivals: tuple[tuple[float, int], ...] = field(default=(), compare=False, repr=False)

    def token_gaps(self) -> list[float]:
        """Every gap, per token (zeros inside a delivery); empty once stored and read back."""
        gaps: list[float] = []
        for (before, _), (at, tokens) in zip(self.arrivals, self.arrivals[1:], strict=False):
            gaps.append(at - before)
            gaps.extend([0.0] * (tokens - 1))
        if self.arrivals and self.arrivals[0][1] > 1:
            gaps[:0] = [0.0] * (self.arrivals[0][1] - 1)
        return gaps

    def chunk_gaps(self) -> list[float]:
        """One gap per delivery after the first (`vllm bench serve`'s ITL)."""
        times = [at for at, _ in self.arrivals]
        return [after - before for before, after in itertools.pairwise(times)]


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One output token as a server chose it: its text, its log-prob and the server's top
    candidates at its position (`top_logprobs`: text and log-prob, as the server listed
    them). What a remote baseline tells of its own greedy choices."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """One arm's answer to one request. Timings are seconds on a monotonic clock."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop", "length", "error"
    prompt_tokens: int
    output_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float
    error: ErrorKind = ErrorKind.NONE
    error_detail: str = ""
    http_status: int | None = None
    speculative: SpeculativeStats | None = None  # None: baseline arm, or not reported
    acceptance_source: AcceptanceSource = AcceptanceSource.NOT_REPORTED
    draft_cost: DraftCost | None = None  # engines that time their own drafting
    # The server's log-probs along the output (baseline greedy requests to servers that
    # return them, engine.logprobs); empty where none were asked for or returned.
    token_logprobs: tuple[TokenLogprobs, ...] = ()
    itl: InterTokenLatency | None = None  # None: fewer than two output tokens, or not timed

    @property
    def ok(self) -> bool:
        return self.error is ErrorKind.NONE

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per verify step, 1 + accepted / steps (vLLM's mean acceptance length)."""
        if self.speculative is None:
            return None
        return acceptance_length_of(self.speculative.verify_steps, self.speculative.accepted_tokens)

    @property
    def tokens_per_s(self) -> float | None:
        if not self.ok or self.e2e_s <= 0 or self.output_tokens == 0:
            return None
        return self.output_tokens / self.e2e_s

    @classmethod
    def failed(
        cls,
        error: ErrorKind,
        detail: str,
        e2e_s: float,
        prompt_tokens: int = 0,
        http_status: int | None = None,
    ) -> GenerationResult:
        return cls(
            text="",
            token_ids=(),
            finish_reason="error",
            prompt_tokens=prompt_tokens,
            output_tokens=0,
            ttft_s=None,
            tpot_s=None,
            e2e_s=e2e_s,
            error=error,
            error_detail=detail,
            http_status=http_status,
        )


@dataclass(frozen=True, slots=True)
class TeacherScore:
    """How the target model judges one produced output given the prompt, token by token
    at temperature 1: the teacher's view of one arm of a sampled pair.

    `argmax_share` is the share of the output's tokens that were the model's most likely
    next token, `mean_top_probability` the mean probability of that most likely token at
    the same positions. Their difference, `argmax_excess`, is how much more often the
    output took the top token than the model's own confidence along its path predicts:
    sampling that leans greedy (argmax verification of drafts) raises it, and the
    path's peakedness, the larger part of the share's noise, cancels out."""

    tokens: int
    mean_nll: float  # nats per token
    argmax_share: float
    mean_top_probability: float
    # The largest NLL of a single output token (nats): a token the model would all but
    # never sample (a random token scores 10 nats and more) says the output was not drawn
    # from it. None where the scorer cannot say.
    max_nll: float | None = None
    # Per output token, the log-prob of the model's most likely token there minus that of
    # the token the output took (≥ 0; 0 at an argmax token): how far each token of a
    # teacher-forced output is from the teacher's own greedy choice. Empty where the
    # scorer cannot say.
    gaps: tuple[float, ...] = ()

    @property
    def argmax_excess(self) -> float:
        return self.argmax_share - self.mean_top_probability
