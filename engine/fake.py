"""A fake engine for soak tests and fault injection — a product feature, not a mock.

It answers instantly (or in real time, `realtime = true`) with deterministic text and
synthetic but internally consistent figures: a speculative fake drafts k tokens per
verify step and accepts each with a configurable probability (per category, so drift
can be injected into one category), and its timings follow from the steps it took.
Faults — errors, timeouts, corrupted outputs, slow tails, a slowdown of everything or of
one category — and the noise (per-request log-normal duration, per-request acceptance
rate) are drawn from streams seeded by the engine seed, its arm (baseline or speculative)
and the number of the call, so a run is reproducible and the two arms of a pair draw
independently.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
import zlib

from engine.config import FakeEngineConfig
from engine.timing import ArrivalClock
from engine.types import (
    AcceptanceSource,
    ErrorKind,
    GenerationRequest,
    GenerationResult,
    Message,
    SpeculativeStats,
    TeacherScore,
)

_WORDS = (
    "the", "canary", "sings", "while", "the", "model", "drafts", "and", "verifies",
    "tokens", "in", "steady", "measured", "steps", "so", "every", "answer", "stays",
)  # fmt: skip


def _token_id(word: str) -> int:
    return zlib.crc32(word.encode()) % 50_000


CORRUPTED = "CORRUPTED"  # the word the `corrupt_rate` fault puts in an output
_CORRUPTED_ID = _token_id(CORRUPTED)


def _teacher_nll(token_id: int) -> float:
    """The fake teacher's NLL of a token: a fixed pseudo-random value in [1, 4) nats; the
    corruption fault's word is far less likely (12 nats), as garbage is under a real model,
    so a corrupted token is never judged a numeric tie."""
    if token_id == _CORRUPTED_ID:
        return 12.0
    return 1.0 + 3.0 * ((token_id * 2_654_435_761) % 1000) / 1000


def _likeliest(messages: tuple[Message, ...]) -> str:
    """The fake teacher's argmax: the likeliest word an answer to `messages` can hold."""
    words = " ".join(m.content for m in messages).split()
    return min([*words, *_WORDS], key=lambda w: _teacher_nll(_token_id(w)))


class FakeEngine:
    def __init__(self, config: FakeEngineConfig) -> None:
        self.config = config
        self._calls = itertools.count()
        self._calls_lock = threading.Lock()

    @property
    def speculative(self) -> bool:
        return self.config.speculative

    @property
    def identity(self) -> dict[str, str]:
        return {
            "kind": "fake",
            "mode": "speculative" if self.speculative else "baseline",
            "seed": str(self.config.seed),
        }

    def load(self) -> None:
        pass

    def close(self) -> None:
        pass

    def count_tokens(self, text: str) -> list[int]:
        return [_token_id(word) for word in text.split()]

    def score(self, messages: tuple[Message, ...], output: GenerationResult) -> TeacherScore | None:
        """A synthetic teacher: a fixed NLL per token, and one argmax word per prompt (the
        likeliest of the words an answer to it can hold); None for no tokens."""
        token_ids = output.token_ids or tuple(self.count_tokens(output.text))
        if not token_ids:
            return None
        argmax = _token_id(_likeliest(messages))
        return TeacherScore(
            tokens=len(token_ids),
            mean_nll=sum(_teacher_nll(t) for t in token_ids) / len(token_ids),
            argmax_share=sum(1 for t in token_ids if t == argmax) / len(token_ids),
            mean_top_probability=math.exp(-_teacher_nll(argmax)),
            max_nll=max(_teacher_nll(t) for t in token_ids),
        )

    def _greedy_biased(
        self, messages: tuple[Message, ...], words: list[str], rng: random.Random
    ) -> list[str]:
        """The `greedy_bias` fault: words swapped for the teacher's likeliest one."""
        likeliest = _likeliest(messages)
        return [likeliest if rng.random() < self.config.greedy_bias else w for w in words]

    def _rng(self, call: int, salt: str) -> random.Random:
        mode = "speculative" if self.speculative else "baseline"
        key = f"{self.config.seed}:{mode}:{call}:{salt}".encode()
        return random.Random(zlib.crc32(key))  # noqa: S311  (simulation, not security)

    def _answer(self, request: GenerationRequest) -> list[str]:
        """The same words for the same prompt on every arm: a healthy pair matches. A
        sampled request is a draw seeded by its seed: the same prompt and seed give the
        same words on every arm, another seed another draw of the same length from the
        same words (a lossless pair with a seed per arm: two independent draws)."""
        prompt = " ".join(m.content for m in request.messages)
        words = prompt.split() or ["empty"]
        rng = random.Random(zlib.crc32(prompt.encode()))  # noqa: S311
        n = min(request.sampling.max_tokens, 8 + rng.randrange(max(1, request.sampling.max_tokens)))
        if not request.sampling.greedy:
            key = f"{prompt}\x00{request.sampling.seed}".encode()
            rng = random.Random(zlib.crc32(key))  # noqa: S311
        return [rng.choice(words + list(_WORDS)) for _ in range(n)]

    def _jittered(self, rng: random.Random, value: float) -> float:
        return value * rng.lognormvariate(0.0, self.config.jitter) if self.config.jitter else value

    def generate(self, request: GenerationRequest) -> GenerationResult:
        cfg = self.config
        if not request.messages or not any(m.content.strip() for m in request.messages):
            return GenerationResult.failed(ErrorKind.INVALID, "empty prompt", 0.0)
        with self._calls_lock:
            call = next(self._calls)
        fault = self._rng(call, "fault")
        words = self._answer(request)
        if cfg.speculative and cfg.greedy_bias and not request.sampling.greedy:
            words = self._greedy_biased(request.messages, words, self._rng(call, "greedy"))
        prompt_tokens = sum(len(m.content.split()) for m in request.messages)
        timing = self._rng(call, "timing")
        scale = cfg.latency_factor * cfg.latency_factor_by_category.get(request.category, 1.0)
        scale *= cfg.tail_factor if fault.random() < cfg.tail_rate else 1.0
        if cfg.latency_sigma:
            scale *= timing.lognormvariate(0.0, cfg.latency_sigma)
        ttft = self._jittered(timing, cfg.ttft_s) * scale
        stats: SpeculativeStats | None = None
        if cfg.speculative:
            stats, emitted = self._draft_and_verify(request, len(words), self._rng(call, "accept"))
            step_cost = cfg.tpot_s * (1.0 + 0.1 * cfg.num_draft_tokens)
            gaps = [self._jittered(timing, step_cost) for _ in range(stats.verify_steps - 1)]
        else:
            emitted = [1] * len(words)
            gaps = [self._jittered(timing, cfg.tpot_s) for _ in range(len(words) - 1)]
        decode = sum(gaps) * scale
        clock = ArrivalClock(0.0)
        at = ttft
        for gap, tokens in zip([0.0, *gaps], emitted, strict=False):
            at += gap * scale
            clock.delivered(at, tokens)
        e2e = ttft + decode
        roll = fault.random()
        if roll < cfg.error_rate:
            return self._finish(
                GenerationResult.failed(
                    ErrorKind.HTTP, "injected fault: HTTP 503", ttft, prompt_tokens, http_status=503
                )
            )
        if roll < cfg.error_rate + cfg.timeout_rate:
            return self._finish(
                GenerationResult.failed(
                    ErrorKind.TIMEOUT,
                    "injected fault: timeout",
                    request.timeout_s or e2e * 10,
                    prompt_tokens,
                )
            )
        if fault.random() < cfg.corrupt_rate:
            position = fault.randrange(len(words))
            words = [*words[:position], CORRUPTED, *words[position + 1 :]]
        text = " ".join(words)
        return self._finish(
            GenerationResult(
                text=text,
                token_ids=tuple(_token_id(w) for w in words),
                finish_reason="length" if len(words) >= request.sampling.max_tokens else "stop",
                prompt_tokens=prompt_tokens,
                output_tokens=len(words),
                ttft_s=ttft,
                tpot_s=decode / (len(words) - 1) if len(words) > 1 else None,
                e2e_s=e2e,
                speculative=stats,
                acceptance_source=AcceptanceSource.DECODING_LOOP
                if stats
                else AcceptanceSource.NOT_REPORTED,
                itl=clock.summary(),
            )
        )

    def _draft_and_verify(
        self, request: GenerationRequest, output_tokens: int, rng: random.Random
    ) -> tuple[SpeculativeStats, list[int]]:
        """The request's acceptance figures and the tokens each verify step emitted."""
        cfg = self.config
        p = cfg.acceptance_rate_by_category.get(request.category, cfg.acceptance_rate)
        if cfg.acceptance_sd:
            p = min(0.99, max(0.0, rng.gauss(p, cfg.acceptance_sd)))
        k = cfg.num_draft_tokens
        accepted_per_position = [0] * k
        drafted_per_position = [0] * k
        steps = accepted = drafted = produced = 0
        emitted: list[int] = []
        while produced < output_tokens:
            steps += 1
            budget = output_tokens - produced
            draft = min(k, budget - 1) if budget > 1 else 0
            kept = 0
            while kept < draft and rng.random() < p:
                kept += 1
            for position in range(kept):
                accepted_per_position[position] += 1
            for position in range(draft):
                drafted_per_position[position] += 1
            drafted += draft
            accepted += kept
            produced += kept + 1
            emitted.append(kept + 1)
        return SpeculativeStats(
            verify_steps=steps,
            draft_tokens=drafted,
            accepted_tokens=accepted,
            accepted_per_position=tuple(accepted_per_position),
            drafted_per_position=tuple(drafted_per_position),
            source=AcceptanceSource.DECODING_LOOP,
        ), emitted

    def _finish(self, result: GenerationResult) -> GenerationResult:
        if self.config.realtime and result.e2e_s > 0:
            time.sleep(result.e2e_s)
        return result
