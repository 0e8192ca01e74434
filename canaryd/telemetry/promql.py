"""PromQL templates: the same signals as the direct scrape, asked of a Prometheus-compatible
API (`prometheus_url`) instead of read from the servers.

One query per signal and kind of source, each evaluated as an instant query at the scrape
time. A query returns what a direct scrape would read, not what happened in an interval:
counters are cumulative values summed `by (instance)` (one series per serving process),
histograms cumulative bucket counters summed `by (instance, le)`, gauges summed (an
engine's acceptance gauges averaged over the interval). The interval's counts are then
the differences between two evaluations, taken per process by the same code as the direct
scrape (`deltas.telemetry_window`): consecutive intervals tile exactly with integer counts,
and a process that restarted (its counter went down) counts from zero, as `increase` does.
Templates have two placeholders: `$selector`, the arm's label matchers
(`[telemetry.arms.<arm>] selector`), and `$range`, the scrape interval (for gauges averaged
over it). An arm's `queries` replace single templates. `promql_reference()` writes the
templates table of docs/telemetry.md.
"""

from __future__ import annotations

from string import Template

from canaryd.telemetry.config import GatewayFlavour, Signal, TelemetryArmConfig

# The label that names one serving process (one Prometheus target); a query's series are
# read as one replica per value of it, as the direct scrape reads one per URL.
REPLICA_LABEL = "instance"


def _matchers(matchers: str) -> str:
    return f"{{{matchers},$selector}}" if matchers else "{$selector}"


def _counter(series: str, matchers: str = "") -> str:
    return f"sum by ({REPLICA_LABEL}) ({series}{_matchers(matchers)})"


def _buckets(series: str, matchers: str = "") -> str:
    return f"sum by ({REPLICA_LABEL}, le) ({series}_bucket{_matchers(matchers)})"


def _gauge(series: str) -> str:
    return f"sum by ({REPLICA_LABEL}) ({series}{{$selector}})"


def _mean_gauge(series: str) -> str:
    return f"avg by ({REPLICA_LABEL}) (avg_over_time({series}{{$selector}}[$range]))"


VLLM_QUERIES: dict[Signal, str] = {
    # finished_reason="error" is a request answered 500
    "requests": _counter("vllm:request_success_total"),
    "errors": _counter("vllm:request_success_total", 'finished_reason="error"'),
    "e2e": _buckets("vllm:e2e_request_latency_seconds"),
    "ttft": _buckets("vllm:time_to_first_token_seconds"),
    "itl": _buckets("vllm:inter_token_latency_seconds"),
    "running": _gauge("vllm:num_requests_running"),
    "waiting": _gauge("vllm:num_requests_waiting"),
    "drafts": _counter("vllm:spec_decode_num_drafts_total"),
    "draft_tokens": _counter("vllm:spec_decode_num_draft_tokens_total"),
    "accepted_tokens": _counter("vllm:spec_decode_num_accepted_tokens_total"),
}

SGLANG_QUERIES: dict[Signal, str] = {
    # SGLang counts no errors: take them from a gateway arm, or set queries.errors
    "requests": _counter("sglang:num_requests_total"),
    "e2e": _buckets("sglang:e2e_request_latency_seconds"),
    "ttft": _buckets("sglang:time_to_first_token_seconds"),
    "itl": _buckets("sglang:inter_token_latency_seconds"),
    "running": _gauge("sglang:num_running_reqs"),
    "waiting": _gauge("sglang:num_queue_reqs"),
    "acceptance_length": _mean_gauge("sglang:spec_accept_length"),
    "acceptance_rate": _mean_gauge("sglang:spec_accept_rate"),
}

GATEWAY_QUERIES: dict[GatewayFlavour, dict[Signal, str]] = {
    # Both sidecars of a request report it: count the destination's report only.
    "istio": {
        "requests": _counter("istio_requests_total", 'reporter="destination"'),
        "errors": _counter("istio_requests_total", 'reporter="destination",response_code=~"5.."'),
        "client_errors": _counter(
            "istio_requests_total", 'reporter="destination",response_code=~"4.."'
        ),
        # milliseconds: the bounds are scaled by signals.GATEWAYS' `scale`, as on a scrape
        "e2e": _buckets("istio_request_duration_milliseconds", 'reporter="destination"'),
    },
    "envoy": {
        "requests": _counter("envoy_cluster_upstream_rq_total"),
        "errors": _counter("envoy_cluster_upstream_rq_xx", 'envoy_response_code_class="5"'),
        "client_errors": _counter("envoy_cluster_upstream_rq_xx", 'envoy_response_code_class="4"'),
        "e2e": _buckets("envoy_cluster_upstream_rq_time"),  # milliseconds
    },
    "ingress-nginx": {
        "requests": _counter("nginx_ingress_controller_requests"),
        "errors": _counter("nginx_ingress_controller_requests", 'status=~"5.."'),
        "client_errors": _counter("nginx_ingress_controller_requests", 'status=~"4.."'),
        "e2e": _buckets("nginx_ingress_controller_request_duration_seconds"),
    },
}

_KIND_TABLES: dict[str, dict[Signal, str]] = {
    "vllm": VLLM_QUERIES,
    "sglang": SGLANG_QUERIES,
    **{f"gateway ({flavour})": table for flavour, table in GATEWAY_QUERIES.items()},
}


# A serving engine's process start time tells a restart even once its counters have
# grown past their old values (prometheus-client exports it; gateways' sidecars do not,
# and the selector of a gateway's series would not match it anyway).
PROCESS_START_QUERY = f"min by ({REPLICA_LABEL}) (process_start_time_seconds{{$selector}})"


def process_start_template(config: TelemetryArmConfig) -> str | None:
    """The query of the replicas' process start times, for the engines' kinds only."""
    return PROCESS_START_QUERY if config.kind in {"vllm", "sglang"} else None


def templates(config: TelemetryArmConfig) -> dict[Signal, str]:
    """The arm's query templates: the shipped ones for its kind, its `queries` in place."""
    if config.kind == "vllm":
        shipped = VLLM_QUERIES
    elif config.kind == "sglang":
        shipped = SGLANG_QUERIES
    elif config.kind == "gateway" and config.gateway is not None:
        shipped = GATEWAY_QUERIES[config.gateway]
    else:
        shipped = {}
    return {**shipped, **config.queries}


def render(template: str, *, selector: str, range_s: float) -> str:
    """A template with `$selector` and `$range` (whole seconds, at least 1 s) filled in;
    an empty selector leaves no stray comma behind a template's own matchers. KeyError or
    ValueError for a placeholder other than these two."""
    seconds = max(round(range_s), 1)
    query = Template(template).substitute(selector=selector, range=f"{seconds}s")
    return query if selector else query.replace(",}", "}")


def promql_reference() -> str:
    """The shipped templates as a Markdown table: one row per kind and signal."""
    lines = ["| kind | signal | query |", "|---|---|---|"]
    for kind, table in _KIND_TABLES.items():
        for signal, query in table.items():
            lines.append(f"| {kind} | `{signal}` | `{query}` |")
    lines.append(f"| vllm, sglang | process start (restarts) | `{PROCESS_START_QUERY}` |")
    return "\n".join(lines) + "\n"
