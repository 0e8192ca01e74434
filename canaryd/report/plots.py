"""The report's plots: matplotlib figures drawn with the Agg backend (no pyplot, no
display) from the same figure objects as the tables, each embedded as a base64 PNG so the
HTML report is one self-contained file. matplotlib comes with the `report` extra and is
imported when the first plot is drawn: without it the report's tables are whole and
`plots_missing` says what to install for the plots.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, cast

from canaryd.errors import MissingReportExtraError
from canaryd.report.drift import DriftSeries
from canaryd.report.figures import LATENCY_METRICS, LevelFigures, Percentiles
from canaryd.report.reads import Audit, Flip
from canaryd.report.summary import ALL, CategorySummary
from gates.records import ARMS, Arm

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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


def plots_missing() -> str | None:
    """Why the report has no plots on this install (a note naming the extra), else None."""
    try:
        import matplotlib.figure  # noqa: F401 - the plots are drawn next
    except ImportError:
        return f"plots left out: {MissingReportExtraError('matplotlib')}"
    return None


def new_figure(*, figsize: tuple[float, float]) -> Figure:
    """A matplotlib figure (Agg, no pyplot); `MissingReportExtraError` without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingReportExtraError("matplotlib") from exc
    return Figure(figsize=figsize)


def _date(moment: datetime) -> float:
    from matplotlib.dates import date2num

    # matplotlib's dates module is not annotated; its date2num takes a datetime.
    return float(cast(Callable[[datetime], float], date2num)(moment))


def _dates(moments: Iterable[datetime]) -> list[float]:
    return [_date(m) for m in moments]


def as_plot(figure: Figure, title: str) -> Plot:
    """`figure` titled `title`, laid out and rendered as a PNG `Plot`."""
    figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return Plot(title=title, png_base64=base64.b64encode(buffer.getvalue()).decode("ascii"))


def plot_speedup_by_category(summary: Mapping[str, CategorySummary]) -> Plot:
    names = [c for c in summary if summary[c].speedup_median is not None]
    values = [summary[c].speedup_median or 0.0 for c in names]
    figure = new_figure(figsize=(8, 3.6))
    axes = figure.add_subplot()
    axes.bar(names, values, color=["#333333" if c == ALL else "#4C72B0" for c in names])
    axes.axhline(1.0, color="#C44E52", linestyle="--", linewidth=1)
    axes.set_ylabel("median speedup (×)")
    axes.tick_params(axis="x", labelrotation=30)
    return as_plot(figure, "Speedup by category")


def plot_ladder(levels: Sequence[LevelFigures]) -> Plot:
    figure = new_figure(figsize=(9, 3.6))
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
    return as_plot(figure, "Speedup and throughput by concurrency")


def plot_acceptance_distributions(lengths: Mapping[str, Sequence[float]]) -> Plot:
    names = [c for c, values in lengths.items() if values]
    figure = new_figure(figsize=(8, 3.6))
    axes = figure.add_subplot()
    axes.boxplot([list(lengths[c]) for c in names], whis=(10, 90), showmeans=True)
    axes.set_xticks(range(1, len(names) + 1), names, rotation=30)
    axes.set_ylabel("acceptance length (tokens / verify step)")
    return as_plot(figure, "Acceptance length distribution by category")


def plot_latency(latency: Mapping[Arm, Mapping[str, Percentiles]]) -> Plot:
    figure = new_figure(figsize=(10, 3.4))
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
    return as_plot(figure, "Latency percentiles per arm")


def plot_drift(drift: Mapping[str, DriftSeries], flips: Sequence[Flip]) -> Plot:
    rows = len(drift)
    figure = new_figure(figsize=(9, 1.9 * rows + 0.8))
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
    return as_plot(figure, "Acceptance length over time (band: reference; dotted: switch flips)")


def plot_gates(audit: Audit) -> Plot:
    gates = sorted({m.gate for m in audit.gates})
    figure = new_figure(figsize=(9, 0.5 * len(gates) + 1.5))
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
    return as_plot(figure, "Gate states over time")
