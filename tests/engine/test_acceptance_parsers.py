"""engine.acceptance on recorded vLLM, SGLang, TGI and llama.cpp responses and /metrics
texts (tests/fixtures/servers/SOURCES.md names the upstream file each one follows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import acceptance
from engine.types import AcceptanceSource

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
        with pytest.raises(acceptance.MetricsFormatError, match="Prometheus text"):
            acceptance.vllm_counters("vllm:spec_decode_num_drafts_total{engine= 3 3 3\n")


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
