"""The report's tables: each a `ReportTable` drawn from computed figures, rendered as
Markdown (stdout) or HTML (the report file) from the same rows, so both show the same
numbers formatted the same way (`fmt`, `pct`; `—` for "not measured").
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from canaryd.report.drift import DriftSeries
from canaryd.report.figures import (
    LATENCY_METRICS,
    AcceptanceFigures,
    ConsistencyFigures,
    LevelFigures,
    Percentiles,
)
from canaryd.report.reads import Audit, GateMark
from canaryd.report.recommend import DraftRecommendation
from canaryd.report.summary import CategorySummary
from gates.records import ARMS, Arm


def fmt(value: float | int | None, spec: str = ".3f", suffix: str = "") -> str:
    """One number as every table shows it; `—` for "not measured"."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:{spec}}{suffix}"


def pct(value: float | None) -> str:
    return fmt(None if value is None else value * 100, ".1f", "%")


@dataclass(frozen=True, slots=True)
class ReportTable:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""

    def markdown(self) -> str:
        def cell(text: str) -> str:
            return text.replace("|", "\\|")

        lines = [f"### {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        lines.append("| " + " | ".join(cell(c) for c in self.columns) + " |")
        lines.append(
            "|" + "|".join("---" if i == 0 else "---:" for i in range(len(self.columns))) + "|"
        )
        lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self.rows
        )
        note = f'<p class="note">{html.escape(self.note)}</p>' if self.note else ""
        return (
            f"<h3>{html.escape(self.title)}</h3>{note}"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )


def category_table(summary: Mapping[str, CategorySummary]) -> ReportTable:
    return ReportTable(
        title="Speedup and acceptance by category",
        columns=(
            "category",
            "pairs",
            "complete",
            "speedup p50",
            "accept len mean",
            "accept len p50",
            "accept len p90",
            "accept rate",
            "exact match",
            "quality Δ",
            "errors b/s",
        ),
        rows=tuple(
            (
                category,
                str(s.pairs),
                str(s.complete_pairs),
                fmt(s.speedup_median, ".3f", "×"),
                fmt(s.acceptance_length_mean),
                fmt(s.acceptance_length_p50),
                fmt(s.acceptance_length_p90),
                pct(s.acceptance_rate),
                pct(s.exact_match_rate),
                fmt(s.quality_delta_mean, "+.3f"),
                f"{s.baseline_errors}/{s.speculative_errors}",
            )
            for category, s in summary.items()
        ),
        note="speedup: median over complete pairs of baseline e2e ÷ speculative e2e",
    )


def positions(rates: Sequence[float | None]) -> str:
    return " ".join(fmt(r, ".2f") for r in rates) or "—"


def acceptance_table(figures: Mapping[str, AcceptanceFigures]) -> ReportTable:
    return ReportTable(
        title="Acceptance by category (speculative arm)",
        columns=("category", "pairs", "mean", "p50", "p90", "accept rate", "per position 1…k"),
        rows=tuple(
            (
                category,
                str(f.pairs),
                fmt(f.acceptance_length_mean),
                fmt(f.acceptance_length_p50),
                fmt(f.acceptance_length_p90),
                pct(f.acceptance_rate),
                positions(f.acceptance_rate_per_position),
            )
            for category, f in figures.items()
        ),
        note="acceptance length = 1 + accepted tokens ÷ verify steps (bonus token included); "
        "per position: accepted ÷ drafted at draft position i",
    )


def draft_length_table(recommendations: Mapping[str, DraftRecommendation]) -> ReportTable:
    def recommended(r: DraftRecommendation) -> str:
        if r.draft_length is None:
            return "—"
        return "off" if r.draft_length == 0 else str(r.draft_length)

    return ReportTable(
        title="Draft length by category (recommendation)",
        columns=(
            "category",
            "pairs",
            "k measured",
            "accept per position 1…k",
            "E[L] by k",
            "expected speedup by k",
            "recommended k",
            "why",
        ),
        rows=tuple(
            (
                category,
                str(r.pairs),
                str(r.measured_k),
                positions(r.acceptance_by_position),
                positions(r.expected_length),
                positions(r.expected_speedup),
                recommended(r),
                r.reason,
            )
            for category, r in recommendations.items()
        ),
        note="E[L](k) = expected tokens per verify step with drafts capped at k; expected "
        "speedup = E[L](k) ÷ the fitted cost of a verify step (baseline token times)",
    )


def consistency_table(figures: Mapping[str, ConsistencyFigures]) -> ReportTable:
    return ReportTable(
        title="Output consistency by category",
        columns=("category", "pairs", "scored", "exact match", "token edit sim", "quality Δ"),
        rows=tuple(
            (
                category,
                str(f.pairs),
                str(f.scored_pairs),
                pct(f.exact_match_rate),
                fmt(f.token_edit_similarity_mean),
                fmt(f.quality_delta_mean, "+.3f"),
            )
            for category, f in figures.items()
        ),
    )


def latency_table(latency: Mapping[Arm, Mapping[str, Percentiles]]) -> ReportTable:
    rows = []
    for arm in ARMS:
        for metric, label in LATENCY_METRICS:
            p = latency[arm][metric]
            rows.append((arm, label, fmt(p.p50, ".4f"), fmt(p.p95, ".4f"), fmt(p.p99, ".4f")))
    return ReportTable(
        title="Latency percentiles per arm (seconds)",
        columns=("arm", "metric", "p50", "p95", "p99"),
        rows=tuple(rows),
    )


def ladder_table(levels: Sequence[LevelFigures]) -> ReportTable:
    rows = []
    for level in levels:
        for arm in ARMS:
            f = level.arm(arm)
            rows.append(
                (
                    str(level.concurrency),
                    arm if arm == "baseline" else level.speculative_arm,
                    str(f.requests),
                    pct(f.error_rate),
                    fmt(f.aggregate_tokens_per_s, ".2f"),
                    fmt(f.per_request_tokens_per_s_p50, ".2f"),
                    fmt(f.request_rate_per_s, ".3f"),
                    "/".join(fmt(x, ".3f") for x in (f.ttft_s.p50, f.ttft_s.p95, f.ttft_s.p99)),
                    "/".join(fmt(x, ".4f") for x in (f.tpot_s.p50, f.tpot_s.p95, f.tpot_s.p99)),
                    "/".join(fmt(x, ".3f") for x in (f.e2e_s.p50, f.e2e_s.p95, f.e2e_s.p99)),
                )
            )
    return ReportTable(
        title="Concurrency ladder",
        columns=(
            "concurrency",
            "arm",
            "requests",
            "error rate",
            "agg tok/s",
            "per-req tok/s p50",
            "req/s",
            "TTFT p50/p95/p99 s",
            "TPOT p50/p95/p99 s",
            "e2e p50/p95/p99 s",
        ),
        rows=tuple(rows),
        note="each arm driven separately at the level; agg tok/s = output tokens ÷ the "
        "arm's wall-clock time at that level; warm-up excluded",
    )


def speedup_table(levels: Sequence[LevelFigures]) -> ReportTable:
    return ReportTable(
        title="Speedup by concurrency",
        columns=("concurrency", "throughput speedup", "median e2e speedup", "first arm"),
        rows=tuple(
            (
                str(level.concurrency),
                fmt(level.throughput_speedup, ".3f", "×"),
                fmt(level.e2e_speedup_median, ".3f", "×"),
                level.arm_order[0],
            )
            for level in levels
        ),
        note="throughput: speculative ÷ baseline aggregate tok/s; e2e: median over pairs "
        "of baseline e2e ÷ speculative e2e",
    )


def drift_table(drift: Mapping[str, DriftSeries]) -> ReportTable:
    return ReportTable(
        title="Acceptance drift",
        columns=(
            "category",
            "points",
            "reference n",
            "reference mean",
            "band",
            "recent mean",
            "outside band",
        ),
        rows=tuple(
            (
                category,
                str(len(s.lengths)),
                s.reference_source,
                str(s.reference_n),
                fmt(s.reference_mean),
                "—" if s.band is None else f"{fmt(s.band[0])}…{fmt(s.band[1])}",
                fmt(s.recent_mean),
                str(s.outside),
            )
            for category, s in drift.items()
        ),
        note="band: reference mean ± 2 sd; the reference is the drift gate's pinned one "
        "when stored, else the first 20 % of the window per category",
    )


def flips_table(audit: Audit) -> ReportTable:
    return ReportTable(
        title="Switch flips",
        columns=("at (UTC)", "target", "actor", "reason"),
        rows=tuple(
            (f.at.isoformat(timespec="seconds"), f.target, f.actor, f.reason) for f in audit.flips
        ),
    )


def gates_table(audit: Audit) -> ReportTable:
    by_gate: dict[str, list[GateMark]] = {}
    for mark in audit.gates:
        by_gate.setdefault(mark.gate, []).append(mark)
    states = sorted({m.state for m in audit.gates})
    return ReportTable(
        title="Gate decisions",
        columns=("gate", "decisions", *states, "last state"),
        rows=tuple(
            (
                gate,
                str(len(marks)),
                *(str(sum(m.state == s for m in marks)) for s in states),
                marks[-1].state,
            )
            for gate, marks in sorted(by_gate.items())
        ),
    )


def resources_table(resources: Any) -> ReportTable:
    rows: list[tuple[str, ...]] = []
    if isinstance(resources, dict):
        rss = resources.get("rss")
        if isinstance(rss, dict):
            for key in ("start_bytes", "end_bytes", "peak_sampled_bytes", "process_peak_bytes"):
                value = rss.get(key)
                rows.append(
                    (
                        f"RSS {key.removesuffix('_bytes').replace('_', ' ')}",
                        fmt(None if value is None else value / 2**20, ".1f", " MiB"),
                    )
                )
        else:
            rows.append(("RSS", str(rss)))
        gpu = resources.get("gpu")
        if isinstance(gpu, list):
            for g in gpu:
                rows.append(
                    (
                        f"GPU {g['index']} {g['name']} memory peak",
                        fmt(g["memory_peak_bytes"] / 2**20, ".0f", " MiB"),
                    )
                )
                rows.append(
                    (
                        f"GPU {g['index']} utilisation mean",
                        fmt(g["utilization_mean_percent"], ".1f", "%"),
                    )
                )
        else:
            reason = resources.get("gpu_reason")
            rows.append(("GPU", f"{gpu}" + (f" ({reason})" if reason else "")))
    else:
        rows.append(("resources", "not measured"))
    return ReportTable(
        title="Resources during the ladder", columns=("what", "value"), rows=tuple(rows)
    )


def probe_table(section: Mapping[str, Any], run_id: str) -> ReportTable:
    """A stored `canaryd probe`: each capability's state and reason on both arms."""
    rows = []
    for capability in section.get("capabilities", []):
        baseline, speculative = capability["baseline"], capability["speculative"]
        regressed = baseline["state"] == "pass" and speculative["state"] != "pass"
        rows.append(
            (
                capability["name"],
                f"{baseline['state']}: {baseline['reason']}",
                f"{speculative['state']}: {speculative['reason']}",
                "yes" if regressed else "",
            )
        )
    regressions = section.get("regressions") or []
    return ReportTable(
        title=f"Capability parity (probe run {run_id})",
        columns=(
            "capability",
            "baseline",
            f"speculative ({section.get('arm', '?')})",
            "regression",
        ),
        rows=tuple(rows),
        note=(
            f"regressions: {', '.join(regressions)}"
            if regressions
            else "parity: the speculative arm passes everything the baseline passes"
        ),
    )
