"""A gate run that fails fails safe and is seen: it is counted, /readyz turns 503 after a
few in a row, and the state file's `confirmed_at` moves only when a run completed; a
follower carries the leader's last completed run forward, never its own clock; a state
file that cannot be written makes /readyz say so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from canaryd.config import load_settings
from canaryd.daemon import Daemon
from canaryd.daemon.health import GATE_FAILURES_NOT_READY
from canaryd.judging.gatejob import SwitchGates
from canaryd.metrics import CanarydMetrics
from canaryd.store import SqlStore
from canaryd.switch import SwitchService, read_state_file
from tests.canaryd.daemon.test_daemon import (  # _clean_env: test_daemon's autouse isolation
    _clean_env,  # noqa: F401
    get,
    sample,
    write_config,
)


def config(tmp_path: Path, state_file: Path) -> Path:
    """test_daemon's config on fake arms, with the state file at `state_file`."""
    return write_config(tmp_path, f'[switch]\nstate_file = "{state_file}"\n')


class FailingGates(SwitchGates):
    """Real gates whose run raises after the policy step, before the run completes (as a
    comparison arm's evaluation or the pruning might), while `failing` is set."""

    failing = True

    def _evaluate_comparison_arms(self, store: Any, now: datetime) -> None:
        if self.failing:
            raise OverflowError("date value out of range")
        super()._evaluate_comparison_arms(store, now)


class TestFailedGateRuns:
    def test_are_counted_turn_readiness_off_and_never_confirm_the_state_file(
        self, tmp_path: Path
    ) -> None:
        """Three failed runs in a row: counted as failed, /readyz 503 naming them, and the
        file's `confirmed_at` stays where the last completed run left it; one completed
        run makes the daemon ready again and confirms the file."""
        state_file = tmp_path / "run" / "switch.json"
        settings = load_settings(config(tmp_path, state_file))
        gates = FailingGates(settings)
        daemon = Daemon(settings, gates=gates)
        daemon.start(schedule=False)
        try:
            assert get(daemon, "/readyz").status_code == 200
            for _ in range(GATE_FAILURES_NOT_READY):
                daemon.evaluate_gates()
            assert sample(daemon, "canaryd_gate_runs_total", outcome="failed") == 3
            answer = get(daemon, "/readyz")
            assert answer.status_code == 503
            assert answer.json()["gate_failures_in_a_row"] == 3
            assert any("gate runs failed" in p for p in answer.json()["problems"])
            data = read_state_file(state_file)
            assert data is not None and "confirmed_at" not in data
            assert gates.service.record().gates_completed_at is None

            gates.failing = False
            before = datetime.now(UTC)
            daemon.evaluate_gates()
            assert get(daemon, "/readyz").status_code == 200
            assert sample(daemon, "canaryd_gate_runs_total", outcome="ok") == 1
            data = read_state_file(state_file)
            assert data is not None and datetime.fromisoformat(data["confirmed_at"]) >= before
            assert sample(daemon, "canaryd_last_gate_run_success_timestamp_seconds") > 0
            # A router on another host reads the same object over HTTP (/v1/switch).
            served = get(daemon, "/v1/switch")
            assert served.status_code == 200 and served.json() == data
            assert served.headers["etag"].startswith(f'"{data["generation"]}-')
        finally:
            daemon.stop()
            gates.close()


class TestFollowers:
    def test_carry_the_leaders_last_completed_run_not_their_clock(self, tmp_path: Path) -> None:
        """A follower's file is confirmed at the stored time of the leader's last completed
        gate run; while the leader is frozen, that time, and so the file, only ages."""
        state_file = tmp_path / "follower" / "switch.json"
        settings = load_settings(config(tmp_path, state_file))
        with SqlStore.open(settings.storage.resolved_url(), create=True) as store:
            follower = SwitchService(store, settings.switch, settings.gates.policy)
            follower.follow()
            data = read_state_file(state_file)
            assert data is None or "confirmed_at" not in data  # nothing completed yet
            completed = datetime.now(UTC) - timedelta(minutes=7)
            store.record_gate_run(completed)
            for _ in range(3):  # the leader is frozen: the follower's runs go on
                follower.follow()
                data = read_state_file(state_file)
                assert data is not None and data["confirmed_at"] == completed.isoformat()
            store.record_gate_run(completed - timedelta(minutes=1))  # never goes back
            assert store.switch().gates_completed_at == completed


class TestUnwritableStateFile:
    def test_readiness_says_so(self, tmp_path: Path) -> None:
        """The state file's directory is a file: writes fail, are counted, and /readyz
        answers 503 naming the state file."""
        blocker = tmp_path / "run"
        blocker.write_text("not a directory")
        settings = load_settings(config(tmp_path, blocker / "switch.json"))
        metrics = CanarydMetrics()
        gates = SwitchGates(settings, metrics=metrics.switch)
        daemon = Daemon(settings, gates=gates, metrics=metrics)
        daemon.start(schedule=False)
        try:
            daemon.evaluate_gates()
            answer = get(daemon, "/readyz")
            assert answer.status_code == 503
            assert answer.json()["state_file"] == "failing"
            assert any("state file not written" in p for p in answer.json()["problems"])
            assert sample(daemon, "canaryd_actuator_failures_total", actuator="state_file") >= 1
        finally:
            daemon.stop()
            gates.close()
