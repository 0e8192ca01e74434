"""The `Engine` contract, checked on every engine the same way.

Each class is one promise of `engine.base.Engine` and `engine.types`; each test runs on
every arm: the fake engine (healthy, and with injected errors or timeouts), the
transformers engine on a tiny random Llama built in code (baseline, prompt lookup and
draft model), and the HTTP engine against a loopback server that answers well or
misbehaves (malformed chunk, dropped connection, stall, 503, nothing listening). An arm
declares what it should answer (`fault`) and how it reports acceptance, so a test
states one behaviour for all of them.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any, Literal

import pytest

from engine.base import Engine
from engine.config import (
    FakeEngineConfig,
    OpenAIEngineConfig,
    SpeculativeConfig,
    TransformersEngineConfig,
)
from engine.fake import FakeEngine
from engine.heads.model import initialised_heads
from engine.hf import TransformersEngine
from engine.http import OpenAIEngine
from engine.testing import tiny_llama
from engine.types import (
    AcceptanceSource,
    ErrorKind,
    GenerationRequest,
    GenerationResult,
    Message,
    SamplingParams,
)
from tests.support.servers import Behaviour, MisbehavingServer, refused_url

COPYING = (
    "Rewrite the sentence exactly: the quick brown fox jumps over the lazy dog. "
    "the quick brown fox jumps over the lazy dog. the quick brown fox"
)
SLACK_S = 2.0  # scheduling noise on a loaded test machine, never a real engine delay
CUT_S = 0.05  # a timeout no slow generation below can meet
EXACT_SOURCES = {AcceptanceSource.DECODING_LOOP, AcceptanceSource.PER_REQUEST}


def request(text: str, max_tokens: int = 12, **sampling: Any) -> GenerationRequest:
    return GenerationRequest(
        messages=(Message("user", text),),
        sampling=SamplingParams(max_tokens=max_tokens, **sampling),
        request_id=f"r{max_tokens}",
        category="qa",
    )


WELL_FORMED = (
    request(COPYING),
    request(COPYING, max_tokens=1),
    request("Translate into French: the cat sleeps.", temperature=1.0, seed=3),
    GenerationRequest(
        messages=(
            Message("system", "be brief"),
            Message("user", "hello"),
            Message("assistant", "hi there"),
            Message("user", COPYING),
        ),
        sampling=SamplingParams(max_tokens=8),
    ),
)
ILL_FORMED = (request(""), request("  \n\t "), GenerationRequest(messages=()))


class Rig:
    """What arms are built from: the tiny model (built once per module, on first use)
    and a loopback server, started on first use, answering every request one way."""

    def __init__(self, fixtures: pytest.FixtureRequest, stack: ExitStack) -> None:
        self._fixtures = fixtures
        self._stack = stack
        self._server: MisbehavingServer | None = None

    def server(self, behaviour: Behaviour) -> MisbehavingServer:
        if self._server is None:
            self._server = self._stack.enter_context(MisbehavingServer())
        self._server.default = behaviour
        return self._server

    def transformers(self, spec: SpeculativeConfig | None) -> TransformersEngine:
        model, tokenizer = self._fixtures.getfixturevalue("tiny")
        draft = heads = None
        if spec is not None and spec.method == "draft_model":
            draft = self._fixtures.getfixturevalue("tiny_draft")
        if spec is not None and spec.method == "draft_heads":  # random, untrained heads
            kind = "causal" if spec.causal else "independent"
            heads = initialised_heads(model, kind, spec.num_draft_tokens, scale=0.05)
        config = TransformersEngineConfig(model="tiny", speculative=spec, warmup_tokens=2)
        return TransformersEngine(
            config, model=model, tokenizer=tokenizer, draft_model=draft, heads=heads
        )

    def http(
        self, behaviour: Behaviour, *, refused: bool, read_s: float, **config: Any
    ) -> OpenAIEngine:
        url = refused_url() if refused else self.server(behaviour).url
        settings: dict[str, Any] = {
            "base_url": url,
            "timeouts": {"connect": 1.0, "read": read_s, "total": 10.0},
            "max_retries": 0,
        }
        return OpenAIEngine(OpenAIEngineConfig(**(settings | config)))


Build = Callable[[Rig], Engine]
SlowRequest = Callable[[Rig, float], GenerationRequest]


@dataclass(frozen=True)
class Arm:
    """One engine configuration and what the contract expects of it.

    `fault`: the error every well-formed request comes back with (NONE: a healthy arm).
    `acceptance`: "baseline" (never any figures), "exact" (every answer carries exact
    figures) or "not_reported" (a speculative arm whose figures cannot be read: None).
    `k`: the most tokens the arm drafts per verify step, when known.
    `slow`: arranges a request that would run far past any short timeout (None: the arm
    answers without waiting, so there is nothing to cut short or cancel).
    """

    name: str
    build: Build
    fault: ErrorKind = ErrorKind.NONE
    acceptance: Literal["baseline", "exact", "not_reported"] = "baseline"
    k: int | None = None
    slow: SlowRequest | None = None

    def __str__(self) -> str:
        return self.name


def _fake(**config: Any) -> Build:
    return lambda rig: FakeEngine(FakeEngineConfig(**config))


def _hf(spec: SpeculativeConfig | None = None) -> Build:
    return lambda rig: rig.transformers(spec)


def _http(
    behaviour: Behaviour | None = None, *, refused: bool = False, read_s: float = 5.0, **config: Any
) -> Build:
    return lambda rig: rig.http(behaviour or Behaviour(), refused=refused, read_s=read_s, **config)


def _long_generation(rig: Rig, timeout_s: float) -> GenerationRequest:
    return GenerationRequest(
        messages=(Message("user", COPYING),),
        sampling=SamplingParams(max_tokens=900),
        timeout_s=timeout_s,
    )


def _stalled_server(rig: Rig, timeout_s: float) -> GenerationRequest:
    rig.server(STALL)
    return GenerationRequest(messages=(Message("user", COPYING),), timeout_s=timeout_s)


LOOKUP = SpeculativeConfig(method="prompt_lookup", num_draft_tokens=4)
DRAFT = SpeculativeConfig(method="draft_model", draft_model="tiny-draft", num_draft_tokens=3)
HEADS = SpeculativeConfig(method="draft_heads", tree_topk=(2, 2, 1), max_tree_nodes=6)


def _llamacpp(behaviour: Behaviour) -> Build:
    return _http(behaviour, server_kind="llamacpp", speculative=True)


# Three verify steps of three drafts each over the server's 8 tokens: 8 = 5 accepted + 3.
TIMINGS = {"predicted_n": 8, "draft_n": 9, "draft_n_accepted": 5}
NONSENSE_TIMINGS = {"draft_n": 2, "draft_n_accepted": 5}  # more accepted than drafted
STALL = Behaviour(fault="stall_stream", stall_s=30.0)

ARMS = [
    Arm("fake-baseline", _fake()),
    Arm("fake-speculative", _fake(speculative=True), acceptance="exact", k=4),
    Arm("fake-errors", _fake(speculative=True, error_rate=1.0), ErrorKind.HTTP, "exact", 4),
    Arm("fake-timeouts", _fake(timeout_rate=1.0), ErrorKind.TIMEOUT),
    Arm("hf-baseline", _hf(), slow=_long_generation),
    Arm("hf-prompt-lookup", _hf(LOOKUP), acceptance="exact", k=4, slow=_long_generation),
    Arm("hf-draft-model", _hf(DRAFT), acceptance="exact", k=3, slow=_long_generation),
    Arm("hf-draft-heads", _hf(HEADS), acceptance="exact", k=3, slow=_long_generation),
    Arm("http-baseline", _http(), slow=_stalled_server),
    Arm(
        "http-llamacpp",
        _llamacpp(Behaviour(final_extra={"timings": TIMINGS})),
        acceptance="exact",
        k=3,
        slow=_stalled_server,
    ),
    Arm("http-generic-speculative", _http(speculative=True), acceptance="not_reported"),
    Arm(
        "http-nonsense-timings",
        _llamacpp(Behaviour(final_extra={"timings": NONSENSE_TIMINGS})),
        acceptance="not_reported",
    ),
    Arm("http-malformed", _http(Behaviour(fault="malformed")), ErrorKind.INVALID),
    Arm(
        "http-disconnect",
        _llamacpp(Behaviour(fault="cut", tokens=3)),
        ErrorKind.CONNECTION,
        acceptance="exact",
        k=3,
    ),
    Arm("http-stall", _http(STALL, read_s=0.3), ErrorKind.TIMEOUT),
    Arm("http-503", _http(Behaviour(fault="status", status=503)), ErrorKind.HTTP),
    Arm("http-refused", _http(refused=True), ErrorKind.CONNECTION),
]
SPECULATIVE = [arm for arm in ARMS if arm.acceptance != "baseline"]
CANCELLABLE = [arm for arm in ARMS if arm.slow is not None]


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def tiny_draft(tiny: tuple[Any, Any]) -> Any:
    model, _tokenizer = tiny_llama(seed=1, layers=1, tokenizer=tiny[1])
    return model


@pytest.fixture
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    with ExitStack() as stack:
        yield Rig(request, stack)


@pytest.fixture(params=ARMS, ids=str)
def arm(request: pytest.FixtureRequest) -> Arm:
    chosen: Arm = request.param
    return chosen


@pytest.fixture
def engine(arm: Arm, rig: Rig) -> Iterator[Engine]:
    """The arm's engine, not loaded yet; closed after the test (close is idempotent)."""
    built = arm.build(rig)
    try:
        yield built
    finally:
        built.close()


def answers(engine: Engine, requests: tuple[GenerationRequest, ...]) -> list[GenerationResult]:
    results = [engine.generate(r) for r in requests]
    assert all(isinstance(result, GenerationResult) for result in results)
    return results


class TestNeverRaises:
    def test_well_formed_requests_get_the_arms_answer(self, arm: Arm, engine: Engine) -> None:
        """generate returns a result for every request: ok on a healthy arm, the fault's
        error kind on a faulty one — a failure is never an exception."""
        for result in answers(engine, WELL_FORMED):
            assert result.error is arm.fault, result.error_detail
            assert result.ok is (arm.fault is ErrorKind.NONE)

    def test_ill_formed_requests_come_back_as_results(self, arm: Arm, engine: Engine) -> None:
        """An empty prompt or no messages at all is answered or rejected as `invalid`."""
        for result in answers(engine, ILL_FORMED):
            assert result.ok or result.error in {ErrorKind.INVALID, arm.fault}

    def test_failed_results_say_why(self, engine: Engine) -> None:
        """A failed result has finish reason `error`, a detail, and an HTTP status exactly
        when its error kind is `http`."""
        for result in answers(engine, WELL_FORMED + ILL_FORMED):
            if result.ok:
                continue
            assert result.finish_reason == "error"
            assert result.error_detail
            assert (result.http_status is not None) is (result.error is ErrorKind.HTTP)

    def test_answers_are_coherent(self, engine: Engine) -> None:
        """An answer's token ids (if any) match its token count and its timings nest:
        0 ≤ TTFT ≤ end-to-end, TPOT ≥ 0."""
        for result in answers(engine, WELL_FORMED + ILL_FORMED):
            assert result.e2e_s >= 0 and result.prompt_tokens >= 0
            if not result.ok:
                continue
            assert result.finish_reason in {"stop", "length"}
            assert result.token_ids == () or len(result.token_ids) == result.output_tokens
            assert result.ttft_s is None or 0 <= result.ttft_s <= result.e2e_s
            assert result.tpot_s is None or result.tpot_s >= 0


class TestAcceptance:
    def test_source_names_where_figures_came_from(self, engine: Engine) -> None:
        """A result without figures says `not_reported`; one with figures names their source."""
        for result in answers(engine, WELL_FORMED + ILL_FORMED):
            if result.speculative is None:
                assert result.acceptance_source is AcceptanceSource.NOT_REPORTED
            else:
                assert result.acceptance_source is result.speculative.source
                assert result.acceptance_source is not AcceptanceSource.NOT_REPORTED

    @pytest.mark.parametrize("arm", [a for a in ARMS if a.acceptance == "baseline"], ids=str)
    def test_baseline_arms_report_no_acceptance(self, engine: Engine) -> None:
        """A baseline arm never carries acceptance figures."""
        assert not engine.speculative
        for result in answers(engine, WELL_FORMED):
            assert result.speculative is None and result.acceptance_length is None

    @pytest.mark.parametrize("arm", [a for a in ARMS if a.acceptance == "exact"], ids=str)
    def test_exact_arms_report_every_answer(self, engine: Engine) -> None:
        """A speculative arm that reads its decoding loop (or the server's per-request
        figures) reports them on every answer."""
        assert engine.speculative
        for result in answers(engine, WELL_FORMED):
            if result.ok:
                assert result.speculative is not None
                assert result.speculative.source in EXACT_SOURCES

    @pytest.mark.parametrize("arm", [a for a in ARMS if a.acceptance == "not_reported"], ids=str)
    def test_unreadable_figures_are_none_never_zeros(self, engine: Engine) -> None:
        """A speculative arm whose server gives no usable figures says not reported."""
        assert engine.speculative
        for result in answers(engine, WELL_FORMED):
            assert result.ok
            assert result.speculative is None and result.acceptance_length is None

    @pytest.mark.parametrize("arm", SPECULATIVE, ids=str)
    def test_reported_figures_obey_their_identities(self, arm: Arm, engine: Engine) -> None:
        """Reported figures are consistent: at least one verify step, accepted ≤ drafted,
        per-position counts sum to the totals and only fall with position; exact figures
        also give output = accepted + steps and an acceptance length in 1 … k+1."""
        for result in answers(engine, WELL_FORMED):
            stats = result.speculative
            if stats is None:
                continue
            assert stats.verify_steps >= 1
            assert stats.accepted_tokens >= 0
            if stats.draft_tokens is not None:
                assert stats.accepted_tokens <= stats.draft_tokens
            rate = stats.acceptance_rate
            assert rate is None or 0.0 <= rate <= 1.0
            accepted, drafted = stats.accepted_per_position, stats.drafted_per_position
            if accepted:
                assert sum(accepted) == stats.accepted_tokens
                assert all(a >= b for a, b in itertools.pairwise(accepted))
            if drafted:
                assert sum(drafted) == stats.draft_tokens
                assert all(a >= b for a, b in itertools.pairwise(drafted))
                assert all(a <= d for a, d in zip(accepted, drafted, strict=False))
            if stats.source not in EXACT_SOURCES:
                continue
            assert result.output_tokens == stats.accepted_tokens + stats.verify_steps
            length = result.acceptance_length
            assert length is not None and length >= 1.0
            if arm.k is not None:
                assert length <= arm.k + 1
                assert len(accepted) <= arm.k and len(drafted) <= arm.k


class TestLifecycle:
    def test_generate_loads_on_demand(self, arm: Arm, engine: Engine) -> None:
        """generate before any load() gives the arm's usual answer."""
        assert engine.generate(WELL_FORMED[0]).error is arm.fault

    def test_load_twice(self, arm: Arm, engine: Engine) -> None:
        """A second load() changes nothing: same identity, same answers."""
        engine.load()
        identity = engine.identity
        engine.load()
        assert engine.identity == identity
        assert engine.generate(WELL_FORMED[0]).error is arm.fault

    def test_close_twice(self, engine: Engine) -> None:
        """close() after close() is a no-op."""
        engine.load()
        engine.close()
        engine.close()

    def test_close_without_load(self, engine: Engine) -> None:
        """close() on an engine that was never loaded is a no-op."""
        engine.close()

    def test_generate_after_close_returns_a_result(self, engine: Engine) -> None:
        """A closed engine still answers generate with a result (which may be an error
        saying it is closed), never an exception."""
        engine.load()
        engine.close()
        result = engine.generate(WELL_FORMED[0])
        assert isinstance(result, GenerationResult)
        assert result.ok or result.error_detail


class TestCancellation:
    def test_timeout_bounds_every_request(self, arm: Arm, engine: Engine) -> None:
        """A request with timeout_s returns within it (plus scheduling slack), either
        answered or as `timeout` — or with the arm's own fault."""
        limit = 2.0
        timed = replace(WELL_FORMED[0], timeout_s=limit)
        started = time.perf_counter()
        result = engine.generate(timed)
        assert time.perf_counter() - started < limit + SLACK_S
        assert result.error in {ErrorKind.NONE, ErrorKind.TIMEOUT, arm.fault}
        if result.error is ErrorKind.TIMEOUT:
            assert result.e2e_s <= limit + SLACK_S

    @pytest.mark.parametrize("arm", CANCELLABLE, ids=str)
    def test_slow_generation_is_cut_at_its_timeout(
        self, arm: Arm, rig: Rig, engine: Engine
    ) -> None:
        """A generation that would run far past timeout_s stops near it as `timeout`."""
        assert arm.slow is not None
        slow = arm.slow(rig, CUT_S)
        engine.load()
        started = time.perf_counter()
        result = engine.generate(slow)
        elapsed = time.perf_counter() - started
        assert result.error is ErrorKind.TIMEOUT, result.error_detail
        assert elapsed < CUT_S + SLACK_S
        assert result.e2e_s <= elapsed

    @pytest.mark.parametrize("arm", CANCELLABLE, ids=str)
    def test_close_during_generate(self, arm: Arm, rig: Rig, engine: Engine) -> None:
        """close() while a generate is in flight returns promptly, and that generate
        still ends with a result, never an exception."""
        assert arm.slow is not None
        slow = arm.slow(rig, 1.0)
        engine.load()
        results: list[GenerationResult] = []
        errors: list[BaseException] = []

        def call() -> None:
            try:
                results.append(engine.generate(slow))
            except BaseException as exc:  # the promise under test: nothing escapes
                errors.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(0.2)
        started = time.perf_counter()
        engine.close()
        assert time.perf_counter() - started < SLACK_S
        thread.join(timeout=1.0 + 2 * SLACK_S)
        assert not thread.is_alive()
        assert errors == [] and len(results) == 1
        assert isinstance(results[0], GenerationResult)


class TestIdentity:
    def test_identity_names_kind_and_mode(self, engine: Engine) -> None:
        """identity is a string map naming the engine kind and a mode that agrees with
        `speculative`, before and after load."""
        for _ in range(2):
            identity = engine.identity
            assert all(isinstance(v, str) for v in identity.values())
            assert identity["kind"]
            assert identity["mode"] == ("speculative" if engine.speculative else "baseline")
            engine.load()

    def test_count_tokens_is_deterministic(self, engine: Engine) -> None:
        """count_tokens gives the same integer ids for the same text, and some for any
        non-empty text."""
        ids = engine.count_tokens(COPYING)
        assert ids and all(isinstance(i, int) for i in ids)
        assert engine.count_tokens(COPYING) == ids
