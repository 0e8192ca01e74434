"""The gate job with several speculative arms, on a real database: the switch follows only
`switch.arm`'s pairs; a comparison arm is gated (every gate `warn`) and its decisions are
stored under its name, but however badly it does, it never moves the switch."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from canaryd.config import Settings
from canaryd.judging.gatejob import SwitchGates
from canaryd.metrics import CanarydMetrics
from canaryd.pairs.plan import new_run
from canaryd.pairs.runner import PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites
from canaryd.store import SqlStore
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from gates import GateMode, GatesConfig, SwitchMode
from gates.cycle import advisory

BASE = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
DRY = {"mode": "dry_run"}


def arm(**overrides: Any) -> dict[str, Any]:
    return {"kind": "fake", "speculative": True, "seed": 1, **overrides}


def settings(url: str, tmp_path: Path, *, medusa: dict[str, Any] | None = None) -> Settings:
    """Three fake arms, the switch on hydra; only liveness (5 pairs) enforces."""
    return Settings(
        arms={"baseline": {"kind": "fake", "seed": 1}, "hydra": arm(), "medusa": medusa or arm()},
        storage={"url": url},
        switch={"state_file": str(tmp_path / "switch.json"), "arm": "hydra"},
        gates={
            "liveness": {"min_samples": 5, "window_pairs": 10},
            "error": DRY,
            "latency": DRY,
            "quality": DRY,
            "speedup": DRY,
            "drift": DRY,
            "policy": {"cooldown_seconds": 0},
        },
    )


class Soak:
    """Groups of pairs on hydra and medusa, one second apart, under a run of `settings`."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.index = 0
        self.prompts = [p for suite in load_default_suites() for p in suite.prompts]

    def groups(self, settings: Settings, n: int, **error_rates: float) -> datetime:
        engines = {
            "baseline": FakeEngine(FakeEngineConfig(seed=1)),
            **{
                name: FakeEngine(
                    FakeEngineConfig(speculative=True, seed=1, error_rate=error_rates.get(name, 0))
                )
                for name in ("hydra", "medusa")
            },
        }
        run = new_run(settings, "daemon", engines, run_id=f"run-{self.index}")
        self.store.create_run(run)
        runner = PairRunner(
            engines["baseline"],
            {"hydra": engines["hydra"], "medusa": engines["medusa"]},
            run_id=run.run_id,
        )
        sampler = StratifiedSampler(self.prompts, seed=self.index)
        for _ in range(n):
            self.index += 1
            at = BASE + timedelta(seconds=self.index)
            for record in runner.run_group(sampler.next()).records:
                self.store.save_pair(replace(record, started_at=at))
        return BASE + timedelta(seconds=self.index, milliseconds=500)


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened:
        yield opened


def liveness(store: SqlStore, comparison_arm: str | None = None) -> tuple[str, str, int]:
    evaluation = store.latest_evaluation(comparison_arm=comparison_arm)
    assert evaluation is not None
    [decision] = [d for d in evaluation.decisions if d.name == "liveness"]
    return decision.state.value, decision.mode.value, decision.n_speculative


class TestComparisonArms:
    def test_a_dead_comparison_arm_never_switches(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Medusa failing every request fails its own (warn) liveness, stored under its
        name; the switch, on hydra's healthy pairs, stays on and has no audit row."""
        config = settings(database_url, tmp_path)
        soak = Soak(store)
        hook = SwitchGates(config, metrics=CanarydMetrics().switch, store=store)
        for _ in range(3):
            hook.evaluate(soak.groups(config, 10, medusa=1.0))
        assert store.switch().state.mode is SwitchMode.AUTO
        assert store.audit() == []
        assert liveness(store) == ("PASS", "enforce", 10)
        assert liveness(store, "medusa") == ("FAIL", "warn", 10)
        assert store.latest_evaluation(comparison_arm="hydra") is None

    def test_the_switch_follows_its_arm(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Hydra failing trips the switch even while medusa is healthy."""
        config = settings(database_url, tmp_path)
        soak = Soak(store)
        hook = SwitchGates(config, store=store)
        hook.evaluate(soak.groups(config, 10))
        hook.evaluate(soak.groups(config, 10, hydra=1.0))
        state = store.switch().state
        assert state.mode is SwitchMode.ROLLED_BACK and state.actor == "gate:liveness"
        assert liveness(store, "medusa") == ("PASS", "warn", 10)

    def test_changing_a_comparison_arm_keeps_the_switch_arms_evidence(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Pairs measured before medusa's configuration changed still count for hydra;
        medusa's own old pairs no longer count for medusa."""
        before = settings(database_url, tmp_path)
        soak = Soak(store)
        now = soak.groups(before, 10)
        after = settings(database_url, tmp_path, medusa=arm(num_draft_tokens=7))
        SwitchGates(after, store=store).evaluate(now)
        assert liveness(store) == ("PASS", "enforce", 10)
        assert liveness(store, "medusa")[2] == 0


class TestAdvisory:
    def test_every_gate_warns(self) -> None:
        """The comparison arms' configuration is the switch's, every gate in `warn`."""
        config = advisory(GatesConfig())
        for section in ("liveness", "error", "latency", "quality", "speedup", "drift"):
            assert getattr(config, section).mode is GateMode.WARN
        assert config.policy == GatesConfig().policy
