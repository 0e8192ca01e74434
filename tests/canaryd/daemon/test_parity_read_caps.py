"""The daemon's probe job (canaryd.daemon.parity) against hostile speculative servers:
an endless stream is cut at each answer's byte cap and counted in
canaryd_read_caps_total; a server that drips from its first byte is cut at the job's
deadline, and a run that proved nothing is counted as a failed probe, not as parity."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from canaryd.config import Settings, load_settings
from canaryd.daemon import parity
from canaryd.daemon.parity import ParityJob
from canaryd.metrics import CanarydMetrics
from canaryd.parity import checks
from canaryd.store import SqlStore
from engine.base import Engine
from engine.registry import build_engine
from tests.support.capability_server import CapabilityServer
from tests.support.servers import Behaviour, MisbehavingServer


def settings(tmp_path: Path, baseline: str, candidate: str) -> Settings:
    path = tmp_path / "canaryd.toml"
    path.write_text(
        f"""
[arms.baseline]
kind = "openai"
base_url = "{baseline}"
model = "probe-model"
[arms.speculative]
kind = "openai"
base_url = "{candidate}"
model = "probe-model"
speculative = true
[storage]
url = "sqlite:///{tmp_path / "canaryd.db"}"
"""
    )
    return load_settings(path)


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    for name in ("CANARYD_CONFIG", "CANARYD_STORAGE__URL", "CANARYD_SERVER__LISTEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(checks, "GAUGE_SETTLE_S", 1.0)


@pytest.fixture
def servers() -> Iterator[tuple[CapabilityServer, MisbehavingServer]]:
    with CapabilityServer() as baseline, MisbehavingServer() as candidate:
        yield baseline, candidate


def probe_once(config: Settings, metrics: CanarydMetrics) -> None:
    engines: dict[str, Engine] = {
        name: build_engine(config.arms.arm(name)) for name in ("baseline", "speculative")
    }
    try:
        with SqlStore.open(config.storage.resolved_url(), create=True) as store:
            job = ParityJob(metrics.probe, pair_metrics=metrics.pairs, store_metrics=metrics.store)
            job.run(config, engines, store)
    finally:
        for engine in engines.values():
            engine.close()


def sample(metrics: CanarydMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


class TestParityJobReadCaps:
    @pytest.mark.timeout(120)
    def test_an_endless_server_is_cut_and_counted(
        self, tmp_path: Path, servers: tuple[CapabilityServer, MisbehavingServer]
    ) -> None:
        """Every answer of an endless speculative server is cut at its byte cap: the
        regressions are exported as usual and each cut answer is counted by its cap."""
        baseline, candidate = servers
        candidate.default = Behaviour(fault="endless", token_delay_s=0.002)
        metrics = CanarydMetrics(CollectorRegistry())
        probe_once(settings(tmp_path, baseline.url, candidate.url), metrics)
        assert sample(metrics, "canaryd_probe_runs_total", outcome="regression") == 1
        caps = "canaryd_read_caps_total"
        assert sample(metrics, caps, what="probe_answer_bytes") == 26
        assert sample(metrics, caps, what="generation_bytes") == 2
        assert sample(metrics, caps, what="probe_deadline") == 0

    def test_a_dripping_server_holds_the_job_no_longer_than_its_deadline(
        self,
        tmp_path: Path,
        servers: tuple[CapabilityServer, MisbehavingServer],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A speculative server dripping a byte every 0.5 s from its first answer: the
        job (which holds the daemon's cycle lock) returns by its deadline (3 s here), the
        generation it cut is counted, and the run, which proved nothing, is a failed
        probe rather than parity."""
        monkeypatch.setattr(parity, "PROBE_TIMEOUT_S", 3.0)
        baseline, candidate = servers
        candidate.default = Behaviour(fault="drip", drip_s=0.5)
        metrics = CanarydMetrics(CollectorRegistry())
        started = time.monotonic()
        probe_once(settings(tmp_path, baseline.url, candidate.url), metrics)
        assert time.monotonic() - started < 3 + 2.0
        assert sample(metrics, "canaryd_probe_runs_total", outcome="failed") == 1
        assert sample(metrics, "canaryd_probe_runs_total", outcome="parity") == 0
        assert sample(metrics, "canaryd_read_caps_total", what="probe_deadline") == 1
