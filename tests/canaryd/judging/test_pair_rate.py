"""The pair rate measured on the database, and the gate job re-budgeting for it: pairs from
the real pair runner over fake engines, written by one or two daemons' runs to one real
database (SQLite and PostgreSQL), then judged by `SwitchGates.evaluate` and the verdict."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from canaryd.config import Settings
from canaryd.judging.gatejob import SwitchGates
from canaryd.judging.rate import RATE_HORIZON, RATE_REFRESH, pair_rate
from canaryd.judging.verdict import VerdictQuery, VerdictService
from canaryd.metrics import CanarydMetrics
from canaryd.pairs.runner import PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites
from canaryd.store import SqlStore
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from gates.core import checks
from gates.records import RunInfo

DESIGN_INTERVAL_S = 600.0  # one pair every 10 minutes: a day's design rate is 144 pairs
DAY_PAIRS = int(RATE_HORIZON.total_seconds() / DESIGN_INTERVAL_S)
DRY = {"mode": "dry_run"}


def settings(url: str, tmp_path: Path) -> Settings:
    """The error gate enforces (its detectors' thresholds show the budget); the schedule
    runs at the design rate, so the config is valid as it stands."""
    return Settings(
        storage={"url": url},
        switch={"state_file": str(tmp_path / "switch.json")},
        schedule={"pair_interval_s": DESIGN_INTERVAL_S},
        gates={
            "budget": {"design_pair_interval_s": DESIGN_INTERVAL_S},
            "latency": DRY,
            "quality": DRY,
            "speedup": DRY,
            "drift": DRY,
            "policy": {"cooldown_seconds": 0},
        },
    )


def measure(store: SqlStore, run_id: str, now: datetime, *, offset_s: float) -> None:
    """One daemon's day at the design rate: a pair every `DESIGN_INTERVAL_S` up to `now`,
    its prompts and seeds its own."""
    prompts = [p for suite in load_default_suites() for p in suite.prompts]
    store.create_run(RunInfo(run_id, "daemon", now - RATE_HORIZON, {}, "h", {}, {}, {}))
    runner = PairRunner(
        FakeEngine(FakeEngineConfig(seed=1)),
        FakeEngine(FakeEngineConfig(speculative=True, seed=1)),
        run_id=run_id,
    )
    sampler = StratifiedSampler(prompts, seed=len(run_id))
    start = now - RATE_HORIZON + timedelta(seconds=offset_s)
    for index in range(DAY_PAIRS):
        record = runner.run_pair(sampler.next())
        started = start + timedelta(seconds=index * DESIGN_INTERVAL_S)
        store.save_pair(replace(record, started_at=started))


def thresholds(store: SqlStore) -> dict[str, float]:
    evaluation = store.latest_evaluation()
    assert evaluation is not None
    return {
        c.name: c.detector.threshold for c in checks(evaluation.decisions) if c.detector is not None
    }


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened:
        yield opened


class TestPairRate:
    def test_counts_every_run_on_the_database_over_the_horizon(
        self, store: SqlStore, database_url: str
    ) -> None:
        """Two runs' pairs in the last day count together, divided by the whole day;
        pairs older than the horizon do not count."""
        now = datetime.now(UTC).replace(microsecond=0)
        measure(store, "leader", now, offset_s=1)
        assert pair_rate(store, "speculative", now) == pytest.approx(DAY_PAIRS / 1440)
        measure(store, "follower", now, offset_s=300)
        assert pair_rate(store, "speculative", now) == pytest.approx(2 * DAY_PAIRS / 1440)
        later = now + timedelta(hours=12)
        assert pair_rate(store, "speculative", later) == pytest.approx(DAY_PAIRS / 1440, rel=0.02)
        assert pair_rate(store, "another", now) == 0


class TestRebudget:
    def test_one_daemon_at_the_design_rate_is_not_rebudgeted(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """A single daemon at the design rate: ratio 1 exported, the config as the operator
        wrote it, and the verdict says nothing of a re-budget."""
        now = datetime.now(UTC).replace(microsecond=0)
        measure(store, "leader", now, offset_s=1)
        metrics = CanarydMetrics()
        config = settings(database_url, tmp_path)
        hook = SwitchGates(config, metrics=metrics.switch, store=store)
        hook.evaluate(now)
        hook.close()
        ratio = metrics.registry.get_sample_value("canaryd_pair_rate_ratio")
        assert ratio == pytest.approx(1.0, abs=0.01)
        assert config.gates == settings(database_url, tmp_path).gates
        store.start_revision("speculative", "r1", now - RATE_HORIZON, keep=10)
        verdict = VerdictService(lambda: config, store=store).judge(VerdictQuery("r1"))
        assert "re-budgeted" not in verdict.reason

    def test_a_follower_measuring_beside_the_leader_rebudgets_the_gates(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """A leader and a follower each at the design rate on one database: the gate job
        measures twice the design rate, exports ratio 2 and judges with the error gate's
        detectors' thresholds log(2) higher than the single daemon's; the verdict, judged
        through the same path, says it was re-budgeted; the operator's config is untouched."""
        now = datetime.now(UTC).replace(microsecond=0)
        measure(store, "leader", now, offset_s=1)
        config = settings(database_url, tmp_path)
        metrics = CanarydMetrics()
        hook = SwitchGates(config, metrics=metrics.switch, store=store)
        hook.evaluate(now)
        single = thresholds(store)
        measure(store, "follower", now, offset_s=301)
        hook.evaluate(now + RATE_REFRESH)  # measured again
        ratio = metrics.registry.get_sample_value("canaryd_pair_rate_ratio")
        assert ratio == pytest.approx(2.0, abs=0.02)
        double = thresholds(store)
        errors = [name for name in single if name.startswith("error.")]
        assert len(errors) == 2
        for name in errors:
            assert double[name] - single[name] == pytest.approx(math.log(2.0), abs=0.02), name
        hook.close()
        assert config.gates.budget.design_pair_interval_s == DESIGN_INTERVAL_S
        store.start_revision("speculative", "r1", now - RATE_HORIZON, keep=10)
        verdict = VerdictService(lambda: config, store=store).judge(VerdictQuery("r1"))
        assert verdict.judgement is not None
        assert verdict.judgement.rate_ratio == pytest.approx(2.0, abs=0.02)
        assert "judged re-budgeted for 0.199 pairs a minute, 1.99x the design rate" in (
            verdict.reason
        )
