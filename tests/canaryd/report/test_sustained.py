"""Sustained figures of a history report: cold pairs after each daemon start apart from the
rest, per-arm serving figures, slices over time, and `canaryd report --since` showing them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.report import build_report
from canaryd.report.sustained import slice_length, sustained_figures, sustained_tables
from canaryd.store import SqlStore
from engine.timing import inter_token_latency
from engine.types import SpeculativeStats
from gates.pairs import testing
from gates.records import PairRecord, RunInfo

SINCE = datetime(2025, 12, 1, tzinfo=UTC)
UNTIL = SINCE + timedelta(hours=6)


def pair(
    index: int, started_at: datetime, *, run_id: str = "r1", spec_e2e: float = 0.5
) -> PairRecord:
    """A pair whose speculative arm took `spec_e2e` s (baseline 1 s) for 40 tokens in 20
    verify steps, 15 of which kept a draft token, in bursts 20 ms apart."""
    speculative = replace(
        testing.result(spec_e2e, verify_steps=20),
        speculative=SpeculativeStats(20, 40, 20, (15, 5), (20, 20)),
        itl=inter_token_latency([(0.1 + i * 0.02, 2) for i in range(20)]),
    )
    return testing.record(index, speculative=speculative, started_at=started_at, run_id=run_id)


class TestSustainedFigures:
    def test_first_pairs_of_a_start_in_the_span_are_cold(self) -> None:
        """The first two pairs of a run that started inside the span are cold; a run that
        started before it has no cold pairs in it; everything else is sustained."""
        starts = {"r1": SINCE - timedelta(days=1), "r2": SINCE + timedelta(hours=2)}
        pairs = [
            pair(0, SINCE + timedelta(minutes=5), run_id="r1", spec_e2e=0.5),
            pair(1, SINCE + timedelta(minutes=10), run_id="r1", spec_e2e=0.5),
            pair(2, SINCE + timedelta(hours=2, minutes=1), run_id="r2", spec_e2e=2.0),
            pair(3, SINCE + timedelta(hours=2, minutes=2), run_id="r2", spec_e2e=2.0),
            pair(4, SINCE + timedelta(hours=2, minutes=3), run_id="r2", spec_e2e=0.25),
        ]
        figures = sustained_figures(pairs, starts, SINCE, UNTIL)
        assert figures.cold.pairs == 2 and figures.sustained.pairs == 3
        assert figures.cold.speculative.e2e_s.p50 == pytest.approx(2.0)
        assert figures.sustained.speculative.e2e_s.p50 == pytest.approx(0.5)
        assert figures.sustained.baseline.tokens_per_s_p50 == pytest.approx(40.0)
        assert figures.sustained.fallback_rate == pytest.approx(5 / 20)
        assert figures.sustained.acceptance_length_mean == pytest.approx(2.0)
        assert figures.sustained.speculative.itl_p99_s.p50 == pytest.approx(0.02)

    def test_slices_cover_the_span_and_report_their_medians(self) -> None:
        """Six hours are cut into hourly slices; each lists its pairs and speedup median,
        and the spread names the slowest and fastest slice."""
        pairs = [
            pair(i, SINCE + timedelta(hours=h, minutes=i), spec_e2e=0.5 if h < 3 else 0.8)
            for h in range(6)
            for i in range(10)
        ]
        figures = sustained_figures(pairs, {}, SINCE, UNTIL)
        assert figures.slice_length == timedelta(hours=1)
        assert [s.pairs for s in figures.slices] == [10] * 6
        assert [s.start for s in figures.slices] == [SINCE + timedelta(hours=h) for h in range(6)]
        assert figures.slices[0].speedup_p50 == pytest.approx(2.0)
        assert figures.slices[5].speedup_p50 == pytest.approx(1.25)
        assert figures.steadiness() == (
            "over 6 slices of 1 h: speedup median 1.25× to 2.00×, "
            "speculative ITL P99 20.0 to 20.0 ms"
        )

    def test_slice_length_keeps_at_most_48_slices(self) -> None:
        """An hour up to 48 hours, six hours up to 12 days, then a day, then a week."""
        assert slice_length(SINCE, SINCE + timedelta(hours=48)) == timedelta(hours=1)
        assert slice_length(SINCE, SINCE + timedelta(days=7)) == timedelta(hours=6)
        assert slice_length(SINCE, SINCE + timedelta(days=30)) == timedelta(days=1)
        assert slice_length(SINCE, SINCE + timedelta(days=400)) == timedelta(weeks=1)

    def test_tables_show_cold_and_sustained_rows(self) -> None:
        """The per-arm table has a cold and a sustained row per arm, in milliseconds."""
        pairs = [pair(i, SINCE + timedelta(minutes=i)) for i in range(4)]
        figures = sustained_figures(pairs, {"r1": SINCE}, SINCE, UNTIL)
        per_arm, over_time = sustained_tables(figures)
        assert [row[:3] for row in per_arm.rows] == [
            ("cold", "baseline", "2"),
            ("cold", "speculative", "2"),
            ("sustained", "baseline", "2"),
            ("sustained", "speculative", "2"),
        ]
        assert per_arm.rows[3][7] == "500.0/500.0/500.0"  # e2e ms
        assert per_arm.rows[3][9] == "25.0%"  # fallback
        assert over_time.rows[0][1] == "2"


class TestReportSince:
    def test_report_since_prints_the_sustained_tables(self, tmp_path: Path) -> None:
        """`canaryd report --since 6h` reads the daemon's history and prints the cold and
        sustained figures with the slices over time; `build_report` keeps the figures."""
        url = f"sqlite:///{tmp_path / 'canaryd.db'}"
        now = datetime.now(UTC)
        start = now - timedelta(hours=3)
        with SqlStore.open(url, create=True) as store:
            store.create_run(
                RunInfo("r1", "daemon", start, {}, "c" * 64, {"kind": "fake"}, {"kind": "fake"})
            )
            for i in range(12):
                store.save_pair(pair(i, start + timedelta(minutes=10 * i), run_id="r1"))
            report = build_report(store, since=now - timedelta(hours=6), until=now)
        assert report.sustained is not None
        assert report.sustained.cold.pairs == 2 and report.sustained.sustained.pairs == 10
        result = CliRunner().invoke(
            app, ["report", "--since", "6h", "--out", str(tmp_path / "r.html"), "--url", url]
        )
        assert result.exit_code == 0, result.output
        assert "### Cold and sustained figures per arm (ms: p50/p95/p99)" in result.stdout
        assert "### Sustained figures over time (slices of 1 h)" in result.stdout
        assert "| sustained | speculative | 10 | 0.0% |" in result.stdout
