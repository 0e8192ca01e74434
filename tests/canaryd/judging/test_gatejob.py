"""The daemon's gate hook end to end: pairs from the real pair runner over fault-injecting
fake engines, stored in a real database, gated, and the switch flipped, latched and
restored through `SwitchGates.evaluate` and the CLI."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.config import Settings
from canaryd.judging.gatejob import SwitchGates
from canaryd.metrics import CanarydMetrics
from canaryd.pairs.runner import PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites
from canaryd.store import SqlStore
from canaryd.switch import read_state_file
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from gates import SwitchMode
from gates.core import checks
from gates.records import RunInfo

BASE = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
DRY = {"mode": "dry_run"}


def settings(url: str, tmp_path: Path, **policy: object) -> Settings:
    """Only liveness (critical, 5 pairs) enforces, so a short test can PASS and FAIL."""
    return Settings(
        storage={"url": url},
        switch={"state_file": str(tmp_path / "state" / "switch.json")},
        gates={
            "liveness": {"min_samples": 5, "window_pairs": 10},
            "error": DRY,
            "latency": DRY,
            "quality": DRY,
            "speedup": DRY,
            "drift": DRY,
            "policy": {"cooldown_seconds": 0, **policy},
        },
    )


class Soak:
    """Stores pairs from the pair runner, one second apart from its base (ten minutes
    before it was made, so that the evidence is fresh by the real clock, which the CLI's
    restore reads, however late in the session the test runs), and evaluates."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.index = 0
        self.base = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
        self.prompts = [p for suite in load_default_suites() for p in suite.prompts]
        store.create_run(
            RunInfo("soak", "daemon", self.base, {}, "h", {}, {}, {})  # type: ignore[arg-type]
        )

    def pairs(self, n: int, *, error_rate: float = 0.0) -> datetime:
        speculative = FakeEngineConfig(speculative=True, error_rate=error_rate, seed=1)
        runner = PairRunner(
            FakeEngine(FakeEngineConfig(seed=1)), FakeEngine(speculative), run_id="soak"
        )
        sampler = StratifiedSampler(self.prompts, seed=self.index)
        for _ in range(n):
            self.index += 1
            record = replace(
                runner.run_pair(sampler.next()),
                started_at=self.base + timedelta(seconds=self.index),
            )
            self.store.save_pair(record)
        return self.base + timedelta(seconds=self.index, milliseconds=500)


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened:
        yield opened


class TestSwitchGates:
    def test_a_failing_speculative_arm_flips_the_switch(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """A dead speculative arm trips the critical liveness gate: the state file flips,
        an audit row names the gate, and `canaryd switch status` shows the reason."""
        soak = Soak(store)
        metrics = CanarydMetrics()
        hook = SwitchGates(settings(database_url, tmp_path), metrics=metrics.switch, store=store)
        hook.evaluate(soak.pairs(10))
        assert store.switch().state.mode is SwitchMode.AUTO
        hook.evaluate(soak.pairs(10, error_rate=1.0))
        state = store.switch().state
        assert state.mode is SwitchMode.ROLLED_BACK and state.actor == "gate:liveness"
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and on_disk["speculative_enabled"] is False
        audit = store.audit()
        assert [(e.actor, e.target) for e in audit] == [("gate:liveness", "rolled_back")]
        assert audit[0].evidence[0]["state"] == "FAIL"
        assert metrics.registry.get_sample_value("canaryd_switch_rolled_back") == 1
        assert (
            metrics.registry.get_sample_value(
                "canaryd_gate_state", {"gate": "liveness", "state": "FAIL"}
            )
            == 1
        )
        assert (
            metrics.registry.get_sample_value(
                "canaryd_switch_transitions_total",
                {"target": "rolled_back", "actor_kind": "gate"},
            )
            == 1
        )
        shown = CliRunner().invoke(
            app,
            ["switch", "status", "--url", database_url],
            env={"CANARYD_SWITCH__STATE_FILE": str(tmp_path / "state" / "switch.json")},
        )
        assert shown.exit_code == 0, shown.output
        assert "rolled_back" in shown.output and "critical gate FAILed" in shown.output
        assert "(in sync)" in shown.output

    def test_detector_progress_is_exported_per_check(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """After an evaluation each check with a sequential detector exports S / h as
        `canaryd_gate_detector_progress{check}`, the value its stored decision carries;
        a 30 % failing speculative arm pushes the error ceiling's above 0."""
        soak = Soak(store)
        metrics = CanarydMetrics()
        hook = SwitchGates(settings(database_url, tmp_path), metrics=metrics.switch, store=store)
        hook.evaluate(soak.pairs(40, error_rate=0.3))
        evaluation = store.latest_evaluation()
        assert evaluation is not None
        stored = {
            c.name: c.detector.progress
            for c in checks(evaluation.decisions)
            if c.detector is not None
        }
        assert "error.ceiling" in stored and stored["error.ceiling"] > 0
        for check, progress in stored.items():
            exported = metrics.registry.get_sample_value(
                "canaryd_gate_detector_progress", {"check": check}
            )
            assert exported == pytest.approx(progress), check

    def test_restore_needs_fresh_pass_evidence(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """A human restore is refused while the latest evaluation FAILs and accepted after
        a passing one; the refusal is an audit row."""
        soak = Soak(store)
        hook = SwitchGates(settings(database_url, tmp_path), store=store)
        hook.evaluate(soak.pairs(10, error_rate=1.0))
        assert store.switch().state.mode is SwitchMode.ROLLED_BACK
        url = ["--url", database_url]
        env = {"CANARYD_SWITCH__STATE_FILE": str(tmp_path / "state" / "switch.json")}
        refused = CliRunner().invoke(app, ["switch", "restore", "--reason", "try", *url], env=env)
        assert refused.exit_code == 1
        assert "liveness=FAIL" in refused.output and "refused" in refused.output
        hook.evaluate(soak.pairs(10))
        accepted = CliRunner().invoke(app, ["switch", "restore", "--reason", "ok", *url], env=env)
        assert accepted.exit_code == 0, accepted.output
        assert "liveness  PASS" in accepted.output
        assert store.switch().state.mode is SwitchMode.AUTO
        assert [e.kind for e in store.audit()] == ["transition", "refused", "transition"]

    def test_repeated_trips_latch_until_a_human_restores(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """With auto-restore, a second trip within the window latches: passing evidence no
        longer restores, a human restore does."""
        soak = Soak(store)
        config = settings(
            database_url, tmp_path, auto_restore=True, restore_passes=1, latch_trips=2
        )
        hook = SwitchGates(config, store=store)
        hook.evaluate(soak.pairs(10, error_rate=1.0))
        hook.evaluate(soak.pairs(10))
        assert store.switch().state.mode is SwitchMode.AUTO  # auto-restored
        hook.evaluate(soak.pairs(10, error_rate=1.0))
        state = store.switch().state
        assert state.mode is SwitchMode.ROLLED_BACK and state.latched
        hook.evaluate(soak.pairs(10))
        assert store.switch().state.mode is SwitchMode.ROLLED_BACK
        env = {"CANARYD_SWITCH__STATE_FILE": str(tmp_path / "state" / "switch.json")}
        restored = CliRunner().invoke(
            app, ["switch", "restore", "--reason", "fixed", "--url", database_url], env=env
        )
        assert restored.exit_code == 0, restored.output
        assert not store.switch().state.latched
        assert store.switch().state.generation == 4

    def test_nodata_never_trips_nor_restores(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Too few pairs is NODATA: nothing changes, and a restore is refused on it."""
        soak = Soak(store)
        hook = SwitchGates(settings(database_url, tmp_path), store=store)
        hook.evaluate(soak.pairs(2, error_rate=1.0))
        assert store.switch().state.generation == 0
        assert store.latest_evaluation().decisions[0].state.value == "NODATA"  # type: ignore[union-attr]


class TestEvidenceFollowsTheArms:
    def _dead_arm_pairs(self, store: SqlStore, run_id: str, config: dict[str, object]) -> None:
        store.create_run(
            RunInfo(run_id, "daemon", BASE, config, "h", {}, {}, {})  # type: ignore[arg-type]
        )
        runner = PairRunner(
            FakeEngine(FakeEngineConfig(seed=1)),
            FakeEngine(FakeEngineConfig(speculative=True, error_rate=1.0, seed=1)),
            run_id=run_id,
        )
        prompts = [p for suite in load_default_suites() for p in suite.prompts]
        sampler = StratifiedSampler(prompts, seed=1)
        for i in range(10):
            record = runner.run_pair(sampler.next())
            store.save_pair(replace(record, started_at=BASE + timedelta(seconds=i + 1)))

    def test_pairs_from_other_arms_are_not_evidence(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Pairs measured under a different arms configuration (an arm a reload replaced)
        do not count; the same pairs under the configured arms trip the switch."""
        configured = settings(database_url, tmp_path)
        hook = SwitchGates(configured, store=store)
        self._dead_arm_pairs(store, "old-arms", {"arms": {"speculative": {"kind": "other"}}})
        hook.evaluate(BASE + timedelta(seconds=30))
        assert store.switch().state.mode is SwitchMode.AUTO

        self._dead_arm_pairs(store, "current-arms", configured.snapshot())
        hook.evaluate(BASE + timedelta(seconds=31))
        assert store.switch().state.mode is SwitchMode.ROLLED_BACK
