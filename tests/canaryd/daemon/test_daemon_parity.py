"""The daemon's capability probe (canaryd.daemon.parity) on loopback servers: a probe
run is stored as a run of kind `probe` and exported per capability and arm; the job is
scheduled a minute after start, paused by `schedule.probe_interval_s = 0` on reload and
resumed by a positive one; in-process arms are skipped; an arm away is counted, not
raised."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from canaryd.config import load_settings
from canaryd.daemon import Daemon
from canaryd.daemon.parity import ParityJob
from canaryd.daemon.scheduling import PROBE_JOB
from canaryd.metrics import CanarydMetrics
from canaryd.parity import checks
from canaryd.store import SqlStore
from engine.registry import build_engine
from tests.support.capability_server import CapabilityServer
from tests.support.servers import refused_url


def config(tmp_path: Path, baseline: str, candidate: str, schedule: str = "") -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(
        f"""
[arms.baseline]
kind = "openai"
base_url = "{baseline}"
model = "probe-model"
server_kind = "vllm"
[arms.speculative]
kind = "openai"
base_url = "{candidate}"
model = "probe-model"
server_kind = "vllm"
speculative = true
[prompts]
max_tokens = 8
[storage]
url = "sqlite:///{tmp_path / "canaryd.db"}"
[server]
listen = "127.0.0.1:0"
[schedule]
pair_interval_s = 1000
jitter_s = 0
{schedule}
"""
    )
    return path


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    for name in ("CANARYD_CONFIG", "CANARYD_STORAGE__URL", "CANARYD_SERVER__LISTEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(checks, "GAUGE_SETTLE_S", 1.0)


@pytest.fixture
def servers() -> Iterator[tuple[CapabilityServer, CapabilityServer]]:
    with (
        CapabilityServer() as baseline,
        CapabilityServer(broken=["seed_reproducible"]) as candidate,
    ):
        yield baseline, candidate


def sample(metrics: CanarydMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def parity_job(metrics: CanarydMetrics) -> ParityJob:
    return ParityJob(metrics.probe, pair_metrics=metrics.pairs, store_metrics=metrics.store)


class TestDaemonProbe:
    def test_a_probe_is_stored_and_exported(
        self, tmp_path: Path, servers: tuple[CapabilityServer, CapabilityServer]
    ) -> None:
        """The probe job on the daemon's own arms: a run of kind `probe` with the table,
        the regression and each cell's state as metrics; the job waits a minute after
        start, and a reload to 0 pauses it, a positive interval resumes it."""
        baseline, candidate = servers
        path = config(tmp_path, baseline.url, candidate.url)
        daemon = Daemon(load_settings(path), config_path=path)
        daemon.start()
        try:
            job = daemon.scheduler.get_job(PROBE_JOB)
            assert job is not None and job.next_run_time is not None
            assert job.next_run_time > datetime.now(UTC) + timedelta(seconds=50)
            daemon.run_probe()
            metrics = daemon.metrics
            assert sample(metrics, "canaryd_probe_regression", capability="seed_reproducible") == 1
            assert sample(metrics, "canaryd_probe_regression", capability="stop") == 0
            state = "canaryd_probe_capability_state"
            seed = {"capability": "seed_reproducible"}
            assert sample(metrics, state, **seed, arm="baseline", state="pass") == 1
            assert sample(metrics, state, **seed, arm="speculative", state="fail") == 1
            assert sample(metrics, state, **seed, arm="speculative", state="pass") == 0
            assert sample(metrics, "canaryd_probe_runs_total", outcome="regression") == 1
            assert (sample(metrics, "canaryd_last_probe_timestamp_seconds") or 0) > 0

            path.write_text(path.read_text() + "probe_interval_s = 0\n")
            assert daemon.reload()
            assert daemon.scheduler.get_job(PROBE_JOB).next_run_time is None
            path.write_text(
                path.read_text().replace("probe_interval_s = 0", "probe_interval_s = 7200")
            )
            assert daemon.reload()
            assert daemon.scheduler.get_job(PROBE_JOB).next_run_time is not None
        finally:
            daemon.stop()
        with SqlStore.open(f"sqlite:///{tmp_path / 'canaryd.db'}") as store:
            probes = [run for run in store.runs() if run.info.kind == "probe"]
        assert len(probes) == 1
        assert probes[0].info.config["probe"]["regressions"] == ["seed_reproducible"]


class TestParityJob:
    def test_in_process_arms_are_skipped(self, tmp_path: Path) -> None:
        """Arms that are not servers: nothing probed, nothing counted."""
        path = tmp_path / "fake.toml"
        path.write_text(
            '[arms.baseline]\nkind = "fake"\n[arms.speculative]\nkind = "fake"\n'
            f'speculative = true\n[storage]\nurl = "sqlite:///{tmp_path / "f.db"}"\n'
        )
        metrics = CanarydMetrics(CollectorRegistry())
        with SqlStore.open(f"sqlite:///{tmp_path / 'f.db'}", create=True) as store:
            assert parity_job(metrics).run(load_settings(path), {}, store) is None
        assert sample(metrics, "canaryd_probe_runs_total", outcome="failed") == 0

    def test_an_arm_away_is_counted_not_raised(
        self, tmp_path: Path, servers: tuple[CapabilityServer, CapabilityServer]
    ) -> None:
        """A speculative server nobody listens on: the probe fails, counted, no run."""
        baseline, _ = servers
        settings = load_settings(config(tmp_path, baseline.url, refused_url()))
        engines = {
            name: build_engine(settings.arms.arm(name)) for name in ("baseline", "speculative")
        }
        metrics = CanarydMetrics(CollectorRegistry())
        with SqlStore.open(settings.storage.resolved_url(), create=True) as store:
            assert parity_job(metrics).run(settings, engines, store) is None
            assert store.runs() == []
        assert sample(metrics, "canaryd_probe_runs_total", outcome="failed") == 1
