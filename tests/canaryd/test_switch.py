"""The rollback switch's service and actuators on real databases, files, processes and
HTTP servers on loopback: state file, generations under concurrent writers, hooks,
failures that never revert the state, and re-application after a restart."""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from canaryd.config import CommandHookConfig, SwitchConfig, WebhookConfig
from canaryd.metrics import CanarydMetrics
from canaryd.store import SqlStore
from canaryd.switch import SwitchService, WebhookActuator, read_state_file, write_state_file
from gates import SwitchEvent, SwitchMode, SwitchPolicyConfig

POLICY = SwitchPolicyConfig()


def service(store: SqlStore, tmp_path: Path, **config: object) -> SwitchService:
    switch = SwitchConfig(state_file=tmp_path / "state" / "switch.json", **config)  # type: ignore[arg-type]
    return SwitchService(store, switch, POLICY, metrics=CanarydMetrics(), sleep=lambda _s: None)


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
