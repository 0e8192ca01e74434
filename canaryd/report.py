"""`canaryd report`: the history (a window, or one run) as tables and pictures.

Everything is computed once, from stored pairs (and a bench run's stored `bench`
section), into figure objects; the Markdown tables, the HTML tables and the plots are
all drawn from those same objects, so a number in a picture, in the HTML and on stdout
cannot disagree. Plots are matplotlib figures rendered with the Agg backend (no pyplot,
no display) and embedded as base64 PNG, so the HTML is one self-contained file.

Switch flips and gate decisions come from the store's audit trail and gate record; the
drift band is the pinned drift reference of a category when one is stored, else the
mean ± 2 sd of the first 20 % of the window.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from matplotlib.dates import date2num
from matplotlib.figure import Figure

from canaryd.bench import (
    AcceptanceFigures,
    ConsistencyFigures,
    LevelFigures,
    Percentiles,
    acceptance_figures,
    acceptance_lengths,
    bench_section,
    by_category,
    consistency_figures,
    ladder_figures,
    percentiles,
)
from canaryd.errors import CanarydError
from canaryd.records import ARMS, Arm, PairRecord
from canaryd.store import SqlStore, Store, StoredRun
from canaryd.summary import ALL, CategorySummary, summarise
from gates.drift import ReferenceStats
from gates.stats import mean

REFERENCE_FRACTION = 0.2  # the first 20 % of a category's window is its drift reference
BAND_SDS = 2.0
LATENCY_METRICS: tuple[tuple[str, str], ...] = (
    ("ttft_s", "TTFT"),
    ("tpot_s", "TPOT"),
    ("e2e_s", "end-to-end"),
)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """`90s`, `30m`, `24h`, `7d`, `2w` as a timedelta; ValueError otherwise."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration like 30m, 24h or 7d")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


# --- tables -----------------------------------------------------------------------------


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
        note="acceptance length = output tokens ÷ verify steps (bonus token included); "
        "per position: accepted ÷ drafted at draft position i",
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


def arm_latency(pairs: Sequence[PairRecord]) -> dict[Arm, dict[str, Percentiles]]:
    """TTFT, TPOT and e2e P50/P95/P99 of each arm's successful generations."""
    latency: dict[Arm, dict[str, Percentiles]] = {}
    for arm in ARMS:
        results = [r for p in pairs if (r := p.baseline if arm == "baseline" else p.speculative).ok]
        latency[arm] = {
            metric: percentiles(getattr(r, metric) for r in results)
            for metric, _ in LATENCY_METRICS
        }
    return latency


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
                    arm,
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


# --- drift ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DriftSeries:
    """One category's acceptance length over time against its reference band."""

    times: tuple[datetime, ...]
    lengths: tuple[float, ...]
    reference_n: int
    reference_mean: float | None
    reference_sd: float | None
    band: tuple[float, float] | None  # mean ± 2 sd of the reference
    reference_source: str  # "pinned" (the drift gate's stored reference) or "first 20 %"
    recent_mean: float | None  # mean of the last 20 % of the window
    outside: int  # points after the reference that lie outside the band


def _sd(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    centre = sum(values) / len(values)
    return math.sqrt(sum((v - centre) ** 2 for v in values) / (len(values) - 1))


def drift_series(pairs: Sequence[PairRecord], pinned: ReferenceStats | None = None) -> DriftSeries:
    """Against the `pinned` reference when given, else the first 20 % (at least 2) of the
    pairs in time order."""
    points = sorted(
        (p.started_at, length)
        for p in pairs
        if p.complete and (length := p.speculative.acceptance_length) is not None
    )
    lengths = [v for _, v in points]
    n_ref = max(2, math.ceil(REFERENCE_FRACTION * len(lengths))) if len(lengths) >= 2 else 0
    reference = lengths[:n_ref]
    ref_mean, ref_sd, ref_size = mean(reference), _sd(reference), len(reference)
    if pinned is not None:
        n_ref, ref_mean, ref_sd, ref_size = 0, pinned.mean, pinned.sd, pinned.n
    band = None
    if ref_mean is not None and ref_sd is not None:
        band = (ref_mean - BAND_SDS * ref_sd, ref_mean + BAND_SDS * ref_sd)
    recent = lengths[len(lengths) - max(1, math.ceil(REFERENCE_FRACTION * len(lengths))) :]
    outside = 0
    if band is not None:
        outside = sum(not band[0] <= v <= band[1] for v in lengths[n_ref:])
    return DriftSeries(
        times=tuple(t for t, _ in points),
        lengths=tuple(lengths),
        reference_n=ref_size,
        reference_mean=ref_mean,
        reference_sd=ref_sd,
        band=band,
        reference_source="first 20 %" if pinned is None else "pinned",
        recent_mean=mean(recent) if lengths else None,
        outside=outside,
    )


def drift_by_category(
    pairs: Sequence[PairRecord], pinned: Mapping[str, ReferenceStats] | None = None
) -> dict[str, DriftSeries]:
    categories = sorted({p.prompt.category for p in pairs})
    pinned = pinned or {}
    series = {
        c: drift_series([p for p in pairs if p.prompt.category == c], pinned.get(c))
        for c in categories
    }
    return {c: s for c, s in series.items() if s.lengths}


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


# --- audit: switch flips and gate decisions, when the database has them -----------------


@dataclass(frozen=True, slots=True)
class Flip:
    at: datetime
    target: str
    actor: str
    reason: str


@dataclass(frozen=True, slots=True)
class GateMark:
    at: datetime
    gate: str
    state: str


@dataclass(frozen=True, slots=True)
class Audit:
    flips: tuple[Flip, ...] = ()
    gates: tuple[GateMark, ...] = ()
    notes: tuple[str, ...] = ()


GATE_DECISIONS_READ = 100_000  # evaluations read back for a window; about a year at 5 min


def read_audit(store: SqlStore, since: datetime | None, until: datetime | None) -> Audit:
    """Switch transitions and gate decisions in [since, until) (a run: the run's span)."""
    flips = tuple(
        Flip(at=entry.at, target=entry.target, actor=entry.actor, reason=entry.reason)
        for entry in store.audit(since=since)
        if entry.kind == "transition" and _in(entry.at, since, until)
    )
    gates = tuple(
        GateMark(at=evaluation.at, gate=decision.name, state=decision.state.value)
        for evaluation in store.evaluations(GATE_DECISIONS_READ)
        if _in(evaluation.at, since, until)
        for decision in evaluation.decisions
    )
    notes = []
    if not gates:
        notes.append("no gate decisions recorded in this span: gate timeline skipped")
    return Audit(flips=flips, gates=gates, notes=tuple(notes))


def _in(moment: datetime, since: datetime | None, until: datetime | None) -> bool:
    return (since is None or moment >= since) and (until is None or moment < until)


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


# --- plots ------------------------------------------------------------------------------

ARM_COLOURS: dict[Arm, str] = {"baseline": "#4C72B0", "speculative": "#DD8452"}
STATE_COLOURS = {
    "PASS": "#55A868",
    "WARN": "#CCB974",
    "FAIL": "#C44E52",
    "INCONCLUSIVE": "#8172B2",
    "NODATA": "#999999",
}


@dataclass(frozen=True, slots=True)
class Plot:
    title: str
    png_base64: str

    def html(self) -> str:
        alt = html.escape(self.title)
        return (
            f'<figure><img alt="{alt}" src="data:image/png;base64,{self.png_base64}">'
            f"<figcaption>{alt}</figcaption></figure>"
        )


# matplotlib's dates module is not annotated; its date2num takes a datetime.
_date2num = cast(Callable[[datetime], float], date2num)


def _date(moment: datetime) -> float:
    return float(_date2num(moment))


def _dates(moments: Iterable[datetime]) -> list[float]:
    return [_date(m) for m in moments]


def _png(figure: Figure, title: str) -> Plot:
    figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return Plot(title=title, png_base64=base64.b64encode(buffer.getvalue()).decode("ascii"))


def plot_speedup_by_category(summary: Mapping[str, CategorySummary]) -> Plot:
    names = [c for c in summary if summary[c].speedup_median is not None]
    values = [summary[c].speedup_median or 0.0 for c in names]
    figure = Figure(figsize=(8, 3.6))
    axes = figure.add_subplot()
    axes.bar(names, values, color=["#333333" if c == ALL else "#4C72B0" for c in names])
    axes.axhline(1.0, color="#C44E52", linestyle="--", linewidth=1)
    axes.set_ylabel("median speedup (×)")
    axes.tick_params(axis="x", labelrotation=30)
    return _png(figure, "Speedup by category")


def plot_ladder(levels: Sequence[LevelFigures]) -> Plot:
    figure = Figure(figsize=(9, 3.6))
    left, right = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    xs = [level.concurrency for level in levels]
    for label, values in (
        ("throughput", [level.throughput_speedup for level in levels]),
        ("median e2e", [level.e2e_speedup_median for level in levels]),
    ):
        left.plot(xs, [math.nan if v is None else v for v in values], marker="o", label=label)
    left.axhline(1.0, color="#C44E52", linestyle="--", linewidth=1)
    left.set_xscale("log", base=2)
    left.set_xlabel("concurrency")
    left.set_ylabel("speedup (×)")
    left.legend()
    for arm in ARMS:
        values = [level.arm(arm).aggregate_tokens_per_s for level in levels]
        right.plot(
            xs,
            [math.nan if v is None else v for v in values],
            marker="o",
            color=ARM_COLOURS[arm],
            label=arm,
        )
    right.set_xscale("log", base=2)
    right.set_xlabel("concurrency")
    right.set_ylabel("aggregate output tok/s")
    right.legend()
    return _png(figure, "Speedup and throughput by concurrency")


def plot_acceptance_distributions(lengths: Mapping[str, Sequence[float]]) -> Plot:
    names = [c for c, values in lengths.items() if values]
    figure = Figure(figsize=(8, 3.6))
    axes = figure.add_subplot()
    axes.boxplot([list(lengths[c]) for c in names], whis=(10, 90), showmeans=True)
    axes.set_xticks(range(1, len(names) + 1), names, rotation=30)
    axes.set_ylabel("acceptance length (tokens / verify step)")
    return _png(figure, "Acceptance length distribution by category")


def plot_latency(latency: Mapping[Arm, Mapping[str, Percentiles]]) -> Plot:
    figure = Figure(figsize=(10, 3.4))
    width = 0.38
    for i, (metric, label) in enumerate(LATENCY_METRICS):
        axes = figure.add_subplot(1, len(LATENCY_METRICS), i + 1)
        for j, arm in enumerate(ARMS):
            p = latency[arm][metric]
            values = [math.nan if v is None else v for v in (p.p50, p.p95, p.p99)]
            axes.bar(
                [k + (j - 0.5) * width for k in range(3)],
                values,
                width,
                color=ARM_COLOURS[arm],
                label=arm,
            )
        axes.set_xticks(range(3), ["p50", "p95", "p99"])
        axes.set_title(f"{label} (s)")
        if i == 0:
            axes.legend()
    return _png(figure, "Latency percentiles per arm")


def plot_drift(drift: Mapping[str, DriftSeries], flips: Sequence[Flip]) -> Plot:
    rows = len(drift)
    figure = Figure(figsize=(9, 1.9 * rows + 0.8))
    for i, (category, series) in enumerate(drift.items()):
        axes = figure.add_subplot(rows, 1, i + 1)
        axes.plot(_dates(series.times), series.lengths, marker=".", linewidth=0.8, color="#4C72B0")
        if series.band is not None:
            axes.axhspan(*series.band, color="#55A868", alpha=0.2, label="reference ±2 sd")
        for flip in flips:
            axes.axvline(_date(flip.at), color="#C44E52", linestyle=":", linewidth=1.2)
        axes.xaxis_date()
        axes.set_ylabel(category, rotation=0, ha="right", fontsize=8)
        axes.tick_params(labelsize=7)
    return _png(figure, "Acceptance length over time (band: reference; dotted: switch flips)")


def plot_gates(audit: Audit) -> Plot:
    gates = sorted({m.gate for m in audit.gates})
    figure = Figure(figsize=(9, 0.5 * len(gates) + 1.5))
    axes = figure.add_subplot()
    for state, colour in STATE_COLOURS.items():
        marks = [m for m in audit.gates if m.state == state]
        if marks:
            axes.scatter(
                _dates(m.at for m in marks),
                [gates.index(m.gate) for m in marks],
                color=colour,
                label=state,
                s=14,
            )
    for flip in audit.flips:
        axes.axvline(_date(flip.at), color="#C44E52", linestyle=":", linewidth=1.2)
    axes.xaxis_date()
    axes.set_yticks(range(len(gates)), gates)
    axes.legend(fontsize=7, loc="upper left")
    return _png(figure, "Gate states over time")


# --- the report -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Report:
    title: str
    meta: tuple[str, ...]
    tables: tuple[ReportTable, ...]
    plots: tuple[Plot, ...]
    notes: tuple[str, ...] = ()
    # The figures the tables and plots were drawn from, for callers and tests.
    summary: dict[str, CategorySummary] = field(default_factory=dict)
    acceptance: dict[str, AcceptanceFigures] = field(default_factory=dict)
    consistency: dict[str, ConsistencyFigures] = field(default_factory=dict)
    latency: dict[Arm, dict[str, Percentiles]] = field(default_factory=dict)
    ladder: tuple[LevelFigures, ...] = ()
    drift: dict[str, DriftSeries] = field(default_factory=dict)

    def markdown(self) -> str:
        parts = [f"# {self.title}", "", *(f"- {line}" for line in self.meta), ""]
        parts += [f"> {note}" for note in self.notes]
        parts += ["", *(table.markdown() for table in self.tables)]
        return "\n".join(parts)

    def html(self) -> str:
        meta = "".join(f"<li>{html.escape(line)}</li>" for line in self.meta)
        notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in self.notes)
        plots = "".join(plot.html() for plot in self.plots)
        tables = "".join(table.html() for table in self.tables)
        return _PAGE.format(
            title=html.escape(self.title), meta=meta, notes=notes, plots=plots, tables=tables
        )


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
th {{ background: #f2f2f2; }}
figure {{ margin: 1em 0; }} img {{ max-width: 100%; }}
.note {{ color: #666; font-size: 0.85em; }}
</style></head>
<body><h1>{title}</h1><ul>{meta}</ul>{notes}
<h2>Plots</h2>{plots}
<h2>Tables</h2>{tables}
</body></html>
"""


def _find_run(store: Store, run_id: str) -> StoredRun:
    run = store.runs_by_id([run_id]).get(run_id)
    if run is not None:
        return run
    raise CanarydError(f"no run {run_id!r} in the database; `canaryd status` lists the latest")


def build_report(
    store: SqlStore,
    *,
    run_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    database: str = "",
) -> Report:
    """The report of one run (`run_id`) or of the pairs started in [since, until); flips
    and gate decisions of the same span (a run's: from its start to its end)."""
    run = _find_run(store, run_id) if run_id is not None else None
    if run is not None:
        pairs = store.pairs(run_id=run.info.run_id)
        title = f"canaryd report — {run.info.kind} run {run.info.run_id}"
        meta = [
            f"started {run.info.started_at.isoformat(timespec='seconds')}, finished "
            + ("—" if run.finished_at is None else run.finished_at.isoformat(timespec="seconds")),
            f"baseline: {_identity(run.info.baseline_identity)}",
            f"speculative: {_identity(run.info.speculative_identity)}",
            f"config hash {run.info.config_hash}",
        ]
    else:
        pairs = store.pairs(since=since, until=until)
        title = "canaryd report — history"
        meta = [f"pairs started from {_iso(since)} to {_iso(until)}"]
    meta += [f"{len(pairs)} pairs", *([f"database {database}"] if database else [])]
    if run is not None:
        audit = read_audit(store, run.info.started_at, run.finished_at)
    else:
        audit = read_audit(store, since, until)
    notes = list(audit.notes)

    summary = summarise(pairs)
    acceptance = by_category(pairs, acceptance_figures)
    consistency = by_category(pairs, consistency_figures)
    latency = arm_latency(pairs)
    drift = drift_by_category(pairs, store.drift_references())
    section = bench_section(run) if run is not None else None
    ladder = ladder_figures(section, pairs) if section is not None else []

    tables = [category_table(summary)]
    if ladder:
        tables += [speedup_table(ladder), ladder_table(ladder)]
    tables += [
        acceptance_table(acceptance),
        consistency_table(consistency),
        latency_table(latency),
        drift_table(drift),
    ]
    if audit.flips:
        tables.append(flips_table(audit))
    if audit.gates:
        tables.append(gates_table(audit))
    if section is not None:
        tables.append(resources_table(section.get("resources")))

    plots: list[Plot] = []
    if not pairs:
        notes.append("no pairs in this selection: nothing to plot")
    else:
        if any(s.speedup_median is not None for s in summary.values()):
            plots.append(plot_speedup_by_category(summary))
        if ladder:
            plots.append(plot_ladder(ladder))
        lengths = {
            c: acceptance_lengths([p for p in pairs if p.prompt.category == c])
            for c in sorted({p.prompt.category for p in pairs})
        }
        if any(lengths.values()):
            plots.append(plot_acceptance_distributions(lengths))
        else:
            notes.append("the speculative arm reported no acceptance: no distribution plot")
        plots.append(plot_latency(latency))
        if drift:
            plots.append(plot_drift(drift, audit.flips))
    if audit.gates:
        plots.append(plot_gates(audit))
    return Report(
        title=title,
        meta=tuple(meta),
        tables=tuple(tables),
        plots=tuple(plots),
        notes=tuple(notes),
        summary=summary,
        acceptance=acceptance,
        consistency=consistency,
        latency=latency,
        ladder=tuple(ladder),
        drift=drift,
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


def bench_markdown(run: StoredRun, pairs: Sequence[PairRecord]) -> str:
    """What `canaryd bench` prints: the report's tables for the stored bench run."""
    section = bench_section(run)
    ladder = ladder_figures(section, pairs) if section is not None else []
    tables = [
        speedup_table(ladder),
        ladder_table(ladder),
        acceptance_table(by_category(pairs, acceptance_figures)),
        consistency_table(by_category(pairs, consistency_figures)),
        resources_table(None if section is None else section.get("resources")),
    ]
    return "\n".join(table.markdown() for table in tables)


def _identity(identity: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in identity.items())


def _iso(moment: datetime | None) -> str:
    return "—" if moment is None else moment.isoformat(timespec="seconds")
