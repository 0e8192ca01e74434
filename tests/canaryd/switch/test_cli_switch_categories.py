"""`canaryd switch … --category`: one traffic category's switch through the CLI runner on
a real database, exit codes and the messages a person reads."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.config import SwitchConfig
from canaryd.store import SqlStore
from canaryd.switch import SwitchService, read_state_file
from gates import Evaluation, GateDecision, GateMode, GateState, SwitchPolicyConfig

Cli = tuple[CliRunner, list[str], dict[str, str], Path]


@pytest.fixture
def cli(database_url: str, tmp_path: Path) -> Cli:
    state_file = tmp_path / "state" / "switch.json"
    env = {"CANARYD_SWITCH__STATE_FILE": str(state_file), "CANARYD_CONFIG": ""}
    runner = CliRunner()
    upgraded = runner.invoke(app, ["db", "upgrade", "--url", database_url], env=env)
    assert upgraded.exit_code == 0, upgraded.output
    return runner, ["--url", database_url], env, state_file


def _drift(at: datetime, states: dict[str, GateState]) -> GateDecision:
    components = tuple(
        GateDecision(
            name=f"drift.{name}",
            state=state,
            mode=GateMode.ENFORCE,
            critical=False,
            evaluated_at=at,
            detail=f"{name}: {state.value}",
            categories=(name,) if state is not GateState.PASS else (),
            category=name,
        )
        for name, state in states.items()
    )
    worst = GateState.FAIL if GateState.FAIL in states.values() else GateState.PASS
    return GateDecision(
        name="drift",
        state=worst,
        mode=GateMode.ENFORCE,
        critical=False,
        evaluated_at=at,
        components=components,
    )


def _status(runner: CliRunner, url: list[str], env: dict[str, str]) -> str:
    shown = runner.invoke(app, ["switch", "status", *url], env=env)
    assert shown.exit_code == 0, shown.output
    return shown.output


class TestCategorySwitch:
    def test_rollback_of_one_category_leaves_the_rest_on(self, cli: Cli) -> None:
        """The bar: `rollback --category math` turns math off only, status shows it, a
        restore without evidence is refused, a forced one clears it."""
        runner, url, env, state_file = cli
        result = runner.invoke(
            app, ["switch", "rollback", "--category", "math", "--reason", "slow", *url], env=env
        )
        assert result.exit_code == 0, result.output
        assert "switch category math rolled back: mode=rolled_back" in result.output
        assert "speculative_enabled=false" in result.output
        data = read_state_file(state_file)
        assert data is not None
        assert data["mode"] == "auto" and data["speculative_enabled"] is True
        math = data["categories"]["math"]
        assert math["speculative_enabled"] is False and math["reason"] == "slow"
        assert math["control"] == "manual" and math["generation"] == data["generation"] == 1
        output = _status(runner, url, env)
        assert "mode: auto (speculative decoding ENABLED)" in output
        assert "math: rolled_back (speculative decoding DISABLED) control=manual" in output

        refused = runner.invoke(
            app, ["switch", "restore", "--category", "math", "--reason", "ok", *url], env=env
        )
        assert refused.exit_code == 1
        assert "restore of category 'math'" in refused.output
        assert "no gate evaluation" in refused.output

        forced = runner.invoke(
            app,
            ["switch", "restore", "--category", "math", "--reason", "ok", "--force", *url],
            env=env,
        )
        assert forced.exit_code == 0, forced.output
        assert "switch category math restored: mode=auto speculative_enabled=true" in forced.output
        data = read_state_file(state_file)
        assert data is not None and data["categories"]["math"]["speculative_enabled"] is True
        assert data["categories"]["math"]["reason"].startswith("FORCED")
        assert "math: auto (speculative decoding ENABLED)" in _status(runner, url, env)

        trail = runner.invoke(app, ["audit", "--since", "1h", "--json", *url], env=env)
        entries = json.loads(trail.output)
        assert [(e["kind"], e["category"]) for e in entries] == [
            ("transition", "math"),
            ("refused", None),
            ("transition", "math"),
        ]

    def test_restore_needs_the_categorys_own_pass(self, cli: Cli, database_url: str) -> None:
        """A fresh evaluation whose drift check of math FAILed refuses math's restore even
        though another category PASSed; one where math PASSed lets it through."""
        runner, url, env, _ = cli
        runner.invoke(
            app, ["switch", "rollback", "--category", "math", "--reason", "r", *url], env=env
        )
        now = datetime.now(UTC)
        with SqlStore.open(database_url) as store:
            decision = _drift(now, {"math": GateState.FAIL, "code": GateState.PASS})
            store.save_evaluation(Evaluation(now, (decision,)))
        restore = ["switch", "restore", "--category", "math", "--reason", "ok", *url]
        refused = runner.invoke(app, restore, env=env)
        assert refused.exit_code == 1
        assert "drift.math=FAIL" in refused.output
        later = datetime.now(UTC)
        with SqlStore.open(database_url) as store:
            decision = _drift(later, {"math": GateState.PASS, "code": GateState.FAIL})
            store.save_evaluation(Evaluation(later, (decision,)))
        restored = runner.invoke(app, restore, env=env)
        assert restored.exit_code == 0, restored.output
        assert (
            "drift.math" in restored.output and "switch category math restored" in restored.output
        )

    def test_the_master_rollback_turns_every_category_off(self, cli: Cli) -> None:
        """A top-level rollback is off for all; status says so beside the categories."""
        runner, url, env, state_file = cli
        runner.invoke(
            app, ["switch", "auto", "--category", "code", *url], env=env
        )  # nothing to hand back: no transition
        runner.invoke(
            app, ["switch", "rollback", "--category", "math", "--reason", "r", *url], env=env
        )
        runner.invoke(app, ["switch", "rollback", "--reason", "all", *url], env=env)
        output = _status(runner, url, env)
        assert "categories: (the top level is rolled back: all off)" in output
        data = read_state_file(state_file)
        assert data is not None and data["generation"] == 2
        assert list(data["categories"]) == ["math"]

    def test_auto_hands_a_category_back_to_the_gates(self, cli: Cli) -> None:
        runner, url, env, state_file = cli
        runner.invoke(
            app, ["switch", "rollback", "--category", "math", "--reason", "r", *url], env=env
        )
        result = runner.invoke(app, ["switch", "auto", "--category", "math", *url], env=env)
        assert result.exit_code == 0, result.output
        data = read_state_file(state_file)
        assert data is not None
        assert data["categories"]["math"]["control"] == "gates"
        assert data["categories"]["math"]["speculative_enabled"] is False


def test_status_shows_a_category_the_gates_latched(cli: Cli, database_url: str) -> None:
    """A category tripped by the gates under a latch of one trip: status says it is
    latched and cooling down, the state file carries `latched` for it."""
    runner, url, env, state_file = cli
    now = datetime.now(UTC)
    policy = SwitchPolicyConfig(scope="category", latch_trips=1)
    with SqlStore.open(database_url) as store:
        failing = _drift(now, {"math": GateState.FAIL, "code": GateState.PASS})
        store.save_evaluation(Evaluation(now, (failing,)))
        service = SwitchService(
            store, SwitchConfig(state_file=state_file), policy, sleep=lambda _s: None
        )
        service.step_gates(now)
    output = _status(runner, url, env)
    assert (
        "math: rolled_back (speculative decoding DISABLED) control=gates (LATCHED: only a "
        "human can restore)" in output
    )
    assert "cooldown until" in output and "by gate:drift.math" in output
    data = read_state_file(state_file)
    assert data is not None and data["categories"]["math"]["latched"] is True
