"""`canaryd bench`: percentile and throughput figures against hand-computed values, the
closed-loop driver, and the command end to end on fake engines storing a bench run."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.bench.run import BenchPlan, bench_results, drive_arm
from canaryd.cli.app import app
from canaryd.report import (
    acceptance_figures,
    arm_level_figures,
    bench_section,
    level_figures,
    percentiles,
)
from canaryd.store import SqlStore, StoredRun
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from engine.types import (
    ErrorKind,
    GenerationRequest,
    GenerationResult,
    Message,
    SamplingParams,
    SpeculativeStats,
)
from gates.pairs.testing import record
from gates.records import PairRecord, Prompt

FAKE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
"""


def result(tokens: int, e2e_s: float, ttft_s: float = 0.1, stats: SpeculativeStats | None = None):
    return GenerationResult(
        text="x " * tokens,
        token_ids=tuple(range(tokens)),
        finish_reason="length",
        prompt_tokens=5,
        output_tokens=tokens,
        ttft_s=ttft_s,
        tpot_s=(e2e_s - ttft_s) / (tokens - 1),
        e2e_s=e2e_s,
        speculative=stats,
    )


def pair(baseline: GenerationResult, speculative: GenerationResult, n: int = 0) -> PairRecord:
    return record(
        n,
        baseline=baseline,
        speculative=speculative,
        scored=False,
        prompt=Prompt(id=f"p{n}", category="qa", messages=(Message("user", "hi"),), max_tokens=8),
        pair_id=f"pair{n}",
        run_id="run",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


class TestPercentiles:
    def test_type7_values_by_hand(self) -> None:
        """P50/P95/P99 of 1…5 interpolate linearly: 3, 4.8 and 4.96."""
        p = percentiles([5.0, 1.0, 3.0, 2.0, 4.0])
        assert p.p50 == pytest.approx(3.0)
        assert p.p95 == pytest.approx(4.8)  # position 0.95·4 = 3.8 → 4 + 0.8·(5 − 4)
        assert p.p99 == pytest.approx(4.96)

    def test_missing_values_are_ignored_and_none_is_not_zero(self) -> None:
        """Unreported values are skipped; with none left every percentile is None."""
        assert percentiles([None, 2.0, None]).p99 == pytest.approx(2.0)
        empty = percentiles([None, None])
        assert (empty.p50, empty.p95, empty.p99) == (None, None, None)


class TestArmLevelFigures:
    def test_throughput_and_rates_by_hand(self) -> None:
        """30 tokens in 2 s of wall clock is 15 tok/s; per request 10 tok/s; 2 ok of 3."""
        results = [
            result(10, 1.0),
            result(20, 2.0),
            GenerationResult.failed(ErrorKind.TIMEOUT, "slow", 3.0),
        ]
        f = arm_level_figures(results, wall_s=2.0)
        assert (f.requests, f.ok, f.errors, f.output_tokens) == (3, 2, 1, 30)
        assert f.aggregate_tokens_per_s == pytest.approx(15.0)
        assert f.per_request_tokens_per_s_p50 == pytest.approx(10.0)
        assert f.per_request_tokens_per_s_mean == pytest.approx(10.0)
        assert f.request_rate_per_s == pytest.approx(1.0)
        assert f.error_rate == pytest.approx(1 / 3)
        assert f.e2e_s.p50 == pytest.approx(1.5)  # the failure's 3 s is not a latency
        assert f.e2e_s.p99 == pytest.approx(1.99)

    def test_all_failed_has_no_throughput(self) -> None:
        """A level where every request failed reports no throughput, not 0 tok/s."""
        f = arm_level_figures([GenerationResult.failed(ErrorKind.HTTP, "503", 0.1)], 1.0)
        assert f.aggregate_tokens_per_s is None
        assert f.error_rate == 1.0


class TestLevelFigures:
    def test_speedups_by_hand(self) -> None:
        """Throughput speedup is the ratio of aggregate tok/s; e2e speedup the median ratio."""
        pairs = [
            pair(result(10, 2.0), result(10, 1.0), 0),  # 2×
            pair(result(10, 3.0), result(10, 1.0), 1),  # 3×
            pair(result(10, 4.0), result(10, 1.0), 2),  # 4×
        ]
        f = level_figures(
            2, ("baseline", "speculative"), pairs, {"baseline": 6.0, "speculative": 2.0}
        )
        assert f.baseline.aggregate_tokens_per_s == pytest.approx(5.0)
        assert f.speculative.aggregate_tokens_per_s == pytest.approx(15.0)
        assert f.throughput_speedup == pytest.approx(3.0)
        assert f.e2e_speedup_median == pytest.approx(3.0)


class TestAcceptanceFigures:
    def test_pooled_rates_and_per_position_by_hand(self) -> None:
        """Rates pool counts over requests; per position accepted_i ÷ drafted_i."""
        a = SpeculativeStats(
            verify_steps=4, draft_tokens=8, accepted_tokens=6,
            accepted_per_position=(4, 2), drafted_per_position=(4, 4),
        )  # fmt: skip
        b = SpeculativeStats(
            verify_steps=5, draft_tokens=10, accepted_tokens=5,
            accepted_per_position=(4, 1), drafted_per_position=(5, 5),
        )  # fmt: skip
        pairs = [
            pair(result(10, 1.0), result(10, 1.0, stats=a), 0),  # length 10/4 = 2.5
            pair(result(10, 1.0), result(10, 1.0, stats=b), 1),  # length 10/5 = 2.0
        ]
        f = acceptance_figures(pairs)
        assert f.pairs == 2
        assert f.acceptance_length_mean == pytest.approx(2.25)
        assert f.acceptance_length_p50 == pytest.approx(2.25)
        assert f.acceptance_length_p90 == pytest.approx(2.45)
        assert f.acceptance_rate == pytest.approx(11 / 18)
        assert f.accepted_per_position == (8, 3)
        assert f.drafted_per_position == (9, 9)
        assert f.acceptance_rate_per_position == pytest.approx((8 / 9, 3 / 9))

    def test_unreported_drafted_figures_stay_out_of_the_rates(self) -> None:
        """A request without drafted tokens (None) or per-position figures (empty) adds to
        neither rate: 6 ÷ 8 overall and 4 ÷ 4, 2 ÷ 4 per position, from `a` alone."""
        a = SpeculativeStats(
            verify_steps=4, draft_tokens=8, accepted_tokens=6,
            accepted_per_position=(4, 2), drafted_per_position=(4, 4),
        )  # fmt: skip
        b = SpeculativeStats(
            verify_steps=5, draft_tokens=None, accepted_tokens=5, accepted_per_position=(4, 1)
        )
        pairs = [
            pair(result(10, 1.0), result(10, 1.0, stats=a), 0),
            pair(result(10, 1.0), result(10, 1.0, stats=b), 1),
        ]
        f = acceptance_figures(pairs)
        assert f.pairs == 2
        assert f.acceptance_rate == pytest.approx(6 / 8)
        assert f.accepted_per_position == (4, 2)
        assert f.drafted_per_position == (4, 4)
        assert f.acceptance_rate_per_position == pytest.approx((1.0, 0.5))


class TestDriveArm:
    def request(self, index: int) -> GenerationRequest:
        return GenerationRequest(
            messages=(Message("user", f"prompt number {index}"),),
            sampling=SamplingParams(max_tokens=8),
            request_id=f"r{index}",
        )

    def test_limit_returns_results_in_index_order(self) -> None:
        """With a limit, exactly that many requests are sent and come back in index order."""
        engine = FakeEngine(FakeEngineConfig(realtime=True, ttft_s=0.001, tpot_s=0.001))
        run = drive_arm(engine, self.request, 4, limit=9)
        assert len(run.results) == 9
        expected = [engine.generate(self.request(i)).text for i in range(9)]
        assert [t.result.text for t in run.results] == expected
        assert run.window.wall_s > 0

    def test_workers_overlap(self) -> None:
        """Four workers on a sleeping engine finish eight requests in about two rounds."""
        engine = FakeEngine(FakeEngineConfig(realtime=True, ttft_s=0.05, tpot_s=0.0001, jitter=0.0))
        run = drive_arm(engine, self.request, 4, limit=8)
        serial = sum(t.result.e2e_s for t in run.results)
        assert run.window.wall_s < serial / 2

    def test_deadline_stops_sending(self) -> None:
        """With a deadline, workers stop taking new requests once it has passed."""
        engine = FakeEngine(FakeEngineConfig(realtime=True, ttft_s=0.02, tpot_s=0.0001))
        run = drive_arm(engine, self.request, 2, deadline_s=0.1)
        assert 1 <= len(run.results) < 40

    def test_raising_engine_is_recorded_as_internal(self) -> None:
        """An engine that raises (a bug) yields an `internal` failure, not a crash."""

        class Broken(FakeEngine):
            def generate(self, request: GenerationRequest) -> GenerationResult:
                raise RuntimeError("boom")

        run = drive_arm(Broken(FakeEngineConfig()), self.request, 2, limit=3)
        assert [t.result.error for t in run.results] == [ErrorKind.INTERNAL] * 3


class TestBenchPlan:
    def test_exactly_one_of_requests_and_duration(self) -> None:
        """A plan needs a request count or a duration, not both and not neither."""
        with pytest.raises(ValueError, match="exactly one"):
            BenchPlan(concurrency=(1,), requests=4, duration_s=1.0)
        with pytest.raises(ValueError, match="exactly one"):
            BenchPlan(concurrency=(1,))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("CANARYD_CONFIG", raising=False)
    monkeypatch.delenv("CANARYD_STORAGE__URL", raising=False)
    (tmp_path / "canaryd.toml").write_text(FAKE_ARMS)
    return tmp_path


def database(env: Path) -> str:
    return f"sqlite:///{env / 'data' / 'canaryd.db'}"


class TestBenchCommand:
    def test_stores_a_bench_run_and_writes_results(self, env: Path) -> None:
        """The ladder's pairs are stored under a `bench` run; results.json equals what the
        stored run and pairs recompute; warm-up requests are not stored."""
        out = env / "out"
        result = CliRunner().invoke(
            app,
            ["bench", "-c", str(env / "canaryd.toml"), "--concurrency", "1,3",
             "--requests", "6", "--warmup", "2", "--out", str(out)],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        results = json.loads((out / "results.json").read_text())
        assert "Concurrency ladder" in result.stdout
        assert f"canaryd report --run {results['run_id']}" in result.stdout
        store = SqlStore.open(database(env))
        try:
            run = next(r for r in store.runs() if r.info.run_id == results["run_id"])
            pairs = store.pairs(run_id=run.info.run_id)
        finally:
            store.close()
        assert run.info.kind == "bench" and run.finished_at is not None
        assert len(pairs) == 12, "2 levels × 6 requests; the 2 warm-up requests are not pairs"
        assert json.loads(json.dumps(bench_results(run, pairs))) == results
        assert [level["concurrency"] for level in results["ladder"]] == [1, 3]
        for level in results["ladder"]:
            for arm in ("baseline", "speculative"):
                assert level[arm]["requests"] == 6
                assert level[arm]["aggregate_tokens_per_s"] > 0
                assert set(level[arm]["e2e_s"]) == {"p50", "p95", "p99"}
            assert level["throughput_speedup"] is not None
        assert results["consistency"]["all"]["exact_match_rate"] == 1.0
        assert results["acceptance"]["all"]["acceptance_length_mean"] > 1.0
        assert results["resources"]["gpu"] == "not measured" or isinstance(
            results["resources"]["gpu"], list
        )
        assert results["resources"]["rss"]["peak_sampled_bytes"] > 0
        section = bench_section(run)
        assert section is not None and section["plan"]["requests"] == 6
        assert results["config"]["arms"]["baseline"]["kind"] == "fake"

    def test_same_prompts_same_order_on_both_arms_and_levels(self, env: Path) -> None:
        """Pair i has the same prompt at every level, and both arms of a pair share it."""
        result = CliRunner().invoke(
            app,
            ["bench", "-c", str(env / "canaryd.toml"), "--concurrency", "1,2",
             "--requests", "4", "--warmup", "0", "--out", str(env / "out"), "--json"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        results = json.loads(result.stdout)
        store = SqlStore.open(database(env))
        try:
            run = next(r for r in store.runs() if r.info.run_id == results["run_id"])
            by_id = {p.pair_id: p for p in store.pairs(run_id=run.info.run_id)}
        finally:
            store.close()
        section = bench_section(run)
        assert section is not None
        first, second = (level["pair_ids"] for level in section["levels"])
        assert [by_id[i].prompt.id for i in first] == [by_id[i].prompt.id for i in second]
        assert all(by_id[i].baseline.text == by_id[i].speculative.text for i in first)

    def test_duration_mode_pairs_every_request(self, env: Path) -> None:
        """--duration bounds the first arm; the other arm sends exactly the same requests."""
        result = CliRunner().invoke(
            app,
            ["bench", "-c", str(env / "canaryd.toml"), "--concurrency", "2",
             "--duration", "0.05", "--warmup", "0", "--out", str(env / "out"), "--json"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        level = json.loads(result.stdout)["ladder"][0]
        assert level["baseline"]["requests"] == level["speculative"]["requests"] >= 1

    def test_bad_concurrency_is_one_clear_line(self, env: Path) -> None:
        """A malformed ladder is rejected before anything runs, naming the value."""
        result = CliRunner().invoke(
            app, ["bench", "-c", str(env / "canaryd.toml"), "--concurrency", "1,x"]
        )
        assert result.exit_code == 2
        assert "'1,x' is not a comma-separated list of integers" in result.output


THREE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.hydra]
kind = "fake"
speculative = true
acceptance_rate = 0.9
[arms.medusa]
kind = "fake"
speculative = true
acceptance_rate = 0.3
[switch]
arm = "medusa"
"""


class TestBenchArms:
    def test_every_arm_climbs_the_ladder_against_one_baseline(self, env: Path) -> None:
        """Three arms: a ladder entry per level and speculative arm, the arms side by side
        in results.json and in the tables, and the report of the run draws the ablation."""
        (env / "canaryd.toml").write_text(THREE_ARMS)
        out = env / "out"
        result = CliRunner().invoke(
            app,
            ["bench", "-c", str(env / "canaryd.toml"), "--concurrency", "1,2",
             "--requests", "4", "--warmup", "1", "--out", str(out)],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        results = json.loads((out / "results.json").read_text())
        with SqlStore.open(database(env)) as store:
            run = store.runs_by_id([results["run_id"]])[results["run_id"]]
            pairs = store.pairs(run_id=run.info.run_id)
        assert len(pairs) == 2 * 4 * 2, "levels × requests × speculative arms"
        assert json.loads(json.dumps(bench_results(run, pairs))) == results
        assert [(lv["concurrency"], lv["speculative_arm"]) for lv in results["ladder"]] == [
            (c, arm) for c in (1, 2) for arm in sorted(("hydra", "medusa"), key=_driven(run, c))
        ]
        assert results["switch_arm"] == "medusa"
        assert set(results["arms"]) == {"hydra", "medusa"}
        assert results["acceptance"] == results["arms"]["medusa"]["acceptance"]
        hydra = results["arms"]["hydra"]["acceptance"]["all"]["acceptance_length_mean"]
        medusa = results["arms"]["medusa"]["acceptance"]["all"]["acceptance_length_mean"]
        assert hydra > medusa
        assert set(results["engines"]) >= {"baseline", "hydra", "medusa"}
        groups = {p.group_id for p in pairs}
        assert len(groups) == 2 * 4 and all(p.pair_id.startswith(p.group_id) for p in pairs)
        for table in ("### Speculative arms", "Concurrency ladder — hydra", "— medusa"):
            assert table in result.stdout
        report = CliRunner().invoke(
            app,
            ["report", "-c", str(env / "canaryd.toml"), "--run", results["run_id"],
             "--out", str(env / "report.html")],
        )  # fmt: skip
        assert report.exit_code == 0, report.output
        page = (env / "report.html").read_text()
        assert "Acceptance length per arm and category" in page
        assert "Acceptance by draft position per arm" in page


def _driven(run: StoredRun, concurrency: int) -> Callable[[str], int]:
    """The order the bench drove the arms in at `concurrency`, as a sort key."""
    section = bench_section(run)
    assert section is not None
    [level] = [lv for lv in section["levels"] if lv["concurrency"] == concurrency]
    order: list[str] = level["arm_order"]
    return order.index
