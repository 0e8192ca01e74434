"""`canaryd report`: the history (a window, or one run) as tables and pictures.

Everything is computed once, from stored pairs (and a bench run's stored `bench`
section), into figure objects (`figures`, `summary`, `drift`); the Markdown tables, the
HTML tables (`tables`) and the plots (`plots`) are all drawn from those same objects, so
a number in a picture, in the HTML and on stdout cannot disagree. Switch flips and gate
decisions come from the store's audit trail and gate record (`reads`); a history
report's cold and sustained figures are `sustained`'s; `build` puts a report together and
`html` renders it as one self-contained page.
"""

# Submodules load on first use (PEP 562), each name from the module its TYPE_CHECKING
# import names (engine.lazy): `canaryd status` and the CLI reach the light modules here
# (status, recommend) without paying for matplotlib.
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_exports

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

__getattr__, __dir__ = lazy_exports(globals())


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
