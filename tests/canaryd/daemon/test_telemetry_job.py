"""The daemon's telemetry scrape job (canaryd.daemon.telemetry) on a real SQLite store and
real replicas on loopback: each scrape after the first stores one interval per arm under
the arm's key; a follower stores nothing; a replica that keeps failing is counted every
time and logged once per period, one refused for passing a bound counted by the bound and
logged once; a database that is away loses the interval and the job
goes on; old intervals are pruned. In a running daemon the job is scheduled on
`scrape_interval_s` (absent without `[telemetry]`), runs while the pair cycle holds its
lock, and a reload that adds `[telemetry]` starts it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from structlog.testing import capture_logs

from canaryd.config import Settings, load_settings
from canaryd.config.arms import arm_key
from canaryd.daemon import Daemon
from canaryd.daemon.telemetry import TELEMETRY_JOB, TelemetryJob
from canaryd.metrics import CanarydMetrics
from canaryd.store import SqlStore
from tests.canaryd.telemetry.replica import VllmReplica
from tests.support.hostile_metrics import MetricsEndpoint, many_bounds

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
STEP = timedelta(seconds=15)
FAKE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
"""


@pytest.fixture(autouse=True)
def _clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    for name in ("CANARYD_CONFIG", "CANARYD_STORAGE__URL", "CANARYD_SERVER__LISTEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def replicas() -> Iterator[tuple[VllmReplica, VllmReplica]]:
    """A baseline and a speculative replica."""
    with VllmReplica(1_700_000_000.0) as baseline, VllmReplica(1_700_000_100.0) as speculative:
        yield baseline, speculative


def telemetry_section(baseline: str, speculative: str, interval_s: float = 15.0) -> str:
    return f"""
[telemetry]
scrape_interval_s = {interval_s}
timeout_s = 1.0
[telemetry.arms.baseline]
metrics_url = "{baseline}"
[telemetry.arms.speculative]
metrics_url = "{speculative}"
"""


def write_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(
        FAKE_ARMS
        + f"""
[storage]
url = "sqlite:///{tmp_path / "canaryd.db"}"
[server]
listen = "127.0.0.1:0"
[gates.budget]
over_design_rate = "rebudget"
[schedule]
pair_interval_s = 0.2
jitter_s = 0
"""
        + extra
    )
    return path


class Harness:
    """A `TelemetryJob` on a real store, with the leadership a test sets."""

    def __init__(self, settings: Settings, store: SqlStore) -> None:
        self.settings, self.store, self.leading = settings, store, True
        self.metrics = CanarydMetrics()
        self.job = TelemetryJob(
            lambda: self.settings,
            self.metrics.telemetry,
            store_metrics=self.metrics.store,
            store=lambda: self.store,
            leading=lambda: self.leading,
        )
        self.job.start(None)

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def harness(tmp_path: Path, replicas: tuple[VllmReplica, VllmReplica]) -> Iterator[Harness]:
    baseline, speculative = replicas
    settings = load_settings(
        write_config(tmp_path, telemetry_section(baseline.url, speculative.url))
    )
    with SqlStore.open(settings.storage.resolved_url(), create=True) as store:
        made = Harness(settings, store)
        yield made
        made.job.close()


class TestTelemetryJob:
    def test_each_scrape_after_the_first_stores_one_interval_per_arm(
        self, harness: Harness, replicas: tuple[VllmReplica, VllmReplica]
    ) -> None:
        """The first scrape stores nothing; each later one an interval per arm, keyed by
        the arm's configuration, and counted."""
        baseline, speculative = replicas
        harness.job.run(T0)
        assert harness.store.telemetry("speculative") == []
        baseline.finish(50)
        speculative.finish(48)
        speculative.finish(2, reason="error")
        speculative.draft(200, 1000, 500)
        harness.job.run(T0 + STEP)
        (base,) = harness.store.telemetry("baseline", arms=arm_key(harness.settings, "baseline"))
        (spec,) = harness.store.telemetry(
            "speculative", arms=arm_key(harness.settings, "speculative")
        )
        assert (base.interval.requests, spec.interval.requests, spec.interval.errors) == (
            50,
            50,
            2,
        )
        assert (spec.interval.drafts, spec.interval.accepted_tokens) == (200, 500)
        assert spec.interval.e2e is not None and spec.interval.e2e.count == 50
        assert base.arms != spec.arms
        assert harness.sample("canaryd_telemetry_intervals_total", arm="speculative") == 1
        assert harness.sample("canaryd_telemetry_scrapes_total", arm="baseline", outcome="ok") == 2

    def test_a_follower_scrapes_but_stores_nothing(self, harness: Harness) -> None:
        """A daemon that follows keeps its readings current and stores nothing; once it
        leads, its next scrape stores."""
        harness.leading = False
        harness.job.run(T0)
        harness.job.run(T0 + STEP)
        assert harness.store.telemetry("speculative") == []
        harness.leading = True
        harness.job.run(T0 + 2 * STEP)
        (stored,) = harness.store.telemetry("speculative")
        assert stored.interval.start == T0 + STEP

    def test_a_failing_replica_is_counted_every_time_and_logged_once(
        self, harness: Harness, replicas: tuple[VllmReplica, VllmReplica]
    ) -> None:
        """Five failed scrapes of one replica: five in the counter, one log line; the other
        arm's intervals are stored all the same."""
        _, speculative = replicas
        speculative.status = 503
        with capture_logs() as logs:
            for index in range(5):
                harness.job.run(T0 + index * STEP)
        failed = [entry for entry in logs if entry["event"] == "telemetry.replica_failed"]
        assert len(failed) == 1 and "HTTP 503" in failed[0]["reason"]
        assert (
            harness.sample("canaryd_telemetry_scrapes_total", arm="speculative", outcome="failed")
            == 5
        )
        assert len(harness.store.telemetry("baseline")) == 4
        assert harness.store.telemetry("speculative") == []

    def test_a_refused_replica_is_counted_every_time_and_logged_once_per_episode(
        self, tmp_path: Path, replicas: tuple[VllmReplica, VllmReplica]
    ) -> None:
        """A replica whose histogram passes `max_buckets`: every scrape counts one refusal
        by its bound, one line says so (no throttled failure line besides), and nothing of
        it is stored; once it is read again, a new refusal is logged anew."""
        baseline, _ = replicas
        hostile = {"on": True}

        def exposition(n: int) -> str:
            return many_bounds(200 if hostile["on"] else 20, 100 * n)

        with MetricsEndpoint(exposition) as endpoint:
            section = telemetry_section(baseline.url, endpoint.url)
            settings = load_settings(write_config(tmp_path, section))
            with SqlStore.open(settings.storage.resolved_url(), create=True) as store:
                harness = Harness(settings, store)
                try:
                    with capture_logs() as logs:
                        for index in range(4):
                            harness.job.run(T0 + index * STEP)
                        stored = store.telemetry("speculative")
                        hostile["on"] = False
                        harness.job.run(T0 + 4 * STEP)
                        hostile["on"] = True
                        harness.job.run(T0 + 5 * STEP)
                finally:
                    harness.job.close()
        refused = [entry for entry in logs if entry["event"] == "telemetry.source_refused"]
        assert len(refused) == 2 and refused[0]["bound"] == "buckets"
        assert "telemetry.max_buckets" in refused[0]["reason"]
        assert not [entry for entry in logs if entry["event"] == "telemetry.replica_failed"]
        assert stored == []
        assert (
            harness.sample("canaryd_telemetry_refused_total", arm="speculative", reason="buckets")
            == 5
        )

    def test_a_database_away_loses_the_interval_not_the_job(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """A store that fails is counted as a store error (the first scrape's prune, the
        second's interval); the job does not raise and stores again once the database is
        back."""
        url = harness.settings.storage.resolved_url()
        engine = create_engine(url)
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE telemetry_intervals RENAME TO away"))
        harness.job.run(T0)
        harness.job.run(T0 + STEP)
        assert harness.sample("canaryd_store_errors_total", kind="telemetry") == 2
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE away RENAME TO telemetry_intervals"))
        engine.dispose()
        harness.job.run(T0 + 2 * STEP)
        assert [s.interval.start for s in harness.store.telemetry("speculative")] == [T0 + STEP]

    def test_old_intervals_are_pruned(self, harness: Harness) -> None:
        """Intervals that ended more than `retention_days` ago go at the first scrape an
        hour after the last prune; the ones ending since stay."""
        harness.job.run(T0)
        harness.job.run(T0 + STEP)
        later = T0 + timedelta(days=harness.settings.telemetry.retention_days, hours=2)
        harness.job.run(later)  # its interval spans the gap since the last reading
        harness.job.run(later + STEP)
        assert [s.interval.start for s in harness.store.telemetry("speculative")] == [
            T0 + STEP,
            later,
        ]


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s")


class TestDaemonScrapes:
    def test_without_telemetry_there_is_no_job(self, tmp_path: Path) -> None:
        """No `[telemetry]`: no scrape job, no source."""
        with Daemon(load_settings(write_config(tmp_path))) as daemon:
            assert daemon.scheduler.get_job(TELEMETRY_JOB) is None
            assert daemon.telemetry.config is None

    def test_the_job_runs_on_its_interval_beside_the_pair_cycle(
        self, tmp_path: Path, replicas: tuple[VllmReplica, VllmReplica]
    ) -> None:
        """Scheduled every `scrape_interval_s`, it stores intervals of both arms; a scrape
        runs while the pair cycle holds its lock."""
        baseline, speculative = replicas
        path = write_config(tmp_path, telemetry_section(baseline.url, speculative.url, 1.0))
        with Daemon(load_settings(path), config_path=path) as daemon:
            job = daemon.scheduler.get_job(TELEMETRY_JOB)
            assert job is not None and job.trigger.interval == timedelta(seconds=1)
            baseline.finish(10)
            speculative.finish(10)
            wait_for(lambda: daemon.store.telemetry("speculative"))
            # Only the run below may scrape from here: a scheduled scrape in flight when
            # `before` was read would count too (before + 2). The job is paused, and one
            # it had started has finished once the job's lock is free.
            daemon.scheduler.pause_job(TELEMETRY_JOB)
            with daemon._cycle_lock:  # a pair generating for minutes blocks no scrape
                with daemon.telemetry._lock:
                    before = daemon.telemetry.scrapes
                daemon.telemetry.run()
                assert daemon.telemetry.scrapes == before + 1
            assert daemon.store.telemetry("baseline")

    def test_a_reload_that_adds_telemetry_starts_the_job(
        self, tmp_path: Path, replicas: tuple[VllmReplica, VllmReplica]
    ) -> None:
        """SIGHUP with a new `[telemetry]` opens its sources and schedules the job."""
        baseline, speculative = replicas
        path = write_config(tmp_path)
        with Daemon(load_settings(path), config_path=path) as daemon:
            assert daemon.scheduler.get_job(TELEMETRY_JOB) is None
            write_config(tmp_path, telemetry_section(baseline.url, speculative.url))
            assert daemon.reload()
            assert daemon.scheduler.get_job(TELEMETRY_JOB) is not None
            assert daemon.telemetry.config == daemon.settings.telemetry
