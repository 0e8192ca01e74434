"""The bench's serving table: each level's per-arm figures in `vllm bench serve`'s terms
(TTFT, per-chunk and per-token ITL, TPOT, e2e medians and P99s, goodput, throughput,
fallback rate, cost per useful token and its ratio to the baseline's), and the warm-up
requests' cold figures beside them. Read from the bench section a run stores
(`canaryd.bench.run.serving_results` builds the JSON from the same figures)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from canaryd.report.tables import ReportTable, fmt, pct

__all__ = ["serving_table"]


def _row(level: str, arm: str, f: Mapping[str, Any], ratio: float | None) -> tuple[str, ...]:
    def pair(metric: str) -> str:
        figures = f.get(metric) or {}
        return f"{fmt(figures.get('p50_ms'), '.1f')}/{fmt(figures.get('p99_ms'), '.1f')}"

    unit = "GPU-s" if f.get("resource_unit") == "gpu_s" else "core-s"
    cost = f.get("cost_per_useful_token")
    return (
        level,
        arm,
        str(f.get("completed", 0)),
        pair("ttft"),
        pair("itl_chunk"),
        pair("itl"),
        pair("tpot"),
        pair("e2e"),
        fmt(f.get("goodput"), ".2f"),
        fmt(f.get("request_throughput"), ".2f"),
        fmt(f.get("output_throughput"), ".1f"),
        pct(f.get("fallback_rate")),
        "—" if cost is None else f"{cost * 1000:.2f} m{unit}",
        fmt(ratio, ".2f", "×"),
    )


def serving_table(section: Mapping[str, Any] | None) -> ReportTable | None:
    """None when the bench stored no serving figures (a run from before them)."""
    levels = [] if section is None else section.get("levels", [])
    rows = []
    cold = ((section or {}).get("warmup") or {}).get("cold") or {}
    for arm, figures in cold.items():
        rows.append(_row("cold", arm, figures, None))
    for data in levels:
        serving = data.get("serving") or {}
        if not serving:
            continue
        rate = data.get("rate")
        level = f"r={rate:g}/s" if rate is not None else f"c={data.get('concurrency')}"
        base = (serving.get("baseline") or {}).get("cost_per_useful_token")
        for arm, figures in serving.items():
            own = figures.get("cost_per_useful_token")
            ratio = own / base if base and own is not None and arm != "baseline" else None
            rows.append(_row(level, arm, figures, ratio))
    if not rows:
        return None
    return ReportTable(
        title="Serving figures per level and arm (ms: p50/p99)",
        columns=(
            "level",
            "arm",
            "done",
            "TTFT",
            "ITL/chunk",
            "ITL/token",
            "TPOT",
            "e2e",
            "goodput/s",
            "req/s",
            "out tok/s",
            "fallback",
            "cost/useful tok",
            "cost ×base",
        ),
        rows=tuple(rows),
        note="ITL/chunk is vllm bench serve's ITL (one gap per streamed chunk); ITL/token "
        "gives the other tokens of a chunk a gap of 0. cold: the warm-up requests, the "
        "first after start. cost: resource-seconds (GPU via NVML, else the machine's busy "
        "CPU core-seconds) per output token of pairs that passed the quality checks.",
    )
