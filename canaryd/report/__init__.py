"""`canaryd report`: the history (a window, or one run) as tables and pictures.

Everything is computed once, from stored pairs (and a bench run's stored `bench`
section), into figure objects (`figures`, `summary`, `drift`); the Markdown tables, the
HTML tables (`tables`) and the plots (`plots`) are all drawn from those same objects, so
a number in a picture, in the HTML and on stdout cannot disagree. Switch flips and gate
decisions come from the store's audit trail and gate record (`reads`); a history
report's cold and sustained figures are `sustained`'s; `build` puts a report together and
`html` renders it as one self-contained page.
"""

# Submodules load on first use (PEP 562): `canaryd status` and the CLI reach the light
# modules here (status, recommend) without paying for matplotlib.
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from canaryd.durations import parse_duration
    from canaryd.report.build import bench_markdown, build_report
    from canaryd.report.drift import DriftSeries, drift_by_category, drift_series
    from canaryd.report.figures import (
        AcceptanceFigures,
        ArmLevelFigures,
        ArmWindow,
        ConsistencyFigures,
        LevelFigures,
        LevelRecord,
        Percentiles,
        acceptance_figures,
        acceptance_lengths,
        arm_latency,
        arm_level_figures,
        bench_section,
        by_category,
        consistency_figures,
        ladder_figures,
        level_figures,
        percentiles,
    )
    from canaryd.report.html import Report
    from canaryd.report.plots import Plot
    from canaryd.report.reads import Audit, Flip, GateMark, find_run, read_audit
    from canaryd.report.summary import ALL, CategorySummary, summarise, summarise_group
    from canaryd.report.tables import ReportTable, category_table, fmt, pct

_HOMES = {
    "ALL": "canaryd.report.summary",
    "AcceptanceFigures": "canaryd.report.figures",
    "ArmLevelFigures": "canaryd.report.figures",
    "ArmWindow": "canaryd.report.figures",
    "Audit": "canaryd.report.reads",
    "CategorySummary": "canaryd.report.summary",
    "ConsistencyFigures": "canaryd.report.figures",
    "DriftSeries": "canaryd.report.drift",
    "Flip": "canaryd.report.reads",
    "GateMark": "canaryd.report.reads",
    "LevelFigures": "canaryd.report.figures",
    "LevelRecord": "canaryd.report.figures",
    "Percentiles": "canaryd.report.figures",
    "Plot": "canaryd.report.plots",
    "Report": "canaryd.report.html",
    "ReportTable": "canaryd.report.tables",
    "acceptance_figures": "canaryd.report.figures",
    "acceptance_lengths": "canaryd.report.figures",
    "arm_latency": "canaryd.report.figures",
    "arm_level_figures": "canaryd.report.figures",
    "bench_markdown": "canaryd.report.build",
    "bench_section": "canaryd.report.figures",
    "build_report": "canaryd.report.build",
    "by_category": "canaryd.report.figures",
    "category_table": "canaryd.report.tables",
    "consistency_figures": "canaryd.report.figures",
    "drift_by_category": "canaryd.report.drift",
    "drift_series": "canaryd.report.drift",
    "find_run": "canaryd.report.reads",
    "fmt": "canaryd.report.tables",
    "ladder_figures": "canaryd.report.figures",
    "level_figures": "canaryd.report.figures",
    "parse_duration": "canaryd.durations",
    "pct": "canaryd.report.tables",
    "percentiles": "canaryd.report.figures",
    "read_audit": "canaryd.report.reads",
    "summarise": "canaryd.report.summary",
    "summarise_group": "canaryd.report.summary",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


__all__ = [
    "ALL",
    "AcceptanceFigures",
    "ArmLevelFigures",
    "ArmWindow",
    "Audit",
    "CategorySummary",
    "ConsistencyFigures",
    "DriftSeries",
    "Flip",
    "GateMark",
    "LevelFigures",
    "LevelRecord",
    "Percentiles",
    "Plot",
    "Report",
    "ReportTable",
    "acceptance_figures",
    "acceptance_lengths",
    "arm_latency",
    "arm_level_figures",
    "bench_markdown",
    "bench_section",
    "build_report",
    "by_category",
    "category_table",
    "consistency_figures",
    "drift_by_category",
    "drift_series",
    "find_run",
    "fmt",
    "ladder_figures",
    "level_figures",
    "parse_duration",
    "pct",
    "percentiles",
    "read_audit",
    "summarise",
    "summarise_group",
]
