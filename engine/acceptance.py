"""Acceptance figures of remote speculative servers, one reader per server kind.

Each server reports acceptance its own way, so each reader follows one upstream source
(cited at the function; recorded examples live in tests/fixtures/servers/):

- llama.cpp native server: `timings.draft_n` / `timings.draft_n_accepted` on the final
  response, exact for that request (`per_request`).
- SGLang: `meta_info.spec_*` fields of its native responses, exact (`per_request`); over
  the OpenAI API only `/server_info`'s running `avg_spec_accept_length` (`window_aggregate`).
- vLLM: `metrics.speculative_decoding` on the final chunk when the server runs with
  `--per-request-spec-decode-metrics` (`per_request`); otherwise the `vllm:spec_decode_*`
  Prometheus counters, differenced around a window (`window_aggregate`: other traffic
  in that window is counted too).
- TGI: the `tgi_request_skipped_tokens` distribution (one observation per decode step:
  tokens emitted beyond the first), differenced around a window (`window_aggregate`).

Verify steps are the steps that verified a draft, as each server counts them. A server
that skips drafting on some steps (vLLM's n-gram proposer when nothing matches) emits
tokens outside any verify step, so no reader derives steps or accepted tokens from the
output length unless its server verifies on every step (SGLang, whose own accept length
is output / steps) or reports nothing better (llama.cpp, see `llamacpp_stats`).
A reader that finds nothing returns `None` — "not reported" — never a zero-filled figure;
likewise a reader that finds steps and accepted tokens but no drafted count returns
`draft_tokens=None`, and per-position figures it does not find stay empty.
Prometheus text goes through prometheus_client's own parser. A counter that went down
between two scrapes means the server restarted: its new value is the delta.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from engine.errors import MetricsFormatError
from engine.types import AcceptanceSource, SpeculativeStats

Counters = dict[str, float]

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
TGI_SKIPPED = "tgi_request_skipped_tokens"


def counter_delta(before: float, after: float) -> float:
    """Increase of a monotonic counter between two scrapes. A counter that went down
    was reset (the server restarted): everything it holds now is new."""
    return after - before if after >= before else after


def deltas(before: Counters, after: Counters) -> Counters:
    """Per-key `counter_delta`; a key missing from `before` started at zero."""
    return {key: counter_delta(before.get(key, 0.0), value) for key, value in after.items()}


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    try:
        return [
            (sample.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsFormatError("Prometheus text", str(exc)) from exc


def vllm_counters(text: str, model_name: str | None = None) -> Counters:
    """vLLM's spec-decode counters, summed over engines (data-parallel ranks).

    Follows vllm/v1/spec_decode/metrics.py (`SpecDecodingProm`): counters
    `vllm:spec_decode_num_drafts`, `…_num_draft_tokens`, `…_num_accepted_tokens` and
    `…_num_accepted_tokens_per_pos{position="i"}`, labelled `model_name` and `engine`.
    Keys: drafts, draft_tokens, accepted_tokens, pos<i>.
    """
    names = {
        VLLM_DRAFTS + "_total": "drafts",
        VLLM_DRAFT_TOKENS + "_total": "draft_tokens",
        VLLM_ACCEPTED + "_total": "accepted_tokens",
    }
    out: Counters = {}
    for name, labels, value in _samples(text):
        if model_name is not None and labels.get("model_name", model_name) != model_name:
            continue
        if name in names:
            key = names[name]
        elif name == VLLM_ACCEPTED_PER_POS + "_total" and "position" in labels:
            key = f"pos{int(labels['position'])}"
        else:
            continue
        out[key] = out.get(key, 0.0) + value
    return out


def vllm_window_stats(before: Counters, after: Counters) -> SpeculativeStats | None:
    """Acceptance over the window between two vLLM scrapes; None when nothing was drafted
    in it (or the server exports no spec-decode counters: not a speculative server), or
    when it exports no accepted-token counter (not reported, never a zero).

    `vllm:spec_decode_num_drafts` counts only the steps that drafted, so it is the verify
    step count and the length is vLLM's own `1 + accepted / drafts`.
    """
    if "drafts" not in after or "accepted_tokens" not in after:
        return None
    change = deltas(before, after)
    drafts = int(change.get("drafts", 0))
    if drafts <= 0:
        return None
    positions = sorted(int(key[3:]) for key in change if key.startswith("pos"))
    per_position = (
        tuple(int(change[f"pos{i}"]) for i in range(positions[-1] + 1))
        if (positions and positions == list(range(positions[-1] + 1)))
        else ()
    )
    return SpeculativeStats(
        verify_steps=drafts,
        # A vLLM that exports drafts but not draft tokens has not reported them.
        draft_tokens=int(change["draft_tokens"]) if "draft_tokens" in change else None,
        accepted_tokens=int(change["accepted_tokens"]),
        accepted_per_position=per_position,
        source=AcceptanceSource.WINDOW_AGGREGATE,
    )


def vllm_request_stats(metrics: Mapping[str, Any]) -> SpeculativeStats | None:
    """Exact acceptance of one vLLM request from the `metrics` object of its response
    (in a stream: the final chunk, the one that carries `usage`).

    Follows vllm/v1/metrics/stats.py (`RequestSpecDecodeMetrics.to_dict`) and
    vllm/entrypoints/generate/base/protocol.py (`SpeculativeDecodingMetrics`), present
    when the server runs with `--per-request-spec-decode-metrics summary|detailed`:
    `num_spec_steps` verify steps (steps that drafted), `num_accepted_draft_tokens`,
    `num_draft_tokens`, and `acceptance_histogram` (entry j: steps that kept exactly j
    drafts). `detailed` adds `per_step_drafted`, which gives drafted tokens per position.
    None when the request never drafted or the figures contradict each other.
    """
    spec = metrics.get("speculative_decoding")
    if not isinstance(spec, Mapping):
        return None
    steps = _first_int(spec, "num_spec_steps")
    accepted = _first_int(spec, "num_accepted_draft_tokens")
    drafted = _first_int(spec, "num_draft_tokens")
    if steps is None or accepted is None or steps <= 0 or accepted < 0:
        return None
    if drafted is not None and accepted > drafted:
        return None
    histogram = _int_list(spec.get("acceptance_histogram"))
    per_position: tuple[int, ...] = ()
    if histogram is not None:
        if sum(histogram) != steps or sum(j * n for j, n in enumerate(histogram)) != accepted:
            return None
        # steps that kept draft i+1 = steps that kept at least i+1 drafts
        per_position = tuple(sum(histogram[i + 1 :]) for i in range(len(histogram) - 1))
    per_step = _int_list(spec.get("per_step_drafted"))
    drafted_per_position: tuple[int, ...] = ()
    if per_step is not None and len(per_step) == steps and per_position:
        drafted_per_position = tuple(
            sum(1 for n in per_step if n > i) for i in range(len(per_position))
        )
    return SpeculativeStats(
        verify_steps=steps,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        accepted_per_position=per_position,
        drafted_per_position=drafted_per_position,
        source=AcceptanceSource.PER_REQUEST,
    )


def tgi_counters(text: str) -> Counters:
    """TGI's `tgi_request_skipped_tokens` `_count` (decode steps) and `_sum` (tokens
    emitted beyond the first in each step, i.e. accepted speculated tokens).

    Follows text-generation-inference router/src/infer (`metrics::histogram!(
    "tgi_request_skipped_tokens", (n - 1) as f64)` per generation step) and
    docs/source/reference/metrics.md. Without configured buckets the exporter writes a
    summary instead of a histogram; both carry `_sum` and `_count`.
    """
    out: Counters = {}
    for name, _labels, value in _samples(text):
        if name == TGI_SKIPPED + "_count":
            out["steps"] = out.get("steps", 0.0) + value
        elif name == TGI_SKIPPED + "_sum":
            out["accepted_tokens"] = out.get("accepted_tokens", 0.0) + value
    return out


def tgi_window_stats(
    before: Counters, after: Counters, num_draft_tokens: int | None
) -> SpeculativeStats | None:
    """Acceptance over a TGI window. Steps are the histogram's observations and accepted
    tokens its sum, so the length is `1 + sum / count`, whatever this request's own
    output length. TGI does not export how many tokens it drafted: `draft_tokens` is
    steps × k when k is configured (TGI drafts a fixed k per step), else None: not
    reported (and so is the rate)."""
    if "steps" not in after:
        return None
    change = deltas(before, after)
    steps = int(change.get("steps", 0))
    if steps <= 0:
        return None
    return SpeculativeStats(
        verify_steps=steps,
        draft_tokens=steps * num_draft_tokens if num_draft_tokens else None,
        accepted_tokens=int(change.get("accepted_tokens", 0)),
        accepted_per_position=(),
        source=AcceptanceSource.WINDOW_AGGREGATE,
    )


def llamacpp_stats(timings: Mapping[str, Any], output_tokens: int) -> SpeculativeStats | None:
    """Exact drafted and accepted tokens of one llama.cpp request from its `timings`.

    Follows llama.cpp tools/server (`result_timings::to_json`): `draft_n` and
    `draft_n_accepted` are present only when the request drafted (`draft_n > 0`).
    llama.cpp reports no count of the steps that drafted, and it skips drafting when a
    draft comes out shorter than `--draft-min`, so steps = output − accepted counts
    every target step, drafting or not (each emits one token of the target's own). The
    length is then tokens per target step: never above the true per-draft figure, and
    equal to it when every step drafted.
    """
    drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not isinstance(drafted, int) or not isinstance(accepted, int) or drafted <= 0:
        return None
    steps = output_tokens - accepted
    if steps <= 0 or accepted > drafted:
        return None
    return SpeculativeStats(
        verify_steps=steps,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        accepted_per_position=(),
        source=AcceptanceSource.PER_REQUEST,
    )


def _first_int(meta: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        return value
    return None


def sglang_stats(meta_info: Mapping[str, Any], output_tokens: int) -> SpeculativeStats | None:
    """Exact acceptance of one SGLang request from its `meta_info`.

    Follows sglang python/sglang/srt/managers/tokenizer_manager.py
    (`_calculate_spec_decoding_metrics`): `spec_verify_ct` verify steps, accepted drafts as
    `spec_num_correct_drafts` (older releases: `spec_accept_token_num`; alias
    `spec_accepted_drafts`), proposed as `spec_num_proposed_drafts` (`spec_draft_token_num`,
    `spec_proposed_drafts`), and `spec_correct_drafts_histogram` (`spec_accept_histogram`):
    entry j counts verify steps that kept exactly j drafts.
    """
    steps = _first_int(meta_info, "spec_verify_ct")
    if steps is None or steps <= 0:
        return None
    accepted = _first_int(
        meta_info, "spec_num_correct_drafts", "spec_accept_token_num", "spec_accepted_drafts"
    )
    if accepted is None:
        # SGLang verifies on every decode step and itself reports completion / steps as
        # the accept length: accepted = output − steps gives exactly that figure.
        accepted = output_tokens - steps
        if accepted < 0:  # inconsistent counts: not a figure to store
            return None
    drafted = _first_int(
        meta_info, "spec_num_proposed_drafts", "spec_draft_token_num", "spec_proposed_drafts"
    )
    histogram = meta_info.get(
        "spec_correct_drafts_histogram", meta_info.get("spec_accept_histogram")
    )
    per_position: tuple[int, ...] = ()
    if isinstance(histogram, list) and all(isinstance(v, int) for v in histogram):
        # steps that kept draft i+1 = steps that kept at least i+1 drafts
        per_position = tuple(sum(histogram[i + 1 :]) for i in range(len(histogram) - 1))
    return SpeculativeStats(
        verify_steps=steps,
        draft_tokens=drafted,  # None: this SGLang did not report what it proposed
        accepted_tokens=accepted,
        accepted_per_position=per_position,
        source=AcceptanceSource.PER_REQUEST,
    )


def sglang_avg_accept_length(server_info: Any) -> float | None:
    """`internal_states[*].avg_spec_accept_length` of SGLang's `/server_info` (averaged
    over data-parallel ranks), as read by sglang's test/srt/test_eagle_infer*.py."""
    if not isinstance(server_info, Mapping):
        raise MetricsFormatError("SGLang /server_info", "not a JSON object")
    states = server_info.get("internal_states")
    if not isinstance(states, list):
        return None
    values = [
        float(state["avg_spec_accept_length"])
        for state in states
        if isinstance(state, Mapping)
        and isinstance(state.get("avg_spec_accept_length"), int | float)
        and not isinstance(state.get("avg_spec_accept_length"), bool)
    ]
    return sum(values) / len(values) if values else None


def stats_from_accept_length(accept_length: float, output_tokens: int) -> SpeculativeStats | None:
    """Steps and accepted tokens implied by a server-wide average acceptance length for a
    request of `output_tokens`: a window figure, never exact for this request, whose
    `1 + accepted / steps` is that average (rounded to whole steps). SGLang verifies on
    every decode step, so the output splits into steps plus accepted tokens. The
    average says nothing about how many tokens were drafted: `draft_tokens` is None."""
    if accept_length < 1.0 or output_tokens <= 0:
        return None
    steps = max(1, round(output_tokens / accept_length))
    return SpeculativeStats(
        verify_steps=steps,
        draft_tokens=None,
        accepted_tokens=max(output_tokens - steps, 0),
        accepted_per_position=(),
        source=AcceptanceSource.WINDOW_AGGREGATE,
    )


@dataclass(frozen=True, slots=True)
class Scrape:
    """One read of a server's window source: Prometheus counters or SGLang's average."""

    counters: Counters
    accept_length: float | None = None
