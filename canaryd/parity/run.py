"""One probe run: the checklist of `canaryd.parity.checks` on the baseline and the switch
arm, both OpenAI-compatible servers, into a `ProbeReport`.

`run_probe` settles what every check shares first (the baseline's greedy answer and its
stop word, the context limit and the long prompts near and over it), then runs each
capability on both arms at once. A probe run has one deadline (`timeout_s`,
`PROBE_TIMEOUT_S` unless the caller says): every answer is read within it and within
`client.ANSWER_BYTES` bytes, every generation asks the engine for no more than the time
left, and a capability not started before it fails as not run (`ProbeReport.not_run`:
such a run proves no parity). The report counts the answers a cap cut short
(`read_caps`).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from canaryd.config import Settings
from canaryd.errors import ProbeError
from canaryd.parity.checks import (
    CHECKS,
    GREEDY_PROMPT,
    GREEDY_TOKENS,
    Context,
    Outcome,
)
from canaryd.parity.client import ArmClient
from canaryd.parity.report import CapabilityResult, ProbeReport
from engine.base import Engine
from engine.config import OpenAIEngineConfig
from engine.sse import over_output_cap
from engine.types import (
    ErrorKind,
    GenerationRequest,
    GenerationResult,
    Message,
    SamplingParams,
)
from gates.records import BASELINE_ARM

__all__ = ["PROBE_TIMEOUT_S", "probe_arms", "run_probe"]

# Notes of a made-up town, cycled to fill a long context (varied, as real documents are).
_NOTES = (
    "The town of Elmbridge was founded in 1742 beside a ford on the river Wey.",
    "Its first mill ground wheat for three villages and burned down in 1790.",
    "A stone bridge replaced the ford in 1803, paid for by a toll on carts.",
    "The railway arrived in 1851 and the station still keeps its iron canopy.",
    "Elmbridge market runs every Thursday and sells cheese, apples and wool.",
    "The parish church has a Norman doorway and a tower rebuilt in 1880.",
    "In 1921 the town opened a library in the former corn exchange.",
    "Its football club has played at the Meadow Lane ground since 1899.",
    "A flood in 1968 reached the market square and closed the bridge for a week.",
    "Today about twelve thousand people live in Elmbridge and its two hamlets.",
)
_LONG_SHARE = 0.85  # of the context limit: near it, with room for the template and answer
_OVER_SHARE = 1.25
_CHARS_PER_TOKEN = 4.0  # a guess where the server cannot count tokens for us
# A whole probe run's deadline. The checklist takes well under a minute on healthy
# servers (a 15 s gauge settle at most); the daemon holds its cycle lock for the run, and
# 180 s stays under /healthz's default cycle age (3 x pair_interval_s + 2 x timeout_s).
PROBE_TIMEOUT_S = 180.0


def probe_arms(settings: Settings) -> dict[str, OpenAIEngineConfig]:
    """The baseline's and the switch arm's server configurations (`ProbeError` for an
    arm that is not an OpenAI-compatible server)."""
    arms = {}
    for name in (BASELINE_ARM, settings.switch_arm):
        config = settings.arms.arm(name)
        if not isinstance(config, OpenAIEngineConfig):
            raise ProbeError(
                name,
                f'kind = "{config.kind}": the probe asks servers, set kind = "openai" '
                "(or give --baseline and --candidate URLs)",
            )
        arms[name] = config
    return arms


def _long_prompts(client: ArmClient, limit: int) -> tuple[str, str, bool]:
    """A prompt near `limit` tokens and one past it, and whether the server counted
    the tokens (else they are estimated from characters, with wider margins)."""
    cycle = " ".join(_NOTES)
    counted = client.count_tokens(cycle)
    per_word = (counted if counted else len(cycle) / _CHARS_PER_TOKEN) / len(cycle.split())
    near, over = (_LONG_SHARE, _OVER_SHARE) if counted else (0.6, 2.0)

    def prompt(share: float) -> str:
        words = math.ceil(share * limit / per_word)
        filler = (cycle + " ") * math.ceil(words / len(cycle.split()))
        body = " ".join(filler.split()[:words])
        return f"Read these notes about a town.\n\n{body}\n\nIn one sentence, what are they about?"

    return prompt(near), prompt(over), counted is not None


def _stop_word(text: str) -> str:
    """A word from the middle of `text`, not at its start: where a stop string cuts."""
    words = [w for w in text.split() if w.isalpha() and len(w) >= 4 and text.find(w) > 0]
    return words[len(words) // 2] if words else "\n"


def _teacher(baseline: Engine, deadline: float) -> Callable[[str, str], float | None]:
    def max_token_nll(content: str, text: str) -> float | None:
        if time.monotonic() >= deadline:
            return None
        output = GenerationResult(
            text=text,
            token_ids=(),
            finish_reason="stop",
            prompt_tokens=0,
            output_tokens=0,
            ttft_s=None,
            tpot_s=None,
            e2e_s=0.0,
        )
        score = baseline.score((Message("user", content),), output)
        return None if score is None else score.max_nll

    return max_token_nll


class _GenerationCaps:
    """Counts the probe's generations cut short (thread-safe): past their byte cap, or
    timed out at the probe's `deadline`."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, result: GenerationResult) -> None:
        what = None
        if over_output_cap(result):
            what = "generation_bytes"
        elif result.error is ErrorKind.TIMEOUT and time.monotonic() >= self.deadline:
            what = "probe_deadline"
        if what is not None:
            with self._lock:
                self.counts[what] += 1


def run_probe(
    settings: Settings,
    engines: Mapping[str, Engine],
    on_result: Callable[[str, str, Outcome], None] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> ProbeReport:
    """Run every capability on the baseline and the switch arm (`engines`: their loaded
    engines, by name), calling `on_result(capability, arm, outcome)` after each, all
    within `timeout_s` (a capability not started by then fails as not run).

    The two arms are separate servers: each capability runs on both at once (the checks
    on one arm in order, as before), so the checklist takes about as long as on the
    slower arm alone, not the sum; the next capability starts when both are judged.

    Raises `ProbeError` where the probe cannot start: an arm whose server does not
    answer, or a baseline that fails the plain greedy request every check builds on."""
    started = time.monotonic()
    deadline = started + timeout_s
    configs = probe_arms(settings)
    arm = settings.switch_arm
    generation_caps = _GenerationCaps(deadline)
    with contextlib.ExitStack() as stack:
        clients = {
            name: stack.enter_context(ArmClient(name, config, deadline))
            for name, config in configs.items()
        }
        for name, client in clients.items():
            problem = client.reachable()
            if problem:
                raise ProbeError(name, problem)
        pool = stack.enter_context(ThreadPoolExecutor(len(clients), "canaryd-probe"))
        short_request = GenerationRequest(
            (Message("user", GREEDY_PROMPT),),
            SamplingParams(max_tokens=GREEDY_TOKENS),
            timeout_s=timeout_s,
        )
        pending_short = pool.submit(engines[arm].generate, short_request)
        baseline = clients[BASELINE_ARM]
        greedy = baseline.greedy(GREEDY_PROMPT, GREEDY_TOKENS)
        if not greedy.ok:
            raise ProbeError(BASELINE_ARM, f"the plain greedy request failed: {greedy.describe()}")
        if not greedy.text.strip():
            raise ProbeError(BASELINE_ARM, "the plain greedy request came back with no text")
        limits = [
            limit for limit in (c.max_model_len() for c in clients.values()) if limit is not None
        ]
        limit = min(limits) if limits else None
        long_prompt, over_prompt, counted = (
            _long_prompts(baseline, limit) if limit is not None else ("", "", False)
        )
        short = pending_short.result()
        generation_caps(short)
        ctx = Context(
            stop=_stop_word(greedy.text),
            context_limit=limit,
            long_prompt=long_prompt,
            over_prompt=over_prompt,
            tokens_measured=counted,
            max_token_nll=_teacher(engines[BASELINE_ARM], deadline),
            implausible_nll=settings.gates.quality.implausible_nll_nats,
            acceptance_on_short={arm: short.acceptance_length is not None},
            engines=dict(engines),
            deadline=deadline,
            on_generation=generation_caps,
        )
        results = []
        not_run = []
        for capability, check in CHECKS.items():
            if time.monotonic() >= deadline:
                late = Outcome("fail", f"not run: the probe's {timeout_s:g} s deadline had passed")
                outcomes = dict.fromkeys(clients, late)
                not_run.append(capability)
            else:
                running = {name: pool.submit(check, c, ctx) for name, c in clients.items()}
                outcomes = {name: outcome.result() for name, outcome in running.items()}
            if on_result is not None:
                for name, outcome in outcomes.items():
                    on_result(capability, name, outcome)
            results.append(CapabilityResult(capability, outcomes[BASELINE_ARM], outcomes[arm]))
    read_caps = generation_caps.counts + sum((c.read_caps for c in clients.values()), Counter())
    return ProbeReport(
        arm,
        tuple(results),
        limit,
        time.monotonic() - started,
        dict(sorted(read_caps.items())),
        tuple(not_run),
    )
