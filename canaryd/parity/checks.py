"""The capabilities the probe checks, one function each: `(arm, context) -> Outcome`.

Each sends the same request to whichever arm it is given and judges the answer on its
own terms (never against the other arm: a feature is kept when each arm honours it).
A request the server refuses as such (400, 404, 405, 422, 501) leaves the capability
`unsupported` with the server's words; any other failure is `fail` with the reason.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from canaryd.parity.client import Answer, ArmClient
from canaryd.scoring.checks import matches_json_schema
from canaryd.scoring.loops import find_repetition_loop
from canaryd.scoring.text import word_units
from engine.base import Engine
from engine.types import GenerationRequest, GenerationResult, Message, SamplingParams

__all__ = ["CAPABILITIES", "CHECKS", "GREEDY_PROMPT", "Context", "Outcome", "State"]

State = Literal["pass", "fail", "unsupported"]
_UNSUPPORTED_STATUSES = frozenset({400, 404, 405, 422, 501})

GREEDY_PROMPT = "List three facts about the planet Mars, one per line."
GREEDY_TOKENS = 32
SEED_PROMPT = "Write a short poem about the sea."
SEED_TEMPERATURE = 0.9
SEED_REPEATS = 3
SAMPLED_TOKENS = 32
N_PROMPT = "Name three prime numbers and explain why each of them is prime."
N_TEMPERATURE = 0.7
N_CHOICES = 2
JSON_PROMPT = "Give the name and the birth year of one famous scientist, as JSON."
JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "year": {"type": "integer"},
    },
    "required": ["name", "year"],
    "additionalProperties": False,
}
JSON_TOKENS = 48
LONG_TOKENS = 8  # an answer and, on the speculative arm, a verify step or two
# Odd input and the burst judge whether answers come, not what they say: a few tokens do.
ODD_TOKENS = 4
BURST_TOKENS = 8
ODD_INPUTS = {
    "empty": "",
    "whitespace": " \n\t  \n",
    "mixed-script": "Zürich, 東京, مرحبا, Привет, नमस्ते, 🚀 — which languages are these?",
}
BURST = 16
CANCELLED_STREAMS = 5
CANCEL_TOKENS = 512
GAUGE_SETTLE_S = 15.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """One capability on one arm: pass, fail or unsupported, and why."""

    state: State
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"state": self.state, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Context:
    """What every arm's checks share, settled once before the checklist: the stop
    string (a word of the baseline's greedy answer), the context limit and the long and
    over-limit prompts built for it, the baseline model's judgement of an output (the
    largest token NLL, None where the baseline cannot score), the NLL above which a
    token is implausible, whether each arm reported acceptance on a short prompt, the
    probe run's deadline (a `time.monotonic()` instant) and what to call with each
    result the engines generate."""

    stop: str
    context_limit: int | None
    long_prompt: str
    over_prompt: str
    tokens_measured: bool
    max_token_nll: Callable[[str, str], float | None]
    implausible_nll: float
    acceptance_on_short: dict[str, bool]
    engines: dict[str, Engine]
    deadline: float = math.inf
    on_generation: Callable[[GenerationResult], None] = lambda result: None

    def time_left(self) -> float | None:
        """Seconds to the deadline, for a generation's `timeout_s` (None: no deadline)."""
        if math.isinf(self.deadline):
            return None
        return max(self.deadline - time.monotonic(), 0.001)


def _not_answered(answer: Answer) -> Outcome:
    state: State = "unsupported" if answer.status in _UNSUPPORTED_STATUSES else "fail"
    return Outcome(state, answer.describe())


def _differs(a: str, b: str) -> str:
    at = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    return f"differ at character {at}: {a[at : at + 24]!r} vs {b[at : at + 24]!r}"


def streaming_equals_plain(arm: ArmClient, ctx: Context) -> Outcome:
    plain = arm.greedy(GREEDY_PROMPT, GREEDY_TOKENS)
    if not plain.ok:
        return _not_answered(plain)
    streamed = arm.stream(
        arm.body(GREEDY_PROMPT, max_tokens=GREEDY_TOKENS, temperature=0.0, seed=0)
    )
    if not streamed.ok:
        return Outcome("fail", f"streamed: {streamed.describe()}")
    if streamed.text != plain.text:
        return Outcome(
            "fail", f"greedy streamed and plain answers {_differs(streamed.text, plain.text)}"
        )
    return Outcome("pass", f"identical greedy answers ({len(plain.text)} characters)")


def stop(arm: ArmClient, ctx: Context) -> Outcome:
    plain = arm.greedy(GREEDY_PROMPT, GREEDY_TOKENS)
    answer = arm.complete(
        arm.body(GREEDY_PROMPT, max_tokens=GREEDY_TOKENS, temperature=0.0, seed=0, stop=[ctx.stop])
    )
    if not answer.ok:
        return _not_answered(answer)
    if ctx.stop in answer.text:
        return Outcome("fail", f"the answer runs past the stop string {ctx.stop!r}")
    if not plain.ok or ctx.stop not in plain.text:
        return Outcome("pass", f"stop string {ctx.stop!r} absent (never reached on this arm)")
    expected = plain.text[: plain.text.index(ctx.stop)]
    if answer.text.rstrip() != expected.rstrip():
        return Outcome(
            "fail", f"stopped answer and greedy prefix {_differs(answer.text, expected)}"
        )
    if answer.finish.get(0) != "stop":
        return Outcome("fail", f"finish_reason {answer.finish.get(0)!r}, expected 'stop'")
    return Outcome("pass", f"stopped before {ctx.stop!r} after {len(answer.text)} characters")


def max_tokens_1(arm: ArmClient, ctx: Context) -> Outcome:
    answer = arm.complete(arm.body(GREEDY_PROMPT, max_tokens=1, temperature=0.0, seed=0))
    if not answer.ok:
        return _not_answered(answer)
    tokens = answer.completion_tokens
    if tokens is not None and tokens != 1:
        return Outcome("fail", f"{tokens} tokens answered for max_tokens = 1")
    if answer.finish.get(0) not in ("length", "stop"):
        return Outcome("fail", f"finish_reason {answer.finish.get(0)!r}")
    counted = "1 token" if tokens == 1 else "usage not reported"
    return Outcome("pass", f"{counted}, {answer.text!r}, finish_reason {answer.finish.get(0)}")


def _logprob_entries(arm: ArmClient, answer: Answer) -> list[tuple[Any, int]] | str:
    """(log-prob, top alternatives) per output token, or why the answer has none."""
    choice = answer.body["choices"][0]
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return "no logprobs in the answer"
    entries: list[tuple[Any, int]] = []
    if arm.config.api == "chat":
        for entry in logprobs.get("content") or ():
            if not isinstance(entry, dict):
                return "a logprobs entry is not an object"
            entries.append((entry.get("logprob"), len(entry.get("top_logprobs") or ())))
    else:
        tops = logprobs.get("top_logprobs") or ()
        for index, value in enumerate(logprobs.get("token_logprobs") or ()):
            top = tops[index] if index < len(tops) else None
            entries.append((value, len(top) if isinstance(top, dict) else 0))
    return entries


def logprobs(arm: ArmClient, ctx: Context) -> Outcome:
    top = 3
    params: dict[str, Any] = (
        {"logprobs": True, "top_logprobs": top} if arm.config.api == "chat" else {"logprobs": top}
    )
    answer = arm.complete(arm.body(GREEDY_PROMPT, max_tokens=8, temperature=0.0, seed=0, **params))
    if not answer.ok:
        return _not_answered(answer)
    entries = _logprob_entries(arm, answer)
    if isinstance(entries, str):
        return Outcome("fail", entries)
    if not entries:
        return Outcome("fail", "logprobs without entries")
    tokens = answer.completion_tokens
    if tokens is not None and len(entries) != tokens:
        return Outcome("fail", f"{len(entries)} logprobs entries for {tokens} tokens")
    for index, (value, alternatives) in enumerate(entries):
        if not isinstance(value, int | float) or not math.isfinite(value) or value > 1e-3:
            return Outcome("fail", f"token {index}: log-prob {value!r} is not a log-probability")
        if alternatives < top:
            return Outcome("fail", f"token {index}: {alternatives} top_logprobs, asked for {top}")
    return Outcome("pass", f"{len(entries)} tokens, each with its log-prob and {top} alternatives")


def _choice_problem(text: str, finish: str | None, nll: float | None, ctx: Context) -> str:
    """Why one sampled choice is not a healthy answer ("" when it is), judged as the
    quality checks judge sampled output: a repetition loop, or a token the baseline
    model would all but never sample (`nll`: the choice's largest token NLL)."""
    if not text.strip():
        return "empty"
    if finish not in ("stop", "length"):
        return f"finish_reason {finish!r}"
    if find_repetition_loop(word_units(text)) is not None:
        return f"ends in a repetition loop: {text[-60:]!r}"
    if nll is not None and nll > ctx.implausible_nll:
        return (
            f"implausible token (NLL {nll:.1f} nats > {ctx.implausible_nll:g} under the "
            f"baseline model): {text[:60]!r}"
        )
    return ""


def n_gt_1(arm: ArmClient, ctx: Context) -> Outcome:
    answer = arm.complete(
        arm.body(
            N_PROMPT, max_tokens=SAMPLED_TOKENS, temperature=N_TEMPERATURE, seed=7, n=N_CHOICES
        )
    )
    if not answer.ok:
        return _not_answered(answer)
    if sorted(answer.texts) != list(range(N_CHOICES)):
        return Outcome("fail", f"choices {sorted(answer.texts)} for n = {N_CHOICES}")
    nlls = []
    for index in range(N_CHOICES):
        text = answer.texts[index]
        nll = ctx.max_token_nll(N_PROMPT, text) if text.strip() else None
        problem = _choice_problem(text, answer.finish.get(index), nll, ctx)
        if problem:
            return Outcome("fail", f"choice {index}: {problem}")
        nlls.append(nll)
    scored = [n for n in nlls if n is not None]
    judged = (
        f"largest token NLL {max(scored):.1f} nats under the baseline model"
        if scored
        else "not teacher-scored: the baseline cannot score outputs"
    )
    return Outcome("pass", f"{N_CHOICES} well-formed, finished choices without loops; {judged}")


def seed_reproducible(arm: ArmClient, ctx: Context) -> Outcome:
    """The same seeded request at T = `SEED_TEMPERATURE`, `SEED_REPEATS` times: every
    answer must equal the first (one repeat more than two catches an arm whose
    nondeterminism shows only now and then)."""
    body = arm.body(SEED_PROMPT, max_tokens=SAMPLED_TOKENS, temperature=SEED_TEMPERATURE, seed=1234)
    first = arm.complete(body)
    if not first.ok:
        return _not_answered(first)
    for repeat in range(2, SEED_REPEATS + 1):
        again = arm.complete(body)
        if not again.ok:
            return Outcome("fail", f"request {repeat}: {again.describe()}")
        if again.text != first.text:
            return Outcome(
                "fail",
                f"the same seeded request at T={SEED_TEMPERATURE}, request {repeat}: answers "
                + _differs(first.text, again.text),
            )
    return Outcome(
        "pass",
        f"identical {SEED_REPEATS} times at T={SEED_TEMPERATURE} ({len(first.text)} characters)",
    )


def json_schema(arm: ArmClient, ctx: Context) -> Outcome:
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "probe", "schema": JSON_SCHEMA, "strict": True},
    }
    answer = arm.complete(
        arm.body(
            JSON_PROMPT,
            max_tokens=JSON_TOKENS,
            temperature=0.0,
            seed=0,
            response_format=response_format,
        )
    )
    if not answer.ok:
        return _not_answered(answer)
    try:
        json.loads(answer.text)
    except ValueError:
        return Outcome(
            "fail", f"not JSON (finish_reason {answer.finish.get(0)}): {answer.text[:80]!r}"
        )
    if not matches_json_schema(JSON_SCHEMA, answer.text):
        return Outcome("fail", f"JSON off the schema: {answer.text[:80]!r}")
    return Outcome("pass", f"valid: {answer.text.strip()[:60]}")


def long_context(arm: ArmClient, ctx: Context) -> Outcome:
    if ctx.context_limit is None:
        return Outcome("unsupported", "the server reports no max_model_len in /v1/models")
    engine = ctx.engines[arm.name]
    result = engine.generate(
        GenerationRequest(
            (Message("user", ctx.long_prompt),),
            SamplingParams(max_tokens=LONG_TOKENS, temperature=0.0),
            timeout_s=ctx.time_left(),
        )
    )
    ctx.on_generation(result)
    if not result.ok:
        status = result.http_status
        state: State = "unsupported" if status in _UNSUPPORTED_STATUSES else "fail"
        return Outcome(state, f"{result.error.value}: {result.error_detail[:160]}")
    if not result.text.strip():
        return Outcome("fail", "empty answer")
    size = f"{result.prompt_tokens} prompt tokens of {ctx.context_limit}" + (
        "" if ctx.tokens_measured else " (the prompt sized by an estimate: no /tokenize)"
    )
    if not engine.speculative:
        return Outcome("pass", size)
    length = result.acceptance_length
    if length is None:
        if ctx.acceptance_on_short.get(arm.name):
            return Outcome("fail", f"{size}: acceptance not reported (it is on a short prompt)")
        return Outcome("pass", f"{size}; acceptance not reported by this server")
    return Outcome("pass", f"{size}, acceptance length {length:.2f}")


def over_limit_4xx(arm: ArmClient, ctx: Context) -> Outcome:
    if ctx.context_limit is None:
        return Outcome("unsupported", "the server reports no max_model_len in /v1/models")
    answer = arm.complete(arm.body(ctx.over_prompt, max_tokens=8, temperature=0.0, seed=0))
    if answer.status is not None and 400 <= answer.status < 500:
        return Outcome("pass", f"HTTP {answer.status}: {answer.error[:120]}")
    if answer.status == 200:
        return Outcome("fail", f"answered 200 to a prompt over the {ctx.context_limit}-token limit")
    return Outcome("fail", answer.describe())


def odd_input(arm: ArmClient, ctx: Context) -> Outcome:
    seen = []
    for label, content in ODD_INPUTS.items():
        answer = arm.complete(arm.body(content, max_tokens=ODD_TOKENS, temperature=0.0, seed=0))
        clean_refusal = answer.status is not None and 400 <= answer.status < 500 and answer.error
        if label == "mixed-script" and not answer.ok:
            return Outcome("fail", f"{label}: {answer.describe()}")
        if not (answer.ok or clean_refusal):
            return Outcome("fail", f"{label}: {answer.describe()}")
        seen.append(f"{label} {answer.status}")
    return Outcome("pass", ", ".join(seen))


def burst_16(arm: ArmClient, ctx: Context) -> Outcome:
    body = arm.body(GREEDY_PROMPT, max_tokens=BURST_TOKENS, temperature=0.0, seed=0)
    started = time.monotonic()
    with ThreadPoolExecutor(BURST) as pool:
        answers = list(pool.map(lambda _: arm.stream(body), range(BURST)))
    elapsed = time.monotonic() - started
    failed = [a for a in answers if not a.ok or not a.text]
    if failed:
        return Outcome(
            "fail",
            f"{len(failed)} of {BURST} failed, first: "
            + (failed[0].describe() if not failed[0].ok else "empty answer"),
        )
    return Outcome("pass", f"{BURST}/{BURST} streamed answers in {elapsed:.1f} s")


def cancel_mid_stream(arm: ArmClient, ctx: Context) -> Outcome:
    before = arm.running()
    problem = arm.cancel_streams(
        arm.body(GREEDY_PROMPT, max_tokens=CANCEL_TOKENS, temperature=0.0, seed=0),
        CANCELLED_STREAMS,
    )
    if problem:
        return Outcome("fail", problem)
    after = arm.complete(arm.body(GREEDY_PROMPT, max_tokens=8, temperature=0.0, seed=0))
    if not after.ok:
        return Outcome("fail", f"after {CANCELLED_STREAMS} cancelled streams: {after.describe()}")
    if before is None:
        return Outcome(
            "pass", f"answers after {CANCELLED_STREAMS} cancelled streams (no running gauge)"
        )
    settled = arm.settled(before, GAUGE_SETTLE_S)
    if settled is not None and settled > before:
        return Outcome(
            "fail",
            f"running requests {settled:g} after {GAUGE_SETTLE_S:g} s (was {before:g}): "
            "cancelled streams still generating",
        )
    return Outcome(
        "pass",
        f"answers after {CANCELLED_STREAMS} cancelled streams; running gauge back to {before:g}",
    )


CHECKS: dict[str, Callable[[ArmClient, Context], Outcome]] = {
    "streaming_equals_plain": streaming_equals_plain,
    "stop": stop,
    "max_tokens_1": max_tokens_1,
    "logprobs": logprobs,
    "n_gt_1": n_gt_1,
    "seed_reproducible": seed_reproducible,
    "json_schema": json_schema,
    "long_context": long_context,
    "over_limit_4xx": over_limit_4xx,
    "odd_input": odd_input,
    "burst_16": burst_16,
    "cancel_mid_stream": cancel_mid_stream,
}
CAPABILITIES = tuple(CHECKS)
