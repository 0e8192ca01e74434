"""PromQL templates: the same signals as the direct scrape, asked of a Prometheus-compatible
API (`prometheus_url`) instead of read from the servers.

One query per signal and kind of source, with two placeholders: `$selector`, the arm's
label matchers (`[telemetry.arms.<arm>] selector`), and `$range`, the interval between two
evaluations (`increase` over it gives the interval's counts, resets handled by
Prometheus). Counter signals are `increase`s summed over series; histogram signals are
bucket increases summed `by (le)`, from which canaryd takes quantiles as for a scrape;
gauges are summed (acceptance gauges averaged). An arm's `queries` replace single
templates. This module is data and the substitution only; no client asks these yet.
"""

from __future__ import annotations

from string import Template

from canaryd.telemetry.config import GatewayFlavour, Signal, TelemetryArmConfig


def _increase(series: str, matchers: str = "") -> str:
    inner = f"{matchers},$selector" if matchers else "$selector"
    return f"sum(increase({series}{{{inner}}}[$range]))"


def _buckets(series: str, matchers: str = "") -> str:
    inner = f"{matchers},$selector" if matchers else "$selector"
    return f"sum by (le) (increase({series}_bucket{{{inner}}}[$range]))"


VLLM_QUERIES: dict[Signal, str] = {
    "requests": _increase("vllm:request_success_total"),
    "errors": _increase("vllm:request_success_total", 'finished_reason="error"'),
    "e2e": _buckets("vllm:e2e_request_latency_seconds"),
    "ttft": _buckets("vllm:time_to_first_token_seconds"),
    "itl": _buckets("vllm:inter_token_latency_seconds"),
    "running": "sum(vllm:num_requests_running{$selector})",
    "waiting": "sum(vllm:num_requests_waiting{$selector})",
    "drafts": _increase("vllm:spec_decode_num_drafts_total"),
    "draft_tokens": _increase("vllm:spec_decode_num_draft_tokens_total"),
    "accepted_tokens": _increase("vllm:spec_decode_num_accepted_tokens_total"),
}

SGLANG_QUERIES: dict[Signal, str] = {
    "requests": _increase("sglang:num_requests_total"),
    "e2e": _buckets("sglang:e2e_request_latency_seconds"),
    "ttft": _buckets("sglang:time_to_first_token_seconds"),
    "itl": _buckets("sglang:inter_token_latency_seconds"),
    "running": "sum(sglang:num_running_reqs{$selector})",
    "waiting": "sum(sglang:num_queue_reqs{$selector})",
    "acceptance_length": "avg(avg_over_time(sglang:spec_accept_length{$selector}[$range]))",
    "acceptance_rate": "avg(avg_over_time(sglang:spec_accept_rate{$selector}[$range]))",
}

GATEWAY_QUERIES: dict[GatewayFlavour, dict[Signal, str]] = {
    "istio": {
        "requests": _increase("istio_requests_total", 'reporter="destination"'),
        "errors": _increase("istio_requests_total", 'reporter="destination",response_code=~"5.."'),
        # milliseconds, as on a scrape: the bounds scale by signals.GATEWAYS' `scale`
        "e2e": _buckets("istio_request_duration_milliseconds", 'reporter="destination"'),
    },
    "envoy": {
        "requests": _increase("envoy_cluster_upstream_rq_total"),
        "errors": _increase("envoy_cluster_upstream_rq_xx", 'envoy_response_code_class="5"'),
        "e2e": _buckets("envoy_cluster_upstream_rq_time"),
    },
    "ingress-nginx": {
        "requests": _increase("nginx_ingress_controller_requests"),
        "errors": _increase("nginx_ingress_controller_requests", 'status=~"5.."'),
        "e2e": _buckets("nginx_ingress_controller_request_duration_seconds"),
    },
}


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
    an empty selector leaves no stray comma behind a template's own matchers."""
    seconds = max(round(range_s), 1)
    query = Template(template).substitute(selector=selector, range=f"{seconds}s")
    return query if selector else query.replace(",}", "}")
