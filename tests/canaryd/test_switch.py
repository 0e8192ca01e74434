"""The rollback switch's service and actuators on real databases, files, processes and
HTTP servers on loopback: state file, generations under concurrent writers, hooks,
failures that never revert the state, re-application after a restart, and the kill switch
while the database is down (the emergency file and its adoption by the database)."""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from canaryd.config import CommandHookConfig, Settings, SwitchConfig, WebhookConfig
from canaryd.errors import ActuatorError, CanarydError
from canaryd.gating import SwitchGates
from canaryd.metrics import CanarydMetrics
from canaryd.store import SqlStore
from canaryd.switch import (
    EMERGENCY_REASON_PREFIX,
    SYNCED_NOTE,
    SwitchService,
    WebhookActuator,
    emergency_rollback,
    read_state_file,
    state_object,
    write_state_file,
)
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
    store: SqlStore, tmp_path: Path, policy: SwitchPolicyConfig = POLICY, **config: object
) -> SwitchService:
    switch = SwitchConfig(state_file=tmp_path / "state" / "switch.json", **config)  # type: ignore[arg-type]
    return SwitchService(store, switch, policy, metrics=CanarydMetrics(), sleep=lambda _s: None)


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
        svc = service(store, tmp_path, command=hook)
        change = svc.command(rollback())
        assert change.report is not None and "command" in change.report.failures
        record = store.switch()
        assert record.state.mode is SwitchMode.ROLLED_BACK
        assert not record.applied and "exited with 3" in record.actuator_errors["command"]
        assert read_state_file(tmp_path / "state" / "switch.json")["mode"] == "rolled_back"  # type: ignore[index]
        assert svc.metrics is not None
        assert (
            svc.metrics.registry.get_sample_value(
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
        assert on_disk == state_object(state)
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
        assert read_state_file(path) == state_object(state)

    def test_a_stale_pending_file_below_the_database_is_replaced(
        self, store: SqlStore, tmp_path: Path
    ) -> None:
        """A pending file older than the database is not adopted; today's rewrite applies."""
        svc = service(store, tmp_path)
        svc.command(rollback())
        svc.command(SwitchEvent("restore", "bob", "fixed", force=True))
        path = tmp_path / "state" / "switch.json"
        path.write_text(json.dumps({"generation": 1, "mode": "rolled_back", "pending_sync": True}))
        assert svc.adopt_pending() is None
        svc.ensure_applied()
        assert read_state_file(path) == state_object(store.switch().state)
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
        assert on_disk == state_object(state)

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
        hook = SwitchGates(settings, metrics=CanarydMetrics(), store=store)
        hook.start()
        state = store.switch().state
        assert state.mode is SwitchMode.ROLLED_BACK and state.generation == 1
        assert [SYNCED_NOTE in e.reason for e in store.audit()] == [True]
        hook.evaluate(datetime.now(UTC))
        assert store.switch().state == state
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk == state_object(state)

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
