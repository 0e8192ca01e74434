"""The report as a document: its title, meta lines, notes, tables and plots, rendered as
Markdown (the tables only) or as one self-contained HTML page.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from canaryd.report.drift import DriftSeries
from canaryd.report.figures import AcceptanceFigures, ConsistencyFigures, LevelFigures, Percentiles
from canaryd.report.plots import Plot
from canaryd.report.recommend import DraftRecommendation
from canaryd.report.summary import CategorySummary
from canaryd.report.sustained import SustainedFigures
from canaryd.report.tables import ReportTable
from gates.records import Arm


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
    draft_lengths: dict[str, DraftRecommendation] = field(default_factory=dict)
    sustained: SustainedFigures | None = None  # history reports (`--since`) only

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
