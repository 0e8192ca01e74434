"""Per-category rollback end to end: a fake speculative arm whose acceptance drops, or
whose speed falls below the baseline's, in one category only, pairs from the real pair
runner in a real database, gated by `SwitchGates` under `gates.policy.scope =
"category"`: only that category rolls back."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.config import Settings, SwitchConfig
from canaryd.judging.gatejob import SwitchGates
from canaryd.metrics import CanarydMetrics
from canaryd.pairs.runner import PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites
from canaryd.store import SqlStore
from canaryd.switch import SwitchService, emergency_rollback, read_state_file
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from gates import SwitchEvent, SwitchMode, SwitchPolicyConfig
from gates.records import RunInfo

BASE = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
DRY = {"mode": "dry_run"}


def settings(url: str, tmp_path: Path, scope: str) -> Settings:
    """Liveness and drift enforce; drift pins its references after 10 pairs a category."""
    return Settings(
        storage={"url": url},
        switch={"state_file": str(tmp_path / "state" / "switch.json")},
        gates={
            "liveness": {"min_samples": 5, "window_pairs": 10},
            "error": DRY,
            "latency": DRY,
            "quality": DRY,
            "speedup": DRY,
            "drift": {"min_samples": 10, "pin_min_samples": 10, "window_pairs": 600},
            "policy": {"cooldown_seconds": 0, "scope": scope},
        },
    )


class Soak:
    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.index = 0
        prompts = [p for suite in load_default_suites() for p in suite.prompts]
        self.sampler = StratifiedSampler(prompts, seed=3)
        store.create_run(RunInfo("soak", "daemon", BASE, {}, "h", {}, {}, {}))

    def pairs(self, n: int, speculative: FakeEngineConfig) -> datetime:
        runner = PairRunner(
            FakeEngine(FakeEngineConfig(seed=1)), FakeEngine(speculative), run_id="soak"
        )
        for _ in range(n):
            self.index += 1
            record = replace(
                runner.run_pair(self.sampler.next()),
                started_at=BASE + timedelta(seconds=self.index),
            )
            self.store.save_pair(record)
        return BASE + timedelta(seconds=self.index, milliseconds=500)


HEALTHY = FakeEngineConfig(speculative=True, seed=2)
MATH_DRIFTS = HEALTHY.model_copy(update={"acceptance_rate_by_category": {"math": 0.2}})


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened:
        yield opened


def _drift_until_tripped(soak: Soak, hook: SwitchGates, store: SqlStore) -> None:
    hook.evaluate(soak.pairs(120, HEALTHY))  # pins every category's reference
    assert store.switch().state.generation == 0
    for _ in range(10):
        hook.evaluate(soak.pairs(45, MATH_DRIFTS))
        if store.switch().state.generation:
            return
    pytest.fail("the drift in math never tripped the switch")


class TestCategoryScope:
    def test_drift_in_one_category_rolls_back_only_that_category(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        soak = Soak(store)
        hook = SwitchGates(settings(database_url, tmp_path, "category"), store=store)
        _drift_until_tripped(soak, hook, store)
        state = store.switch().state
        assert state.mode is SwitchMode.AUTO and state.speculative_enabled
        assert [name for name, _ in state.categories] == ["math"]
        assert not state.enabled_for("math") and state.enabled_for("code")
        own = state.category("math")
        assert own is not None and own.actor == "gate:drift.math"
        audit = store.audit()
        assert [(e.category, e.target, e.actor) for e in audit] == [
            ("math", "rolled_back", "gate:drift.math")
        ]
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and on_disk["speculative_enabled"] is True
        assert on_disk["categories"]["math"]["speculative_enabled"] is False
        # More drifting evidence changes nothing: math is already off.
        hook.evaluate(soak.pairs(45, MATH_DRIFTS))
        assert store.switch().state.generation == state.generation
        shown = CliRunner().invoke(
            app,
            ["switch", "status", "--url", database_url],
            env={"CANARYD_SWITCH__STATE_FILE": str(tmp_path / "state" / "switch.json")},
        )
        assert shown.exit_code == 0, shown.output
        assert "math: rolled_back (speculative decoding DISABLED) control=gates" in shown.output

    def test_global_scope_rolls_back_everything(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        soak = Soak(store)
        hook = SwitchGates(settings(database_url, tmp_path, "global"), store=store)
        _drift_until_tripped(soak, hook, store)
        state = store.switch().state
        assert state.mode is SwitchMode.ROLLED_BACK and state.actor == "gate:drift"
        assert state.categories == ()

    def test_a_global_fault_still_rolls_back_everything(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        soak = Soak(store)
        hook = SwitchGates(settings(database_url, tmp_path, "category"), store=store)
        hook.evaluate(soak.pairs(20, HEALTHY))
        hook.evaluate(soak.pairs(10, HEALTHY.model_copy(update={"error_rate": 1.0})))
        state = store.switch().state
        assert state.mode is SwitchMode.ROLLED_BACK and state.actor == "gate:liveness"
        assert state.categories == ()


MATH_SLOW = HEALTHY.model_copy(update={"latency_factor_by_category": {"math": 3.0}})


def speedup_settings(url: str, tmp_path: Path, scope: str) -> Settings:
    """Liveness and speedup enforce (speedup decides from 20 pairs a category)."""
    return Settings(
        storage={"url": url},
        switch={"state_file": str(tmp_path / "state" / "switch.json")},
        gates={
            "liveness": {"min_samples": 5, "window_pairs": 10},
            "error": DRY,
            "latency": DRY,
            "quality": DRY,
            "speedup": {"min_samples": 20},
            "drift": DRY,
            "policy": {"cooldown_seconds": 0, "scope": scope},
        },
    )


class TestSlowCategory:
    """The bar: a speculative arm slower in math only (3× its timings there, about 0.65×
    the baseline's speed; about 2× faster elsewhere)."""

    def test_category_scope_rolls_back_only_the_slow_category(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        soak = Soak(store)
        metrics = CanarydMetrics()
        hook = SwitchGates(
            speedup_settings(database_url, tmp_path, "category"),
            store=store,
            metrics=metrics.switch,
        )
        for _ in range(15):
            hook.evaluate(soak.pairs(60, MATH_SLOW))
            if store.switch().state.generation:
                break
        state = store.switch().state
        assert state.generation == 1, "the slow math category never tripped the switch"
        assert state.mode is SwitchMode.AUTO and state.speculative_enabled
        assert not state.enabled_for("math")
        assert all(state.enabled_for(c) for c in ("code", "qa", "extraction", "rag"))
        (entry,) = store.audit()
        assert (entry.category, entry.target, entry.actor) == (
            "math",
            "rolled_back",
            "gate:speedup.math",
        )
        assert "math: median speedup 0." in entry.reason
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and on_disk["speculative_enabled"] is True
        assert on_disk["categories"]["math"]["speculative_enabled"] is False
        gauge = metrics.registry.get_sample_value
        assert gauge("canaryd_switch_category_rolled_back", {"category": "math"}) == 1
        assert gauge("canaryd_switch_category_latched", {"category": "math"}) == 0
        assert gauge("canaryd_switch_rolled_back") == 0
        # The other categories keep being judged, and keep passing: nothing else moves.
        hook.evaluate(soak.pairs(120, MATH_SLOW))
        assert store.switch().state.generation == 1
        latest = store.latest_evaluation()
        assert latest is not None
        (speedup,) = [d for d in latest.decisions if d.name == "speedup"]
        states = {c.category: c.state.value for c in speedup.components}
        assert states["math"] != "PASS" and states["code"] == "PASS"

    def test_global_scope_keeps_everything_on(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Why the scope exists: pooled over all categories the arm is faster, so the
        global speedup gate PASSes and math keeps losing."""
        soak = Soak(store)
        hook = SwitchGates(speedup_settings(database_url, tmp_path, "global"), store=store)
        hook.evaluate(soak.pairs(600, MATH_SLOW))
        assert store.switch().state.generation == 0
        latest = store.latest_evaluation()
        assert latest is not None
        (speedup,) = [d for d in latest.decisions if d.name == "speedup"]
        assert speedup.state.value == "PASS" and speedup.components == ()


class TestKillSwitchKeepsCategories:
    def test_an_emergency_rollback_keeps_the_categories_and_is_adopted(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """The kill switch written while the database is away carries the categories, so
        its adoption rewrites the file without the mark and keeps them."""
        path = tmp_path / "state" / "switch.json"
        switch = SwitchConfig(state_file=path)
        svc = SwitchService(store, switch, SwitchPolicyConfig(), sleep=lambda _s: None)
        svc.command(SwitchEvent("rollback", "ann", "slow", category="math"))
        result = emergency_rollback(switch, "bob", "db down", sleep=lambda _s: None)
        assert result.written and result.state["categories"]["math"]["speculative_enabled"] is False
        change = svc.adopt_pending()
        assert change is not None and change.adopted is not None
        state = store.switch().state
        assert state.mode is SwitchMode.ROLLED_BACK and not state.enabled_for("code")
        assert state.category("math") is not None and state.generation == 2
        on_disk = read_state_file(path)
        assert on_disk is not None and "pending_sync" not in on_disk
        assert on_disk["generation"] == 2 and list(on_disk["categories"]) == ["math"]
