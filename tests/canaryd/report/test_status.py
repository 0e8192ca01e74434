"""`canaryd status`: histogram quantiles, window figures, the report from a store, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.report.recommend import recommend_draft_lengths
from canaryd.report.status import build_status, window_status
from canaryd.store import SqlStore
from canaryd.store.rollup import (
    LATENCY_BOUNDS_S,
    bucket_index,
    facts_from_record,
    histogram,
    histogram_quantile,
    rollups_by_hour,
)
from engine.timing import inter_token_latency
from engine.types import ErrorKind, GenerationResult, Message, SpeculativeStats
from gates.pairs import testing
from gates.records import PairRecord, Prompt, RunInfo

NOW = datetime(2025, 12, 20, 15, 30, tzinfo=UTC)
runner = CliRunner()


def result(
    e2e_s: float, output_tokens: int = 12, verify_steps: int | None = None
) -> GenerationResult:
    stats = None
    if verify_steps is not None:
        accepted = output_tokens - verify_steps
        stats = SpeculativeStats(
            verify_steps=verify_steps,
            draft_tokens=4 * verify_steps,
            accepted_tokens=accepted,
            # every verify step kept its first draft token: no fallback
            accepted_per_position=(min(accepted, verify_steps),),
            drafted_per_position=(4 * verify_steps,),
        )
    return GenerationResult(
        text="ok",
        token_ids=tuple(range(output_tokens)),
        finish_reason="stop",
        prompt_tokens=5,
        output_tokens=output_tokens,
        ttft_s=0.01,
        tpot_s=0.005,
        e2e_s=e2e_s,
        speculative=stats,
    )


def record(
    pair_id: str,
    started_at: datetime,
    *,
    category: str = "chat",
    baseline_e2e: float = 0.4,
    speculative_e2e: float = 0.2,
    verify_steps: int = 4,
    exact: bool = True,
    speculative_error: ErrorKind | None = None,
) -> PairRecord:
    speculative = result(speculative_e2e, verify_steps=verify_steps)
    if speculative_error is not None:
        speculative = GenerationResult.failed(speculative_error, "boom", e2e_s=30.0)
    return testing.record(
        0,
        baseline=result(baseline_e2e),
        speculative=speculative,
        pair_scores=testing.scores(exact=exact, delta=None, first_divergence=3),
        prompt=Prompt(f"{category}-1", category, (Message("user", "hello"),), max_tokens=16),
        pair_id=pair_id,
        run_id="run-1",
        started_at=started_at,
    )


def run_info() -> RunInfo:
    return RunInfo(
        run_id="run-1",
        kind="daemon",
        started_at=NOW - timedelta(days=2),
        config={},
        config_hash="abc123",
        baseline_identity={"kind": "fake"},
        speculative_identity={"kind": "fake"},
    )


def scenario() -> list[PairRecord]:
    """Two pairs in the last hour, two earlier today (one failed), one 20 h ago."""
    return [
        record("a", NOW - timedelta(minutes=10), baseline_e2e=0.1, speculative_e2e=0.05),
        record("b", NOW - timedelta(minutes=40), baseline_e2e=0.2, verify_steps=6, exact=False),
        record("c", NOW - timedelta(hours=3), category="code", baseline_e2e=0.3),
        record(
            "d",
            NOW - timedelta(hours=5),
            category="code",
            baseline_e2e=0.4,
            speculative_error=ErrorKind.TIMEOUT,
        ),
        record("e", NOW - timedelta(hours=20), baseline_e2e=0.5, verify_steps=3),
    ]


class TestHistogram:
    def test_value_on_a_bound_belongs_to_the_bucket_above(self) -> None:
        """Bucket i is [bounds[i-1], bounds[i]): a value equal to a bound goes up a bucket."""
        assert bucket_index(0.5, (1.0, 2.0)) == 0
        assert bucket_index(1.0, (1.0, 2.0)) == 1
        assert bucket_index(9.0, (1.0, 2.0)) == 2

    def test_latency_bounds_span_one_millisecond_to_five_minutes(self) -> None:
        """The latency buckets are 40 increasing log-spaced bounds from 1 ms to 300 s."""
        assert len(LATENCY_BOUNDS_S) == 40
        assert LATENCY_BOUNDS_S[0] == 0.001
        assert LATENCY_BOUNDS_S[-1] == pytest.approx(300.0)
        assert list(LATENCY_BOUNDS_S) == sorted(set(LATENCY_BOUNDS_S))

    def test_histogram_counts_values_per_bucket(self) -> None:
        """Each finite value is counted once in its bucket; NaN is ignored."""
        assert histogram([0.5, 1.0, 1.5, 3.0, 5.0, float("nan")], (1.0, 2.0, 4.0)) == (1, 2, 1, 1)


class TestHistogramQuantile:
    BOUNDS = (1.0, 2.0, 4.0)

    @pytest.mark.parametrize(
        ("q", "expected"),
        [(0.25, 1.5), (0.5, 2.0), (0.75, 3.0), (1.0, 4.0), (0.0, 1.0)],
    )
    def test_linear_interpolation_inside_the_bucket(self, q: float, expected: float) -> None:
        """Counts (0, 2, 2, 0): rank q·4 is placed linearly inside [1, 2) or [2, 4)."""
        assert histogram_quantile((0, 2, 2, 0), self.BOUNDS, q) == pytest.approx(expected)

    def test_first_bucket_interpolates_from_zero(self) -> None:
        """The first bucket spans [0, bounds[0]): its median of two values is 0.5."""
        assert histogram_quantile((2, 0, 0, 0), self.BOUNDS, 0.5) == pytest.approx(0.5)

    def test_overflow_bucket_reports_the_last_bound(self) -> None:
        """A quantile in the open last bucket is the last bound, a lower bound of the truth."""
        assert histogram_quantile((1, 0, 0, 3), self.BOUNDS, 0.99) == 4.0

    def test_empty_histogram_has_no_quantile(self) -> None:
        """No counts: None, not zero."""
        assert histogram_quantile((0, 0, 0, 0), self.BOUNDS, 0.5) is None

    def test_mismatched_counts_are_refused(self) -> None:
        """Counts that do not fit the bounds are a bug and raise."""
        with pytest.raises(ValueError, match="do not fit"):
            histogram_quantile((1, 2), self.BOUNDS, 0.5)


class TestWindowStatus:
    def test_raw_window_figures_are_exact(self) -> None:
        """Over raw pairs only: counts, exact P50/P99, acceptance mean, exact-match rate, errors."""
        facts = [facts_from_record(r) for r in scenario()]
        day = window_status(NOW - timedelta(days=1), NOW, facts, [])

        assert day.pairs == 5
        assert day.complete_pairs == 4
        assert day.pairs_by_category == {"chat": 3, "code": 2}
        assert not day.approximate
        # baseline e2e 0.1 … 0.5: P50 = 0.3, P99 = 0.4 + 0.96·0.1 (type-7 quantile)
        assert day.baseline.e2e_p50_s == pytest.approx(0.3)
        assert day.baseline.e2e_p99_s == pytest.approx(0.496)
        assert day.baseline.errors == {}
        assert day.speculative.ok == 4
        assert day.speculative.errors == {"timeout": 1}
        # acceptance lengths of complete pairs: 12/4, 12/6, 12/4, 12/3 -> mean 3.0
        assert day.acceptance_length_mean == pytest.approx(3.0)
        assert day.exact_match_rate == pytest.approx(3 / 4)

    def test_last_hour_keeps_only_its_pairs(self) -> None:
        """The hour window counts the two pairs of the last hour only."""
        facts = [facts_from_record(r) for r in scenario()]
        hour = window_status(NOW - timedelta(hours=1), NOW, facts, [])
        assert hour.pairs_by_category == {"chat": 2}
        assert hour.baseline.e2e_p50_s == pytest.approx(0.15)
        assert hour.exact_match_rate == pytest.approx(0.5)
        assert hour.acceptance_length_mean == pytest.approx(2.5)

    def test_rolled_up_hours_make_quantiles_approximate(self) -> None:
        """With a roll-up in the window, counts stay exact and P50 comes from the histogram."""
        records = scenario()
        facts = [facts_from_record(r) for r in records]
        rolled = list(rollups_by_hour(facts[4:]).values())
        day = window_status(NOW - timedelta(days=1), NOW, facts[:4], rolled)

        assert day.pairs == 5
        assert day.rolled_up_pairs == 1
        assert day.approximate and day.baseline.e2e_approximate
        assert day.acceptance_length_mean == pytest.approx(3.0)
        assert day.exact_match_rate == pytest.approx(3 / 4)
        # the median rank 2.5 of 5 values lies in the bucket holding 0.3
        index = bucket_index(0.3, LATENCY_BOUNDS_S)
        low, high = LATENCY_BOUNDS_S[index - 1], LATENCY_BOUNDS_S[index]
        assert day.baseline.e2e_p50_s is not None
        assert low <= day.baseline.e2e_p50_s < high
        below = sum(1 for r in records if r.baseline.e2e_s < low)
        at = sum(1 for r in records if low <= r.baseline.e2e_s < high)
        assert day.baseline.e2e_p50_s == pytest.approx(low + (high - low) * (2.5 - below) / at)


class TestBuildStatus:
    def test_report_combines_raw_pairs_and_rollups(self, database_url: str) -> None:
        """After retention rolls up the 20-hour-old pair, the day still counts all five."""
        with SqlStore.open(database_url, create=True) as store:
            store.create_run(run_info())
            for r in scenario():
                store.save_pair(r)
            rolled = store.apply_retention(NOW, raw_retention_days=0.5, rollup_retention_days=30)
            assert rolled.rolled_up_pairs == 1
            report = build_status(store, NOW, database="db")

        assert report.last_pair_at == NOW - timedelta(minutes=10)
        assert report.last_pair_age_s == 600
        assert report.latest_run is not None and report.latest_run.info.run_id == "run-1"
        hour, day = report.windows["last_hour"], report.windows["last_day"]
        assert hour.pairs == 2 and not hour.approximate
        assert hour.baseline.e2e_p50_s == pytest.approx(0.15)
        assert day.pairs_by_category == {"chat": 3, "code": 2}
        assert day.rolled_up_pairs == 1 and day.baseline.e2e_approximate
        assert day.speculative.errors == {"timeout": 1}
        assert day.acceptance_length_mean == pytest.approx(3.0)
        assert day.exact_match_rate == pytest.approx(3 / 4)

    def test_draft_lengths_rest_on_the_days_raw_pairs(self, database_url: str) -> None:
        """The recommendation per category is computed from the raw pairs of the last day
        (the 20-hour-old pair, once rolled up, no longer counts)."""
        with SqlStore.open(database_url, create=True) as store:
            store.create_run(run_info())
            for r in scenario():
                store.save_pair(r)
            store.apply_retention(NOW, raw_retention_days=0.5, rollup_retention_days=30)
            report = build_status(store, NOW, database="db")
        raw = [facts_from_record(r) for r in scenario()[:4]]
        assert report.draft_lengths == recommend_draft_lengths(raw)
        assert report.draft_lengths["chat"].pairs == 2
        assert report.draft_lengths["chat"].reason.startswith("too few pairs: 2")

    def test_only_rollups_left_reports_their_hour(self, database_url: str) -> None:
        """When every raw pair is rolled up, the last pair time is the latest rolled-up hour."""
        with SqlStore.open(database_url, create=True) as store:
            store.create_run(run_info())
            store.save_pair(record("x", NOW - timedelta(days=3, minutes=5)))
            store.apply_retention(NOW, raw_retention_days=1, rollup_retention_days=30)
            report = build_status(store, NOW)
        assert report.last_pair_at == datetime(2025, 12, 17, 15, tzinfo=UTC)
        assert not report.empty
        assert report.windows["last_day"].pairs == 0


class TestStatusCommand:
    def populated(self, database_url: str) -> None:
        now = datetime.now(UTC)
        with SqlStore.open(database_url, create=True) as store:
            store.create_run(run_info())
            store.save_pair(record("p1", now - timedelta(minutes=5), category="chat"))
            store.save_pair(
                record(
                    "p2",
                    now - timedelta(hours=2),
                    category="code",
                    speculative_error=ErrorKind.OOM,
                )
            )

    def test_empty_database_says_so_and_exits_zero(self, database_url: str) -> None:
        """A migrated database without pairs prints how to record some, exit 0."""
        SqlStore.open(database_url, create=True).close()
        result = runner.invoke(app, ["status", "--url", database_url])
        assert result.exit_code == 0, result.output
        assert "no pairs recorded yet; start `canaryd run` or `canaryd once`" in result.stdout

    def test_tables_show_categories_arms_and_errors(self, database_url: str) -> None:
        """The human output names each category, both arms and the error kinds."""
        self.populated(database_url)
        result = runner.invoke(app, ["status", "--url", database_url])
        assert result.exit_code == 0, result.output
        for text in ("pairs by category", "chat", "code", "baseline", "speculative", "oom 1"):
            assert text in result.stdout
        assert (
            "last day: acceptance length mean 3.00, fallback rate 0.0%, exact match 100.0%"
            in result.stdout
        )
        assert "draft length by category (last day's pairs):" in result.stdout
        assert (
            "chat: too few pairs: 1 with acceptance per position (at least 20 needed)"
            in result.stdout
        )

    def test_json_is_the_documented_object(self, database_url: str) -> None:
        """--json prints one object with the schema tag, windows, arms and errors."""
        self.populated(database_url)
        result = runner.invoke(app, ["status", "--json", "--url", database_url])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["schema"] == "canaryd.status/1"
        assert data["empty"] is False
        assert data["latest_run"]["run_id"] == "run-1"
        day = data["windows"]["last_day"]
        assert day["pairs_by_category"] == {"chat": 1, "code": 1}
        assert day["arms"]["speculative"]["errors"] == {"oom": 1}
        assert day["arms"]["baseline"]["e2e_p50_s"] == pytest.approx(0.4)
        assert data["windows"]["last_hour"]["pairs"] == 1
        chat = data["draft_length"]["chat"]
        assert chat["draft_length"] is None and chat["pairs"] == 1
        assert chat["acceptance_by_position"] == [pytest.approx(4 / 16)]

    def test_url_comes_from_the_config_file(self, database_url: str, tmp_path: Path) -> None:
        """Without --url, the configuration's storage.url is read."""
        self.populated(database_url)
        config = tmp_path / "canaryd.toml"
        config.write_text(f'[storage]\nurl = "{database_url}"\n', encoding="utf-8")
        result = runner.invoke(app, ["status", "--json", "--config", str(config)])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["windows"]["last_day"]["pairs"] == 2

    def test_bad_url_is_one_line_and_exit_two(self) -> None:
        """An unsupported URL is reported on one stderr line, exit 2, no traceback."""
        result = runner.invoke(app, ["status", "--url", "mysql://u:secret@h/db"])
        assert result.exit_code == 2
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("canaryd: error: unsupported database")
        assert "secret" not in result.stderr


def served(pair_id: str, started_at: datetime, gap_s: float, kept_steps: int) -> PairRecord:
    """A pair whose speculative arm emitted 12 tokens in 4 verify steps, `kept_steps` of
    which kept a draft token, delivered as 4 bursts `gap_s` apart; the baseline one token
    every `gap_s`."""
    speculative = replace(
        result(0.2, verify_steps=4),
        speculative=SpeculativeStats(4, 16, 8, (kept_steps,), (16,)),
        itl=inter_token_latency([(0.01 + i * gap_s, 3) for i in range(4)]),
    )
    baseline = replace(
        result(0.4), itl=inter_token_latency([(0.01 + i * gap_s, 1) for i in range(12)])
    )
    return testing.record(
        0,
        baseline=baseline,
        speculative=speculative,
        prompt=Prompt("chat-1", "chat", (Message("user", "hello"),), max_tokens=16),
        pair_id=pair_id,
        run_id="run-1",
        started_at=started_at,
    )


class TestItlAndFallback:
    def test_itl_quantiles_and_fallback_rate_per_window(self, database_url: str) -> None:
        """Per arm, ITL P50/P95/P99 are the median over generations of each one's own;
        the fallback rate pools verify steps (1 − kept / steps); each window counts only
        its pairs, and a rolled-up pair (which keeps neither) none."""
        pairs = [
            served("h1", NOW - timedelta(minutes=10), 0.02, kept_steps=4),
            served("h2", NOW - timedelta(minutes=20), 0.04, kept_steps=2),
            served("d1", NOW - timedelta(hours=5), 0.06, kept_steps=0),
            served("old", NOW - timedelta(hours=20), 1.0, kept_steps=0),
        ]
        with SqlStore.open(database_url, create=True) as store:
            store.create_run(run_info())
            for record in pairs:
                store.save_pair(record)
            store.apply_retention(NOW, raw_retention_days=0.5, rollup_retention_days=30)
            report = build_status(store, NOW)
        hour, day = report.windows["last_hour"], report.windows["last_day"]
        # speculative bursts of 3 tokens: gaps per token are gap, 0, 0 -> P99 near the gap
        spec_p99 = [r.speculative.itl.p99_s for r in pairs if r.speculative.itl is not None]
        assert hour.speculative.itl_p99_s == pytest.approx((spec_p99[0] + spec_p99[1]) / 2)
        assert hour.speculative.itl_p50_s == pytest.approx(0.0)
        assert hour.baseline.itl_p50_s == pytest.approx(0.03)
        assert hour.baseline.itl_p95_s == pytest.approx(0.03)
        assert hour.baseline.itl_generations == 2
        assert day.speculative.itl_p99_s == pytest.approx(spec_p99[1])
        assert day.baseline.itl_generations == 3
        assert hour.fallback_rate == pytest.approx(1 - 6 / 8)
        assert hour.fallback_verify_steps == 8
        assert day.fallback_rate == pytest.approx(1 - 6 / 12)
        assert day.pairs == 4 and day.fallback_verify_steps == 12

    def test_status_prints_and_returns_itl_and_fallback(self, database_url: str) -> None:
        """The tables show ITL P50/P95/P99 in ms per arm and the fallback rate; --json
        carries them per window and arm."""
        now = datetime.now(UTC)
        with SqlStore.open(database_url, create=True) as store:
            store.create_run(run_info())
            store.save_pair(served("p1", now - timedelta(minutes=5), 0.02, kept_steps=3))
        text = runner.invoke(app, ["status", "--url", database_url])
        assert text.exit_code == 0, text.output
        assert "ITL p50/p95/p99" in text.stdout
        assert "20.0/20.0/20.0" in text.stdout  # the baseline: one token every 20 ms
        assert "last hour: acceptance length mean 3.00, fallback rate 25.0%" in text.stdout
        data = json.loads(runner.invoke(app, ["status", "--json", "--url", database_url]).stdout)
        hour = data["windows"]["last_hour"]
        assert hour["fallback_rate"] == pytest.approx(0.25)
        assert hour["fallback_verify_steps"] == 4
        assert hour["arms"]["baseline"]["itl_p99_s"] == pytest.approx(0.02)
        assert hour["arms"]["speculative"]["itl_generations"] == 1
        spec = data["speculative_arms"]["speculative"]["last_day"]
        assert spec["fallback_rate"] == pytest.approx(0.25)
