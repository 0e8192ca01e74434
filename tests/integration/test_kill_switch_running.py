"""The kill switch against a running daemon: a human's rollback is immediate, the gates
never undo it, and a restore goes through only on fresh passing evidence."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

# Healthy, fast fake arms (timings are reported, not slept), gates evaluated twice a
# second. Latency and drift need hundreds of pairs per category before they can PASS,
# so they only warn here: every remaining enforce gate can reach PASS within seconds.
CONFIG = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
[storage]
url = "sqlite:///{db}"
[gates.budget]
over_design_rate = "rebudget"
[schedule]
pair_interval_s = 0.2
jitter_s = 0
pairs_per_cycle = 10
gate_interval_s = 0.5
[server]
listen = "127.0.0.1:0"
[logging]
format = "json"
[gates.latency]
mode = "warn"
[gates.drift]
mode = "warn"
"""


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
    env.update(CANARYD_DATA_DIR=str(tmp_path / "data"), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


class Running:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.config = tmp_path / "canaryd.toml"
        self.config.write_text(CONFIG.format(db=tmp_path / "canaryd.db"))
        self.state_file = tmp_path / "data" / "switch.json"
        self.log_path = tmp_path / "canaryd.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "canaryd", "run", "--config", str(self.config)],
            cwd=REPO, env=environment(tmp_path), stdout=subprocess.DEVNULL, stderr=self._log,
        )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def state(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.state_file.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "canaryd", *args, "--config", str(self.config)],
            cwd=REPO, env=environment(self.tmp_path), capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip

    def close(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(60)
        self._log.close()
        return code


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    daemon = Running(tmp_path)
    try:
        wait_for(lambda: re.search(r"serving /metrics", daemon.log()), 120, "start-up")
        wait_for(lambda: (daemon.state() or {}).get("mode") == "auto", 30, "the state file")
        yield daemon
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
        daemon.close()


@pytest.mark.slow
class TestKillSwitchWithTheDaemonRunning:
    def test_rollback_holds_and_restore_needs_passing_evidence(self, running: Running) -> None:
        """Rollback flips the file at once and survives gate runs; restore then succeeds
        once every enforce gate passes, and both are audited under the user's name."""
        rolled = running.cli("switch", "rollback", "--reason", "incident 42")
        assert rolled.returncode == 0, rolled.stderr
        state = running.state()
        assert state is not None
        assert state["mode"] == "rolled_back" and state["speculative_enabled"] is False
        assert state["control"] == "manual" and state["actor"].startswith("user:")
        generation = state["generation"]

        # The daemon keeps evaluating (twice a second) and must not undo a human's call.
        evaluated = running.log().count('"gates.evaluated"')
        wait_for(lambda: running.log().count('"gates.evaluated"') >= evaluated + 4, 30,
                 "four more gate evaluations")  # fmt: skip
        state = running.state()
        assert state is not None and state["mode"] == "rolled_back"
        assert state["generation"] == generation

        def restored() -> bool:
            return running.cli("switch", "restore", "--reason", "fixed").returncode == 0

        wait_for(restored, 90, "a restore backed by passing evidence")
        state = running.state()
        assert state is not None
        assert state["mode"] == "auto" and state["speculative_enabled"] is True
        assert state["generation"] > generation

        audit = running.cli("audit", "--json")
        assert audit.returncode == 0, audit.stderr
        reasons = [(e["actor"], e["target"], e["reason"]) for e in json.loads(audit.stdout)]
        assert any(a.startswith("user:") and t == "rolled_back" and "incident 42" in r
                   for a, t, r in reasons)  # fmt: skip
        assert any(a.startswith("user:") and t == "auto" and "fixed" in r for a, t, r in reasons)
        assert running.close() == 0
