"""The rollback switch's service and actuators on real databases, files, processes and
HTTP servers on loopback: state file, generations under concurrent writers, hooks,
failures that never revert the state, re-application after a restart, and the kill switch
while the database is down (the emergency file and its adoption by the database)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from canaryd.config import (
    AlertmanagerConfig,
    CommandHookConfig,
    Settings,
    SwitchConfig,
    WebhookConfig,
)
from canaryd.errors import ActuatorError, CanarydError
from canaryd.judging.gatejob import SwitchGates
from canaryd.metrics import CanarydMetrics
from canaryd.store import SqlStore
from canaryd.switch import (
    EMERGENCY_REASON_PREFIX,
    SYNCED_NOTE,
    SwitchService,
    WebhookActuator,
    build_actuators,
    emergency_rollback,
    read_state_file,
    state_object,
    without_freshness,
    write_state_file,
)
from canaryd.switch.actuators import COMMAND_ENV_ALLOWLIST, run_actuator
from gates import (
    Control,
    Evaluation,
    GateDecision,
    GateMode,
    GateState,
    SwitchEvent,
    SwitchMode,
    SwitchPolicyConfig,
)

POLICY = SwitchPolicyConfig()


def service(
    store: SqlStore,
    tmp_path: Path,
    policy: SwitchPolicyConfig = POLICY,
    *,
    metrics: CanarydMetrics | None = None,
    **config: object,
) -> SwitchService:
    switch = SwitchConfig(state_file=tmp_path / "state" / "switch.json", **config)  # type: ignore[arg-type]
    family = (metrics or CanarydMetrics()).switch
    return SwitchService(store, switch, policy, metrics=family, sleep=lambda _s: None)


def file_state(path: Path) -> dict[str, object] | None:
    """The state file's state object, its `confirmed_at` aside."""
    data = read_state_file(path)
    return None if data is None else without_freshness(data)


def rollback(reason: str = "p99 regression", user: str = "alice") -> SwitchEvent:
    return SwitchEvent("rollback", user, reason)


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened:
        yield opened


class TestStateFile:
    def test_rollback_writes_the_state_object_atomically(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """A rollback leaves exactly switch.json (no temp file) holding the documented fields."""
        svc = service(store, tmp_path)
        svc.command(rollback())
        data = read_state_file(tmp_path / "state" / "switch.json")
        assert data is not None
        assert data["mode"] == "rolled_back"
        assert data["speculative_enabled"] is False
        assert data["reason"] == "p99 regression"
        assert data["actor"] == "user:alice"
        assert data["generation"] == 1
        assert data["since"]
        assert sorted(
            p.name for p in (tmp_path / "state").iterdir() if not p.name.startswith(".")
        ) == ["switch.json"]
        assert not list((tmp_path / "state").glob(".switch.json.*.tmp"))

    def test_a_lower_generation_never_replaces_a_higher_one(self, tmp_path: Path) -> None:
        """A slow writer with an older generation leaves the newer file in place."""
        path = tmp_path / "state" / "switch.json"
        assert write_state_file(path, {"generation": 5, "mode": "rolled_back"})
        assert not write_state_file(path, {"generation": 4, "mode": "auto"})
        assert read_state_file(path) == {"generation": 5, "mode": "rolled_back"}

    def test_a_newer_file_than_the_database_is_continued_above(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """A state file left at generation 7 by an earlier database makes the next change 8."""
        write_state_file(tmp_path / "state" / "switch.json", {"generation": 7, "mode": "auto"})
        change = service(store, tmp_path).command(rollback())
        assert change.state.generation == 8
        assert read_state_file(tmp_path / "state" / "switch.json")["mode"] == "rolled_back"  # type: ignore[index]


class TestConcurrentWriters:
    def test_generation_is_monotonic_under_concurrent_writers(
        self, database_url: str, tmp_path: Path
    ) -> None:
        """Threads with their own connections rolling back and restoring at once get
        distinct, consecutive generations, one audit row each."""
        with SqlStore.open(database_url, create=True):
            pass
        errors: list[BaseException] = []

        def worker(index: int) -> None:
            try:
                with SqlStore.open(database_url) as own:
                    svc = service(own, tmp_path)
                    for round_ in range(4):
                        if (index + round_) % 2:
                            svc.command(rollback(user=f"u{index}"))
                        else:
                            svc.command(SwitchEvent("restore", f"u{index}", "x", force=True))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        with SqlStore.open(database_url) as check:
            transitions = [e for e in check.audit() if e.kind == "transition"]
            generations = [e.generation for e in transitions]
            assert sorted(generations) == list(range(1, len(generations) + 1))
            assert check.switch().state.generation == len(generations)
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and on_disk["generation"] == len(generations)


class _Receiver(BaseHTTPRequestHandler):
    answers: list[int]
    received: list[tuple[bytes, dict[str, str]]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((body, dict(self.headers)))
        code = self.answers.pop(0) if self.answers else 200
        self.send_response(code)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, type[_Receiver]]]:
    handler = type("Receiver", (_Receiver,), {"answers": [], "received": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler
    server.shutdown()
    server.server_close()


class TestWebhook:
    def test_retries_after_a_500_and_signs_the_body(
        self, store: SqlStore, tmp_path: Path, receiver: tuple[str, type[_Receiver]]
    ) -> None:
        """A 500 is retried; the delivered body carries a valid HMAC-SHA256 signature."""
        url, handler = receiver
        handler.answers.extend([500])
        svc = service(store, tmp_path, webhook=WebhookConfig(url=url, secret="s3cret"))
        change = svc.command(rollback())
        assert change.report is not None and change.report.ok
        assert len(handler.received) == 2
        body, headers = handler.received[-1]
        expected = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
        assert headers["X-Canaryd-Signature"] == expected
        assert json.loads(body)["mode"] == "rolled_back"
        assert store.switch().applied

    def test_reads_the_secret_from_a_file(self, tmp_path: Path) -> None:
        """secret_file is read and stripped of its trailing newline."""
        secret = tmp_path / "secret"
        secret.write_text("from-file\n")
        actuator = WebhookActuator(WebhookConfig(url="http://x", secret_file=secret))
        assert actuator._secret == b"from-file"

    def test_an_unset_secret_env_is_an_actuator_error(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The error names the actuator and the reason, and is one the CLI prints."""
        monkeypatch.delenv("CANARYD_TEST_NO_SUCH_SECRET", raising=False)
        config = WebhookConfig(url="http://x", secret_env="CANARYD_TEST_NO_SUCH_SECRET")
        with pytest.raises(ActuatorError) as caught:
            WebhookActuator(config)
        error = caught.value
        assert isinstance(error, CanarydError) and isinstance(error, RuntimeError)
        assert (error.actuator, error.reason) == (
            "webhook",
            "secret_env 'CANARYD_TEST_NO_SUCH_SECRET' is not set",
        )
        assert str(error) == (
            "switch actuator 'webhook' failed: secret_env 'CANARYD_TEST_NO_SUCH_SECRET' is not set"
        )


class TestCommandHook:
    def test_the_command_receives_the_state_in_its_environment(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """CANARYD_SWITCH_MODE and friends reach the hook's process."""
        out = tmp_path / "env.json"
        script = (
            "import json, os, sys; json.dump({k: v for k, v in os.environ.items() "
            "if k.startswith('CANARYD_SWITCH_')}, open(sys.argv[1], 'w'))"
        )
        hook = CommandHookConfig(argv=[sys.executable, "-c", script, str(out)])
        service(store, tmp_path, command=hook).command(rollback())
        env = json.loads(out.read_text())
        assert env["CANARYD_SWITCH_MODE"] == "rolled_back"
        assert env["CANARYD_SWITCH_SPECULATIVE_ENABLED"] == "false"
        assert env["CANARYD_SWITCH_GENERATION"] == "1"
        assert env["CANARYD_SWITCH_ACTOR"] == "user:alice"
        assert json.loads(env["CANARYD_SWITCH_JSON"])["reason"] == "p99 regression"


class TestActuatorFailure:
    def test_a_failing_hook_keeps_the_state_and_is_counted(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """A hook that exits 3 is retried and counted; the rollback and its file stand."""
        hook = CommandHookConfig(argv=[sys.executable, "-c", "raise SystemExit(3)"], retries=2)
        metrics = CanarydMetrics()
        svc = service(store, tmp_path, metrics=metrics, command=hook)
        change = svc.command(rollback())
        assert change.report is not None and "command" in change.report.failures
        record = store.switch()
        assert record.state.mode is SwitchMode.ROLLED_BACK
        assert not record.applied and "exited with 3" in record.actuator_errors["command"]
        assert read_state_file(tmp_path / "state" / "switch.json")["mode"] == "rolled_back"  # type: ignore[index]
        assert (
            metrics.registry.get_sample_value(
                "canaryd_actuator_failures_total", {"actuator": "command"}
            )
            == 3
        )

    def test_restart_reapplies_a_failed_generation(self, store: SqlStore, tmp_path: Path) -> None:
        """A fresh service re-runs the hook that failed and rewrites a deleted state file."""
        marker = tmp_path / "ran"
        failing = CommandHookConfig(argv=[sys.executable, "-c", "raise SystemExit(1)"], retries=0)
        service(store, tmp_path, command=failing).command(rollback())
        (tmp_path / "state" / "switch.json").unlink()
        fixed = CommandHookConfig(
            argv=[sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ok')"]
        )
        report = service(store, tmp_path, command=fixed).ensure_applied()
        assert report is not None and report.ok
        assert marker.read_text() == "ok"
        assert read_state_file(tmp_path / "state" / "switch.json")["generation"] == 1  # type: ignore[index]
        assert store.switch().applied
        assert service(store, tmp_path, command=fixed).ensure_applied() is None


UNSET_SECRET = "CANARYD_TEST_UNSET_WEBHOOK_SECRET"


@pytest.fixture
def unset_secret(monkeypatch: pytest.MonkeyPatch) -> WebhookConfig:
    """A webhook whose secret_env is not set here, as in an operator's shell."""
    monkeypatch.delenv(UNSET_SECRET, raising=False)
    return WebhookConfig(url="http://127.0.0.1:1/hook", secret_env=UNSET_SECRET, retries=0)


class TestHooksThatCannotBeBuilt:
    def test_build_actuators_stands_in_for_a_hook_it_cannot_build(
        self, unset_secret: WebhookConfig
    ) -> None:
        """Every configured hook is there, in order; the one that cannot be built reports
        why through `on_error` and fails each attempt with that reason, counted."""
        config = SwitchConfig(
            command=CommandHookConfig(argv=["true"]),
            webhook=unset_secret,
            alertmanager=AlertmanagerConfig(url="http://127.0.0.1:1"),
        )
        errors: list[ActuatorError] = []
        actuators = build_actuators(config, on_error=errors.append)
        assert [a.name for a in actuators] == ["command", "webhook", "alertmanager"]
        assert [(e.actuator, e.reason) for e in errors] == [
            ("webhook", f"secret_env {UNSET_SECRET!r} is not set")
        ]
        metrics = CanarydMetrics()
        state = {"generation": 1, "mode": "rolled_back", "speculative_enabled": False}
        error = run_actuator(actuators[1], state, metrics=metrics.switch, sleep=lambda _s: None)
        assert error == f"secret_env {UNSET_SECRET!r} is not set"
        assert actuators[1].keepalive(state, datetime.now(UTC)) is False
        assert (
            metrics.registry.get_sample_value(
                "canaryd_actuator_failures_total", {"actuator": "webhook"}
            )
            == 1
        )

    def test_a_hook_that_cannot_be_built_never_stops_the_change(
        self, store: SqlStore, tmp_path: Path, unset_secret: WebhookConfig
    ) -> None:
        """The rollback is committed, the file written and the other hooks run; the
        webhook is a failed actuation on the row, which the daemon re-applies."""
        marker = tmp_path / "ran"
        hook = CommandHookConfig(argv=[sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
        change = service(store, tmp_path, command=hook, webhook=unset_secret).command(rollback())
        assert change.state.mode is SwitchMode.ROLLED_BACK
        assert change.report is not None
        assert change.report.failures == {"webhook": f"secret_env {UNSET_SECRET!r} is not set"}
        assert marker.exists()
        assert read_state_file(tmp_path / "state" / "switch.json")["generation"] == 1  # type: ignore[index]
        record = store.switch()
        assert record.state.generation == 1 and not record.applied
        assert record.actuator_errors == change.report.failures

    def test_the_emergency_rollback_records_a_hook_it_cannot_build(
        self, tmp_path: Path, unset_secret: WebhookConfig
    ) -> None:
        """With the database down too, the file is written and the webhook reported."""
        switch = SwitchConfig(state_file=tmp_path / "state" / "switch.json", webhook=unset_secret)
        result = emergency_rollback(switch, "alice", "db down", sleep=lambda _s: None)
        assert result.written
        assert result.failures == {"webhook": f"secret_env {UNSET_SECRET!r} is not set"}
        assert read_state_file(tmp_path / "state" / "switch.json")["pending_sync"] is True  # type: ignore[index]


# --- the kill switch while the database is down -----------------------------------------


def emergency(tmp_path: Path, reason: str = "db down", **config: object) -> dict[str, object]:
    """Write the emergency file as `canaryd switch rollback` does with the database down."""
    switch = SwitchConfig(state_file=tmp_path / "state" / "switch.json", **config)  # type: ignore[arg-type]
    result = emergency_rollback(switch, "alice", reason, sleep=lambda _s: None)
    assert result.written, result.file_error
    return result.state


def liveness(state: GateState, at: datetime) -> Evaluation:
    """One evaluation with only the critical, enforced liveness gate."""
    decision = GateDecision("liveness", state, GateMode.ENFORCE, True, at, detail=state.value)
    return Evaluation(at, (decision,))


class TestEmergencyRollback:
    def test_writes_a_pending_manual_rollback_above_the_file(self, tmp_path: Path) -> None:
        """The emergency file is a manual rollback one generation above the old file,
        with the EMERGENCY reason, the user as actor and `pending_sync`."""
        path = tmp_path / "state" / "switch.json"
        write_state_file(path, {"generation": 4, "mode": "auto", "latched": True})
        written = emergency(tmp_path, "INC-9")
        on_disk = read_state_file(path)
        assert on_disk == written
        assert on_disk is not None
        assert on_disk["mode"] == "rolled_back" and on_disk["speculative_enabled"] is False
        assert on_disk["control"] == "manual" and on_disk["actor"] == "user:alice"
        assert on_disk["reason"] == EMERGENCY_REASON_PREFIX + "INC-9"
        assert on_disk["generation"] == 5 and on_disk["pending_sync"] is True
        assert on_disk["latched"] is True and on_disk["since"]
        assert not list((tmp_path / "state").glob(".switch.json.*.tmp"))

    def test_runs_the_hooks_with_the_emergency_state(self, tmp_path: Path) -> None:
        """The command hook sees the rollback and the pending_sync mark in its environment."""
        out = tmp_path / "env.json"
        script = (
            "import json, os, sys; json.dump({k: v for k, v in os.environ.items() "
            "if k.startswith('CANARYD_SWITCH_')}, open(sys.argv[1], 'w'))"
        )
        emergency(
            tmp_path, command=CommandHookConfig(argv=[sys.executable, "-c", script, str(out)])
        )
        env = json.loads(out.read_text())
        assert env["CANARYD_SWITCH_SPECULATIVE_ENABLED"] == "false"
        assert env["CANARYD_SWITCH_PENDING_SYNC"] == "true"
        assert env["CANARYD_SWITCH_GENERATION"] == "1"

    def test_an_unwritable_file_is_reported_and_the_hooks_still_run(self, tmp_path: Path) -> None:
        """A state file under a regular file cannot be written: the result says so and the
        hooks run anyway (they may be the only way left to stop production)."""
        blocker = tmp_path / "not-a-directory"
        blocker.write_text("")
        marker = tmp_path / "ran"
        hook = CommandHookConfig(argv=[sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
        switch = SwitchConfig(state_file=blocker / "switch.json", command=hook)
        result = emergency_rollback(switch, "alice", "db down")
        assert not result.written and "cannot write" in (result.file_error or "")
        assert marker.exists() and result.failures == {}

    def test_concurrent_emergency_writers_serialise_on_the_lock(self, tmp_path: Path) -> None:
        """Eight threads writing emergency rollbacks at once yield generations 1..8 in
        turn: the last file holds generation 8 and no temp file is left behind."""
        errors: list[BaseException] = []
        seen: list[int] = []

        def worker(index: int) -> None:
            try:
                seen.append(int(emergency(tmp_path, f"r{index}")["generation"]))  # type: ignore[call-overload]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert sorted(seen) == list(range(1, 9))
        assert read_state_file(tmp_path / "state" / "switch.json")["generation"] == 8  # type: ignore[index]
        assert not list((tmp_path / "state").glob(".switch.json.*.tmp"))

    def test_a_pending_file_is_only_replaced_by_its_adoption_or_a_higher_generation(
        self, tmp_path: Path
    ) -> None:
        """A writer that decided before the emergency file appeared and lands on the same
        generation is refused; the same state without the mark, or a higher one, is not."""
        path = tmp_path / "state" / "switch.json"
        written = emergency(tmp_path)
        other = {**written, "mode": "auto", "speculative_enabled": True}
        del other["pending_sync"]
        assert not write_state_file(path, other)
        adopted = {k: v for k, v in written.items() if k != "pending_sync"}
        assert write_state_file(path, adopted)
        assert read_state_file(path) == adopted


class TestAdoption:
    def test_restart_adopts_a_pending_file_into_the_database(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """A service start finds the emergency file above the database: the database takes
        its state at its generation with an audit row, and the file loses the mark."""
        written = emergency(tmp_path, "INC-7")
        assert written["generation"] == 1
        report = service(store, tmp_path).ensure_applied()
        assert report is not None and report.ok
        record = store.switch()
        state = record.state
        assert state.mode is SwitchMode.ROLLED_BACK and state.control is Control.MANUAL
        assert state.generation == 1 and state.actor == "user:alice"
        assert state.reason == EMERGENCY_REASON_PREFIX + "INC-7"
        assert record.applied
        (entry,) = store.audit()
        assert entry.kind == "transition" and entry.generation == 1
        assert entry.actor == "user:alice" and SYNCED_NOTE in entry.reason
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and "pending_sync" not in on_disk
        assert without_freshness(on_disk) == state_object(state)
        assert service(store, tmp_path).ensure_applied() is None

    def test_the_generation_continues_after_adoption(self, store: SqlStore, tmp_path: Path) -> None:
        """After an earlier database history, the emergency generation is adopted as is
        and the next command continues above it."""
        svc = service(store, tmp_path)
        svc.command(rollback())
        svc.command(SwitchEvent("restore", "bob", "fixed", force=True))
        assert emergency(tmp_path)["generation"] == 3
        change = svc.command(SwitchEvent("restore", "bob", "db back", force=True))
        assert change.adopted is not None and change.adopted.generation == 3
        assert change.state.generation == 4 and change.state.mode is SwitchMode.AUTO
        assert [e.generation for e in store.audit() if e.kind == "transition"] == [1, 2, 3, 4]
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and on_disk["generation"] == 4 and "pending_sync" not in on_disk

    def test_a_gate_run_never_reverts_a_pending_emergency_rollback(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """With auto-restore and fresh passing evidence, the gate run adopts the emergency
        rollback (manual) instead of restoring over it."""
        policy = SwitchPolicyConfig(auto_restore=True, restore_passes=1, cooldown_seconds=0)
        svc = service(store, tmp_path, policy)
        start = datetime.now(UTC) - timedelta(minutes=5)
        store.save_evaluation(liveness(GateState.FAIL, start))
        assert svc.step_gates(start).state.mode is SwitchMode.ROLLED_BACK
        assert emergency(tmp_path)["generation"] == 2
        later = start + timedelta(minutes=2)
        store.save_evaluation(liveness(GateState.PASS, later))
        change = svc.step_gates(later)
        state = store.switch().state
        assert change.adopted is not None
        assert state.mode is SwitchMode.ROLLED_BACK and state.control is Control.MANUAL
        assert state.generation == 2
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and on_disk["speculative_enabled"] is False
        assert on_disk["generation"] == 2 and "pending_sync" not in on_disk

    def test_a_database_that_reached_the_same_generation_adopts_above_it(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """When the database moved to the emergency's generation with another state (a
        writer racing the outage), the rollback is adopted one generation above."""
        path = tmp_path / "state" / "switch.json"
        emergency(tmp_path)  # generation 1, while the database (still at 0) was away
        racing = service(store, tmp_path / "elsewhere")  # decided without seeing the file
        racing.command(rollback(user="bob"))  # the database reaches generation 1 itself
        assert store.switch().state.generation == 1
        assert store.switch().state.actor == "user:bob"
        report = service(store, tmp_path).ensure_applied()
        assert report is not None and report.ok
        state = store.switch().state
        assert state.generation == 2 and state.actor == "user:alice"
        assert file_state(path) == state_object(state)

    def test_a_stale_pending_file_below_the_database_is_replaced(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """A pending file below the database that cannot be read as a state (no mode,
        control or actor) is not adopted; today's rewrite applies."""
        svc = service(store, tmp_path)
        svc.command(rollback())
        svc.command(SwitchEvent("restore", "bob", "fixed", force=True))
        path = tmp_path / "state" / "switch.json"
        path.write_text(json.dumps({"generation": 1, "mode": "rolled_back", "pending_sync": True}))
        assert svc.adopt_pending() is None
        svc.ensure_applied()
        assert file_state(path) == state_object(store.switch().state)
        assert store.switch().state.generation == 2

    def test_an_emergency_below_a_lagging_file_is_adopted_not_reverted(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """The state file lost (a reboot empties /run) while the database is down: the
        kill switch writes generation 1 under a database at 2 with speculative decoding
        on. It is newer than the stored state, so it is adopted above it, and the
        database's enabled state never replaces it."""
        svc = service(store, tmp_path)
        svc.command(rollback())
        svc.command(SwitchEvent("restore", "bob", "fixed", force=True))
        path = tmp_path / "state" / "switch.json"
        path.unlink()
        assert emergency(tmp_path, "INC-11")["generation"] == 1
        svc.ensure_applied()
        state = store.switch().state
        assert state.mode is SwitchMode.ROLLED_BACK and state.actor == "user:alice"
        assert state.generation == 3
        on_disk = read_state_file(path)
        assert on_disk is not None and on_disk["speculative_enabled"] is False
        assert without_freshness(on_disk) == state_object(state)

    def test_a_higher_file_without_the_mark_is_not_adopted(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """A newer file without pending_sync keeps today's behaviour: nothing is adopted."""
        path = tmp_path / "state" / "switch.json"
        write_state_file(path, {"generation": 7, "mode": "rolled_back"})
        assert service(store, tmp_path).adopt_pending() is None
        assert store.switch().state.generation == 0 and store.audit() == []


class TestSwitchGatesAdoption:
    def test_start_adopts_and_the_first_gate_run_keeps_it(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """`SwitchGates.start()` adopts a pending emergency rollback; a gate run after it
        leaves the rollback and its generation alone."""
        emergency(tmp_path, "INC-8")
        settings = Settings(
            storage={"url": database_url},  # type: ignore[arg-type]
            switch={"state_file": str(tmp_path / "state" / "switch.json")},  # type: ignore[arg-type]
        )
        hook = SwitchGates(settings, metrics=CanarydMetrics().switch, store=store)
        hook.start()
        state = store.switch().state
        assert state.mode is SwitchMode.ROLLED_BACK and state.generation == 1
        assert [SYNCED_NOTE in e.reason for e in store.audit()] == [True]
        hook.evaluate(datetime.now(UTC))
        assert store.switch().state == state
        assert file_state(tmp_path / "state" / "switch.json") == state_object(state)

    def test_a_gate_run_adopts_a_file_written_while_the_daemon_ran(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """An emergency file written after start is adopted by the next gate run."""
        settings = Settings(
            storage={"url": database_url},  # type: ignore[arg-type]
            switch={"state_file": str(tmp_path / "state" / "switch.json")},  # type: ignore[arg-type]
        )
        hook = SwitchGates(settings, store=store)
        hook.start()
        written = emergency(tmp_path)
        hook.evaluate(datetime.now(UTC))
        state = store.switch().state
        assert state.generation == written["generation"] and state.control is Control.MANUAL
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and "pending_sync" not in on_disk


# --- hook order, freshness, clocks, hook environment, start-up clean-up -----------------


class _OrderedReceiver(BaseHTTPRequestHandler):
    """Records each delivery when it completes (when the receiver acts on it); a
    generation in `delays` is held that long first, like a slow network or receiver."""

    delays: dict[int, float]
    arrived: threading.Event
    delivered: list[dict[str, object]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        delay = self.delays.get(int(body["generation"]))
        if delay is not None:
            self.arrived.set()
            threading.Event().wait(delay)
        self.delivered.append(body)
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def ordered_receiver() -> Iterator[tuple[str, type[_OrderedReceiver]]]:
    handler = type(
        "OrderedReceiver",
        (_OrderedReceiver,),
        {"delays": {}, "arrived": threading.Event(), "delivered": []},
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler
    server.shutdown()
    server.server_close()


class TestHookOrder:
    def test_a_slow_restore_never_lands_after_the_gates_rollback(
        self,
        store: SqlStore,
        database_url: str,
        tmp_path: Path,
        ordered_receiver: tuple[str, type[_OrderedReceiver]],
    ) -> None:
        """An operator's restore (generation 2) is slow to deliver; meanwhile the gates
        trip (generation 3) from another connection. The receiver gets 1, 2, 3 in that
        order and ends on the rollback, which is delivered once."""
        url, handler = ordered_receiver
        operator = service(store, tmp_path, webhook=WebhookConfig(url=url, retries=0))
        operator.command(rollback())
        handler.delays[2] = 1.0
        restoring = threading.Thread(
            target=operator.command, args=(SwitchEvent("restore", "alice", "fixed", force=True),)
        )
        restoring.start()
        try:
            assert handler.arrived.wait(10), "the restore never reached the receiver"
            with SqlStore.open(database_url) as own:
                gates = service(own, tmp_path, webhook=WebhookConfig(url=url, retries=0))
                now = datetime.now(UTC)
                own.save_evaluation(liveness(GateState.FAIL, now))
                change = gates.step_gates(now)
        finally:
            restoring.join()
        assert change.state.generation == 3 and change.state.mode is SwitchMode.ROLLED_BACK
        assert change.report is not None and change.report.ok
        assert [body["generation"] for body in handler.delivered] == [1, 2, 3]
        assert handler.delivered[-1]["speculative_enabled"] is False
        assert store.switch().applied

    def test_an_older_generation_is_never_sent_after_a_newer_one(
        self, store: SqlStore, tmp_path: Path, ordered_receiver: tuple[str, type[_OrderedReceiver]]
    ) -> None:
        """Applying generation 1 again after 2 was delivered sends nothing: not to the
        hook, not to the state file."""
        url, handler = ordered_receiver
        svc = service(store, tmp_path, webhook=WebhookConfig(url=url, retries=0))
        first = svc.command(rollback()).state
        svc.command(SwitchEvent("restore", "bob", "fixed", force=True))
        report = svc.apply(first)
        assert report.ok and report.file_skipped
        assert [body["generation"] for body in handler.delivered] == [1, 2]
        assert read_state_file(tmp_path / "state" / "switch.json")["generation"] == 2  # type: ignore[index]

    def test_a_generation_already_delivered_is_not_sent_twice(
        self, store: SqlStore, tmp_path: Path, ordered_receiver: tuple[str, type[_OrderedReceiver]]
    ) -> None:
        """A restart that re-applies a generation (its state file was deleted) sends the
        hooks that already have it nothing more."""
        url, handler = ordered_receiver
        service(store, tmp_path, webhook=WebhookConfig(url=url)).command(rollback())
        (tmp_path / "state" / "switch.json").unlink()
        svc = service(store, tmp_path, webhook=WebhookConfig(url=url))
        report = svc.ensure_applied()
        assert report is not None and report.ok
        assert [body["generation"] for body in handler.delivered] == [1]
        assert read_state_file(tmp_path / "state" / "switch.json") is not None


class TestFreshness:
    def test_every_write_carries_confirmed_at(self, store: SqlStore, tmp_path: Path) -> None:
        """The state file says when canaryd wrote it from the database; the hooks get the
        state object alone."""
        out = tmp_path / "hook.json"
        hook = CommandHookConfig(
            argv=[
                sys.executable,
                "-c",
                "import os, sys; open(sys.argv[1], 'w').write(os.environ['CANARYD_SWITCH_JSON'])",
                str(out),
            ]
        )
        at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
        switch = SwitchConfig(state_file=tmp_path / "state" / "switch.json", command=hook)
        SwitchService(store, switch, POLICY, clock=lambda: at).command(rollback())
        data = read_state_file(tmp_path / "state" / "switch.json")
        assert data is not None and data["confirmed_at"] == at.isoformat()
        assert json.loads(out.read_text()) == without_freshness(data)
        assert "confirmed_at" not in json.loads(out.read_text())

    def test_a_gate_run_refreshes_confirmed_at_without_a_new_generation(
        self, store: SqlStore, tmp_path: Path, ordered_receiver: tuple[str, type[_OrderedReceiver]]
    ) -> None:
        """A completed gate run that changes nothing rewrites the file with the new
        confirmation time at the same generation: no transition, no hook call; the
        policy step alone (a run that has not completed) confirms nothing."""
        url, handler = ordered_receiver
        clock = [datetime.now(UTC) - timedelta(minutes=10)]
        switch = SwitchConfig(
            state_file=tmp_path / "state" / "switch.json", webhook=WebhookConfig(url=url)
        )
        svc = SwitchService(store, switch, POLICY, clock=lambda: clock[0])
        svc.command(rollback())
        path = tmp_path / "state" / "switch.json"
        assert read_state_file(path)["confirmed_at"] == clock[0].isoformat()  # type: ignore[index]
        clock[0] += timedelta(minutes=1)
        change = svc.step_gates(clock[0])
        assert change.outcome.transitions == ()
        before = (clock[0] - timedelta(minutes=1)).isoformat()
        assert read_state_file(path)["confirmed_at"] == before  # type: ignore[index]
        svc.complete_gate_run(clock[0])
        assert store.switch().gates_completed_at == clock[0]
        data = read_state_file(path)
        assert data is not None and data["confirmed_at"] == clock[0].isoformat()
        assert data["generation"] == 1 and data["mode"] == "rolled_back"
        assert [e.generation for e in store.audit()] == [1]
        assert len(handler.delivered) == 1

    def test_switch_commits_are_synced_on_sqlite(self, tmp_path: Path) -> None:
        """A switch transition commits with synchronous=FULL (survives a power cut under
        WAL); pairs and gate decisions keep the faster NORMAL on the same pooled
        connection."""
        from sqlalchemy import Connection, event

        with SqlStore.open(f"sqlite:///{tmp_path / 'canaryd.db'}", create=True) as store:
            levels: list[int] = []

            def at_commit(connection: Connection) -> None:
                raw = connection.connection.dbapi_connection
                assert raw is not None
                levels.append(raw.execute("PRAGMA synchronous").fetchone()[0])

            event.listen(store._engine, "commit", at_commit)
            store.save_evaluation(liveness(GateState.PASS, datetime.now(UTC)))
            assert levels == [1]
            levels.clear()
            service(store, tmp_path).command(rollback())
            assert levels and set(levels) == {2}  # the transition and its actuation record
            levels.clear()
            store.save_evaluation(liveness(GateState.PASS, datetime.now(UTC)))
            assert levels == [1]


class TestClockJumps:
    def test_a_transition_stamped_ahead_does_not_blind_the_gates(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """A restore written while the clock was a year ahead leaves `since` in the
        future. The next gate run pulls it back to now (same generation), and the run
        after it trips on a failing critical gate."""
        now = datetime.now(UTC)
        ahead = SwitchService(
            store,
            SwitchConfig(state_file=tmp_path / "state" / "switch.json"),
            POLICY,
            clock=lambda: now + timedelta(days=365),
        )
        ahead.command(rollback())
        ahead.command(SwitchEvent("restore", "bob", "fixed", force=True))
        svc = service(store, tmp_path)
        store.save_evaluation(liveness(GateState.FAIL, now))
        first = svc.step_gates(now)
        assert first.outcome.transitions == ()
        state = store.switch().state
        assert state.generation == 2 and state.since == now
        later = now + timedelta(minutes=1)
        store.save_evaluation(liveness(GateState.FAIL, later))
        change = svc.step_gates(later)
        assert change.state.mode is SwitchMode.ROLLED_BACK
        assert change.state.generation == 3 and change.state.actor == "gate:liveness"
        assert file_state(tmp_path / "state" / "switch.json") == state_object(change.state)

    def test_evaluations_stamped_ahead_do_not_hide_new_ones(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """Ten passing evaluations stored while the clock was a year ahead are not the
        history the policy reads today: a failure now trips."""
        now = datetime.now(UTC)
        svc = service(store, tmp_path)
        for n in range(10):
            store.save_evaluation(liveness(GateState.PASS, now + timedelta(days=365, minutes=n)))
        store.save_evaluation(liveness(GateState.FAIL, now))
        change = svc.step_gates(now)
        assert change.state.mode is SwitchMode.ROLLED_BACK and change.state.generation == 1

    def test_an_emergency_stamped_by_a_clock_behind_is_adopted(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """The state file was lost and the kill switch is written (generation 1) on a
        host whose clock is an hour behind the database's last transition (generation
        2, speculative on). It is adopted above the database, not discarded as old."""
        svc = service(store, tmp_path)
        svc.command(rollback())
        svc.command(SwitchEvent("restore", "bob", "fixed", force=True))
        path = tmp_path / "state" / "switch.json"
        path.unlink()
        switch = SwitchConfig(state_file=path)
        behind = datetime.now(UTC) - timedelta(hours=1)
        written = emergency_rollback(switch, "alice", "INC-12", now=behind, sleep=lambda _s: None)
        assert written.written and written.state["generation"] == 1
        svc.ensure_applied()
        state = store.switch().state
        assert state.mode is SwitchMode.ROLLED_BACK and state.control is Control.MANUAL
        assert state.generation == 3 and state.actor == "user:alice"
        on_disk = read_state_file(path)
        assert on_disk is not None and on_disk["speculative_enabled"] is False
        assert "pending_sync" not in on_disk

    def test_an_adopted_emergency_is_not_adopted_again(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """A pending file the database already holds (adopted above its generation, the
        file's rewrite lost) is not adopted a second time."""
        path = tmp_path / "state" / "switch.json"
        written = emergency(tmp_path)
        service(store, tmp_path / "elsewhere").command(rollback(user="bob"))
        service(store, tmp_path).ensure_applied()
        assert store.switch().state.generation == 2
        path.write_text(json.dumps(written))  # the rewrite without the mark was lost
        assert service(store, tmp_path).adopt_pending() is None
        assert store.switch().state.generation == 2


class TestCommandEnvironment:
    def test_the_command_hook_gets_only_the_allowlisted_environment(
        self, store: SqlStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The daemon's database URL and webhook secret never reach the hook; PATH and the
        CANARYD_SWITCH_* variables do."""
        monkeypatch.setenv("CANARYD_STORAGE__URL", "postgresql+psycopg://canaryd:hunter2@db/c")
        monkeypatch.setenv("CANARYD_WEBHOOK_SECRET", "s3cret-value")
        monkeypatch.setenv("LANG", "C.UTF-8")
        out = tmp_path / "env.json"
        script = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
        hook = CommandHookConfig(argv=[sys.executable, "-c", script, str(out)])
        service(store, tmp_path, command=hook).command(rollback())
        env = json.loads(out.read_text())
        assert "hunter2" not in out.read_text() and "s3cret-value" not in out.read_text()
        assert env["PATH"] == os.environ["PATH"] and env["LANG"] == "C.UTF-8"
        assert env["CANARYD_SWITCH_MODE"] == "rolled_back"
        allowed = set(COMMAND_ENV_ALLOWLIST)
        # The interpreter itself may add a few of its own (macOS, locale coercion).
        extra = {
            k for k in env if k not in allowed and not k.startswith(("CANARYD_SWITCH_", "LC_"))
        }
        assert extra <= {"__CF_USER_TEXT_ENCODING", "PYTHONCOERCECLOCALE"}


class TestStartCleanup:
    def test_start_removes_leftover_temp_files_and_writes_the_state(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """A writer killed between its write and its rename leaves `.switch.json.*.tmp`;
        the daemon's start removes it (and only it) and writes the stored state."""
        svc = service(store, tmp_path)
        svc.command(rollback())
        directory = tmp_path / "state"
        (directory / "switch.json").unlink()
        leftover = directory / ".switch.json.k1ll3d.tmp"
        leftover.write_text('{"generation": 0}')
        unrelated = directory / "switch.json.bak"
        unrelated.write_text("keep")
        report = service(store, tmp_path).start()
        assert report is not None and report.ok
        assert not leftover.exists() and unrelated.read_text() == "keep"
        assert (directory / ".switch.json.lock").exists()
        data = read_state_file(directory / "switch.json")
        # No gate run has completed: the file makes no claim of freshness.
        assert data is not None and data["generation"] == 1 and "confirmed_at" not in data
        completed = datetime.now(UTC) - timedelta(minutes=3)
        store.record_gate_run(completed)
        (directory / "switch.json").unlink()
        service(store, tmp_path).start()
        data = read_state_file(directory / "switch.json")
        assert data is not None and data["confirmed_at"] == completed.isoformat()
