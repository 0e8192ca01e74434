"""The daemon with several speculative arms, on fake engines and a real SQLite file: every
cycle sends each prompt to all arms and stores a pair per arm, the metrics label each
arm by its name, and a reload that drops or adds an arm rebuilds only that arm."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.config import load_settings
from canaryd.daemon import Daemon
from canaryd.judging.gatejob import SwitchGates
from canaryd.store import SqlStore

ARMS = """
[arms.baseline]
kind = "fake"
[arms.hydra]
kind = "fake"
speculative = true
acceptance_rate = 0.9
[arms.medusa]
kind = "fake"
speculative = true
acceptance_rate = 0.4
error_rate = 1.0
[switch]
arm = "hydra"
"""


def write(tmp_path: Path, arms: str) -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(
        arms
        + f"""
[storage]
url = "sqlite:///{tmp_path / "canaryd.db"}"
[server]
listen = "127.0.0.1:0"
[gates.liveness]
min_samples = 3
window_pairs = 6
"""
    )
    return path


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    for name in ("CANARYD_CONFIG", "CANARYD_STORAGE__URL", "CANARYD_SWITCH__ARM"):
        monkeypatch.delenv(name, raising=False)
    path = write(tmp_path, ARMS)
    settings = load_settings(path)
    running = Daemon(settings, config_path=path, gates=SwitchGates(lambda: running.settings))
    running.start(schedule=False)
    try:
        yield running
    finally:
        running.stop()


def sample(daemon: Daemon, name: str, **labels: str) -> float | None:
    return daemon.metrics.registry.get_sample_value(name, labels)


class TestDaemonArms:
    def test_cycles_store_a_pair_per_arm_and_label_metrics_by_arm(self, daemon: Daemon) -> None:
        """Three cycles: three prompts, six pairs (hydra's and medusa's), the baseline and
        the prompt counted once each, and every arm's series under its own name."""
        assert list(daemon.engines) == ["baseline", "hydra", "medusa"]
        for _ in range(3):
            daemon.run_cycle()
        pairs = daemon.store.pairs(run_id=daemon.run_id)
        assert sorted(p.arm for p in pairs) == ["hydra"] * 3 + ["medusa"] * 3
        assert len({p.group_id for p in pairs}) == 3
        for arm in ("baseline", "hydra", "medusa"):
            assert sample(daemon, "canaryd_engine_ready", arm=arm) == 1
        assert sample(daemon, "canaryd_engine_ready", arm="speculative") is None
        total = sum(
            s.value
            for family in daemon.metrics.registry.collect()
            for s in family.samples
            if s.name == "canaryd_pairs_total"
        )
        assert total == 3
        assert (
            sum(
                sample(
                    daemon, "canaryd_e2e_seconds_count", arm="baseline", category=p.prompt.category
                )
                or 0
                for p in {p.prompt.category: p for p in pairs}.values()
            )
            == 3
        )
        assert sample(daemon, "canaryd_errors_total", arm="medusa", kind="http") == 3
        assert sample(daemon, "canaryd_errors_total", arm="hydra", kind="http") == 0
        steps = [
            s
            for family in daemon.metrics.registry.collect()
            for s in family.samples
            if s.name == "canaryd_speculative_verify_steps_total"
        ]
        assert {s.labels["arm"] for s in steps} == {"hydra"}, "medusa never succeeded"

    def test_gates_keep_the_switch_on_while_a_comparison_arm_fails(self, daemon: Daemon) -> None:
        """Medusa fails every request: its own evaluation fails liveness in `warn`; the
        switch, gated on hydra, stays on (five failures in a row: liveness's shortest run)."""
        for _ in range(5):
            daemon.run_cycle()
        daemon.evaluate_gates()
        store = daemon.store
        assert store.switch().state.mode.value == "auto"
        ours = store.latest_evaluation()
        theirs = store.latest_evaluation(comparison_arm="medusa")
        assert ours is not None and theirs is not None
        state = {d.name: (d.state.value, d.mode.value) for d in theirs.decisions}
        assert state["liveness"] == ("FAIL", "warn")
        assert {d.name: d.state.value for d in ours.decisions}["liveness"] == "PASS"
        shown = CliRunner().invoke(app, ["gates", "--config", str(daemon.config_path), "--json"])
        assert shown.exit_code == 0, shown.output
        payload = json.loads(shown.stdout)
        assert payload["arm"] == "hydra" and list(payload["comparison_arms"]) == ["medusa"]
        [medusa] = [
            g for g in payload["comparison_arms"]["medusa"]["gates"] if g["name"] == "liveness"
        ]
        assert (medusa["state"], medusa["mode"]) == ("FAIL", "warn")
        text = CliRunner().invoke(app, ["gates", "--config", str(daemon.config_path)])
        assert "comparison arm medusa (gated in warn mode, never switches):" in text.stdout
        page = daemon.config_path.parent / "report.html"
        report = CliRunner().invoke(
            app, ["report", "-c", str(daemon.config_path), "--since", "1h", "--out", str(page)]
        )
        assert report.exit_code == 0, report.output
        assert "| medusa | liveness | FAIL | warn |" in report.stdout
        assert "Comparison arms: latest gate decisions" in page.read_text()

    def test_reload_without_an_arm_closes_it_and_drops_its_series(
        self, daemon: Daemon, tmp_path: Path
    ) -> None:
        """Dropping medusa keeps baseline's and hydra's engines, closes medusa's and
        removes its engine-ready series; later cycles store hydra's pairs only."""
        before = daemon.engines
        write(tmp_path, ARMS.split("[arms.medusa]")[0])  # baseline and hydra, as they were
        assert daemon.reload()
        after = daemon.engines
        assert list(after) == ["baseline", "hydra"]
        assert after["baseline"] is before["baseline"] and after["hydra"] is before["hydra"]
        assert sample(daemon, "canaryd_engine_ready", arm="medusa") is None
        daemon.run_cycle()
        with SqlStore.open(daemon.settings.storage.resolved_url()) as store:
            assert [p.arm for p in store.pairs(run_id=daemon.run_id)] == ["hydra"]
