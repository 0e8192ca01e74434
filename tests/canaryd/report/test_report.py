"""`canaryd report`: one self-contained HTML file whose plots are embedded and whose
numbers are those the database gives, plus the same tables as Markdown on stdout."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.bench.run import bench_results
from canaryd.cli.app import app
from canaryd.pairs.runner import PairRunner
from canaryd.pairs.suites import load_default_suites
from canaryd.report import (
    arm_level_figures,
    bench_section,
    build_report,
    category_table,
    drift_series,
    fmt,
    parse_duration,
    summarise,
)
from canaryd.report.recommend import recommend_draft_lengths
from canaryd.store import SqlStore
from canaryd.store.rollup import facts_from_record
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from engine.types import GenerationResult, Message, SpeculativeStats
from gates.core import GateDecision, GateMode, GateState
from gates.pairs import testing
from gates.pairs.drift import ReferenceStats
from gates.records import PairRecord, Prompt, RunInfo
from gates.stats.descriptive import quantile
from gates.switch.policy import Control, Evaluation, SwitchMode, SwitchOutcome, Transition

FAKE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
"""
BENCH_PLOTS = (
    "Speedup by category",
    "Speedup and throughput by concurrency",
    "Acceptance length distribution by category",
    "Latency percentiles per arm",
    "Acceptance length over time",
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def bench_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A fake-engine bench stored in a fresh database; returns (directory, run id)."""
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("CANARYD_CONFIG", raising=False)
    monkeypatch.delenv("CANARYD_STORAGE__URL", raising=False)
    (tmp_path / "canaryd.toml").write_text(FAKE_ARMS)
    result = CliRunner().invoke(
        app,
        ["bench", "-c", str(tmp_path / "canaryd.toml"), "--concurrency", "1,2",
         "--requests", "9", "--warmup", "1", "--out", str(tmp_path / "out"), "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return tmp_path, json.loads(result.stdout)["run_id"]


def database(directory: Path) -> str:
    return f"sqlite:///{directory / 'data' / 'canaryd.db'}"


def embedded_images(page: str) -> dict[str, bytes]:
    """alt text → decoded PNG bytes of every <img> with a data: URI."""
    found = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    return {alt: base64.b64decode(data) for alt, data in found}


class TestParseDuration:
    def test_units(self) -> None:
        """Seconds, minutes, hours, days and weeks parse; anything else is refused."""
        assert parse_duration("90s") == timedelta(seconds=90)
        assert parse_duration("30m") == timedelta(minutes=30)
        assert parse_duration("24h") == timedelta(hours=24)
        assert parse_duration("7d") == timedelta(days=7)
        assert parse_duration("2w") == timedelta(weeks=2)
        for bad in ("", "24", "h", "0h", "-1h", "3y"):
            with pytest.raises(ValueError, match="not a duration"):
                parse_duration(bad)


def spec_pair(n: int, verify_steps: int, minute: int) -> PairRecord:
    ok = GenerationResult(
        text="a b c d e f", token_ids=(1, 2, 3, 4, 5, 6), finish_reason="length",
        prompt_tokens=3, output_tokens=6, ttft_s=0.1, tpot_s=0.1, e2e_s=0.6,
    )  # fmt: skip
    stats = SpeculativeStats(
        verify_steps=verify_steps, draft_tokens=4 * verify_steps,
        accepted_tokens=6 - verify_steps, accepted_per_position=(6 - verify_steps,),
    )  # fmt: skip
    return testing.record(
        n,
        baseline=ok,
        speculative=replace(ok, speculative=stats),
        scored=False,
        prompt=Prompt(id=f"q{n}", category="qa", messages=(Message("user", "x"),), max_tokens=6),
        run_id="r",
        started_at=datetime(2026, 1, 1, 0, minute, tzinfo=UTC),
    )


class TestDriftSeries:
    def test_reference_is_first_fifth_by_time(self) -> None:
        """Of 10 points the first 2 (by time) are the reference; the band is mean ± 2 sd."""
        steps = [3, 2, 2, 2, 2, 2, 2, 1, 6, 6]  # acceptance lengths 2, 3, 3, …, 6, 1, 1
        pairs = [spec_pair(i, s, minute=i) for i, s in enumerate(steps)]
        series = drift_series(list(reversed(pairs)))
        assert series.lengths[:2] == (2.0, 3.0)
        assert series.reference_n == 2
        assert series.reference_mean == pytest.approx(2.5)
        assert series.reference_sd == pytest.approx(0.5**0.5)
        assert series.band == pytest.approx((2.5 - 2 * 0.5**0.5, 2.5 + 2 * 0.5**0.5))
        assert series.outside == 3  # 6.0, 1.0, 1.0 lie outside 1.09…3.91
        assert series.recent_mean == pytest.approx(1.0)
        assert series.reference_source == "first 20 %"

    def test_pinned_reference_wins(self) -> None:
        """A stored drift reference replaces the window's own first 20 %."""
        pairs = [spec_pair(i, 2, minute=i) for i in range(5)]
        series = drift_series(pairs, ReferenceStats(mean=4.0, sd=0.25, n=50))
        assert series.band == pytest.approx((3.5, 4.5))
        assert (series.reference_n, series.reference_source) == (50, "pinned")
        assert series.outside == 5


class TestReportOnBenchRun:
    def test_html_embeds_every_plot_as_png(self, bench_env: tuple[Path, str]) -> None:
        """`--run` writes one HTML file with each plot as a decodable base64 PNG."""
        directory, run_id = bench_env
        out = directory / "report.html"
        result = CliRunner().invoke(
            app, ["report", "--run", run_id, "--out", str(out), "--url", database(directory)]
        )
        assert result.exit_code == 0, result.output
        images = embedded_images(out.read_text())
        for title in BENCH_PLOTS:
            matching = [alt for alt in images if alt.startswith(title)]
            assert matching, f"no image for {title!r}"
            assert images[matching[0]].startswith(PNG_MAGIC)
        page = re.sub(r"base64,[A-Za-z0-9+/=]+", "base64,", out.read_text())
        assert not re.search(r"(src|href)=\"(?!data:)", page), "self-contained: no external refs"
        assert "### Concurrency ladder" in result.stdout
        assert f"wrote {out} ({len(images)} plots)" in result.stdout

    def test_numbers_equal_those_from_the_database(self, bench_env: tuple[Path, str]) -> None:
        """The report's tables (HTML and Markdown) show the figures recomputed from the
        stored pairs, and its ladder equals results.json."""
        directory, run_id = bench_env
        store = SqlStore.open(database(directory))
        try:
            pairs = store.pairs(run_id=run_id)
            run = next(r for r in store.runs() if r.info.run_id == run_id)
            report = build_report(store, run_id=run_id)
        finally:
            store.close()
        page, markdown = report.html(), report.markdown()
        # Per category, straight from the stored records.
        for category in {p.prompt.category for p in pairs}:
            mine = [p for p in pairs if p.prompt.category == category and p.complete]
            speedup = quantile([p.baseline.e2e_s / p.speculative.e2e_s for p in mine], 0.5)
            lengths = [p.speculative.output_tokens / p.speculative.speculative.verify_steps
                       for p in mine]  # fmt: skip
            row = next(r for r in category_table(summarise(pairs)).rows if r[0] == category)
            assert row[3] == fmt(speedup, ".3f", "×")
            assert row[4] == fmt(sum(lengths) / len(lengths))
            assert row[6] == fmt(quantile(lengths, 0.9))
            for cell in (row[3], row[4], row[6]):
                assert f"<td>{cell}</td>" in page
                assert f"| {cell} |" in markdown
        # The ladder, from the stored pairs of each level and its stored wall-clock time.
        section = bench_section(run)
        assert section is not None
        by_id = {p.pair_id: p for p in pairs}
        for stored_level, level in zip(section["levels"], report.ladder, strict=True):
            level_pairs = [by_id[i] for i in stored_level["pair_ids"]]
            wall = stored_level["arms"]["speculative"]["wall_s"]
            tokens = sum(p.speculative.output_tokens for p in level_pairs if p.speculative.ok)
            assert level.speculative.aggregate_tokens_per_s == pytest.approx(tokens / wall)
            assert level.baseline == arm_level_figures(
                [p.baseline for p in level_pairs], stored_level["arms"]["baseline"]["wall_s"]
            )
            assert f"<td>{fmt(level.throughput_speedup, '.3f', '×')}</td>" in page
        results = json.loads((directory / "out" / "results.json").read_text())
        assert results["ladder"] == json.loads(json.dumps([asdict(x) for x in report.ladder]))
        assert results == json.loads(json.dumps(bench_results(run, pairs)))

    def test_unknown_run_is_one_line(self, bench_env: tuple[Path, str]) -> None:
        """An unknown run id is one line on stderr and exit 2; no file is written."""
        directory, _ = bench_env
        out = directory / "none.html"
        result = CliRunner().invoke(
            app, ["report", "--run", "nope", "--out", str(out), "--url", database(directory)]
        )
        assert result.exit_code == 2
        assert "no run 'nope'" in result.stderr
        assert not out.exists()


class TestReportWindow:
    def test_flips_and_gate_timeline_are_drawn(self, bench_env: tuple[Path, str]) -> None:
        """With `--since`, switch flips are listed and gate states get their own plot."""
        directory, _ = bench_env
        now = datetime.now(UTC)
        decision = GateDecision(
            name="speedup", state=GateState.FAIL, mode=GateMode.ENFORCE, critical=True,
            evaluated_at=now,
        )  # fmt: skip
        store = SqlStore.open(database(directory))
        try:
            store.save_evaluation(Evaluation(at=now, decisions=(decision,)))
            store.change_switch(
                lambda state, _history: SwitchOutcome(
                    state=replace(state, mode=SwitchMode.ROLLED_BACK, generation=1, since=now),
                    transitions=(
                        Transition(
                            at=now,
                            generation=1,
                            previous=SwitchMode.AUTO,
                            target=SwitchMode.ROLLED_BACK,
                            control=Control.GATES,
                            actor="gate:speedup",
                            reason="slower than baseline",
                        ),
                    ),
                ),
                now=now,
                history=1,
            )
        finally:
            store.close()
        out = directory / "window.html"
        result = CliRunner().invoke(
            app, ["report", "--since", "1h", "--out", str(out), "--url", database(directory)]
        )
        assert result.exit_code == 0, result.output
        assert "### Switch flips" in result.stdout
        assert "slower than baseline" in result.stdout
        assert "| speedup | 1 | 1 | FAIL |" in result.stdout
        images = embedded_images(out.read_text())
        assert any(alt.startswith("Gate states over time") for alt in images)
        assert any(alt.startswith("Speedup by category") for alt in images)

    def test_empty_window_still_writes_a_page(self, tmp_path: Path) -> None:
        """A window without pairs writes a page that says so, rather than failing."""
        url = f"sqlite:///{tmp_path / 'empty.db'}"
        SqlStore.open(url, create=True).close()
        out = tmp_path / "empty.html"
        result = CliRunner().invoke(app, ["report", "--out", str(out), "--url", url])
        assert result.exit_code == 0, result.output
        assert "no pairs in this selection" in out.read_text()
        assert "0 pairs" in result.stdout

    def test_since_and_run_together_are_refused(self, tmp_path: Path) -> None:
        """--since and --run select different things; giving both is an error."""
        result = CliRunner().invoke(app, ["report", "--since", "1h", "--run", "x"])
        assert result.exit_code == 2
        assert "give --since or --run, not both" in result.stderr


class TestDraftLengthRecommendation:
    def test_the_report_recommends_a_draft_length_per_category(self, tmp_path: Path) -> None:
        """From stored fake pairs (math accepts far less), `canaryd report` prints the
        draft-length table: a length for the healthy categories, speculation off for
        math, each with its evidence, equal to the recommendation from the stored pairs."""
        url = f"sqlite:///{tmp_path / 'canaryd.db'}"
        now = datetime.now(UTC)
        speculative = FakeEngineConfig(
            speculative=True, num_draft_tokens=6, acceptance_rate_by_category={"math": 0.1}
        )
        runner = PairRunner(FakeEngine(FakeEngineConfig()), FakeEngine(speculative), run_id="r")
        prompts = [p for s in load_default_suites() for p in s.prompts]
        chosen = [p for p in prompts if p.category in ("math", "code", "qa")]
        with SqlStore.open(url, create=True) as store:
            store.create_run(RunInfo("r", "daemon", now, {}, "h", {}, {}, {}))
            for index in range(240):
                record = runner.run_pair(chosen[index % len(chosen)])
                store.save_pair(replace(record, started_at=now - timedelta(seconds=index + 1)))
            pairs = store.pairs(since=now - timedelta(hours=1), until=now)
            report = build_report(store, since=now - timedelta(hours=1), until=now)
        assert report.draft_lengths == recommend_draft_lengths(
            [facts_from_record(p) for p in pairs]
        )
        assert report.draft_lengths["math"].draft_length == 0
        assert report.draft_lengths["code"].draft_length in range(1, 7)
        result = CliRunner().invoke(
            app, ["report", "--since", "1h", "--out", str(tmp_path / "r.html"), "--url", url]
        )
        assert result.exit_code == 0, result.output
        table = result.stdout.split("### Draft length by category (recommendation)")[1]
        table = table.split("###")[0]
        rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("|")}
        assert "| off | speculation off (k=0)" in rows["| math"]
        code = report.draft_lengths["code"]
        assert f"| {code.draft_length} | draft length {code.draft_length}" in rows["| code"]
