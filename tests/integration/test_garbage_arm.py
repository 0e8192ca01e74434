"""A garbage-sending arm cannot blind the canary: `canaryd run` as a process against two
loopback OpenAI-compatible servers, one healthy and one that sends text no one can store
(lone surrogates) or counts that cannot be true (negative `completion_tokens`).

Garbage from the speculative arm is that arm's failure (`invalid_output`), stored like any
other, so the liveness gate rolls speculation back by itself within its run of failures;
garbage from the baseline never rolls speculation back."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import Behaviour, MisbehavingServer

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

SURROGATES = Behaviour(piece="x \udc80 y ")
NEGATIVE_COUNTS = Behaviour(
    final_extra={"usage": {"prompt_tokens": 5, "completion_tokens": -3, "total_tokens": 2}}
)


def config(directory: Path, baseline: str, speculative: str) -> Path:
    path = directory / "canaryd.toml"
    path.write_text(
        f"""
[arms.baseline]
kind = "openai"
base_url = "{baseline}"
[arms.speculative]
kind = "openai"
base_url = "{speculative}"
speculative = true
[prompts]
max_tokens = 8
[storage]
url = "sqlite:///{directory / "canaryd.db"}"
[gates.budget]
over_design_rate = "rebudget"
[schedule]
pair_interval_s = 0.2
jitter_s = 0
gate_interval_s = 0.5
[server]
listen = "127.0.0.1:0"
[logging]
format = "json"
"""
    )
    return path


class Run:
    """`canaryd run` on a config; its state file and database read by the test."""

    def __init__(self, directory: Path, config_path: Path) -> None:
        self.directory = directory
        env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
        env.update(CANARYD_DATA_DIR=str(directory / "data"), PYTHONUNBUFFERED="1")
        self.log = directory / "canaryd.log"
        self._sink = self.log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "canaryd", "run", "--config", str(config_path)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._sink,
        )

    def state(self) -> dict[str, Any]:
        path = self.directory / "data" / "switch.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return {}

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        database = self.directory / "canaryd.db"
        try:
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
                return list(connection.execute(sql).fetchall())
        except sqlite3.OperationalError:
            return []

    def pairs(self) -> int:
        rows = self.query("select count(*) from pairs")
        return int(rows[0][0]) if rows else 0

    def alive(self) -> None:
        if self.process.poll() is not None:
            tail = self.log.read_text()[-3000:]
            pytest.fail(f"canaryd exited {self.process.returncode}:\n{tail}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        finally:
            self._sink.close()


@pytest.fixture
def servers() -> Iterator[tuple[MisbehavingServer, MisbehavingServer]]:
    with MisbehavingServer() as baseline, MisbehavingServer() as speculative:
        yield baseline, speculative


class TestGarbageFromTheSpeculativeArm:
    @pytest.mark.parametrize("garbage", [SURROGATES, NEGATIVE_COUNTS], ids=["surrogates", "counts"])
    def test_rolls_speculation_back_within_the_liveness_run(
        self,
        servers: tuple[MisbehavingServer, MisbehavingServer],
        garbage: Behaviour,
        tmp_path: Path,
    ) -> None:
        """Every speculative answer is garbage: the pairs are stored as `invalid_output`
        failures of that arm and the switch rolls back by itself."""
        baseline, speculative = servers
        speculative.default = garbage
        run = Run(tmp_path, config(tmp_path, baseline.url, speculative.url))
        try:
            deadline = time.monotonic() + 120
            while run.state().get("speculative_enabled", True):
                run.alive()
                if time.monotonic() > deadline:
                    pytest.fail(f"no rollback in 120 s:\n{run.log.read_text()[-3000:]}")
                time.sleep(0.1)
            stored_at_rollback = run.pairs()
        finally:
            assert run.stop() == 0
        errors = run.query("select error from generations where arm = 'speculative'")
        assert errors and {e for (e,) in errors} == {"invalid_output"}
        baseline_errors = run.query("select error from generations where arm = 'baseline'")
        assert {e for (e,) in baseline_errors} == {"none"}
        # The liveness gate needs 5 speculative-only failures in a row; gate runs come every
        # 0.5 s while pairs come every 0.2 s, so a few more may be stored by the time it runs.
        assert 5 <= stored_at_rollback <= 12, stored_at_rollback
        assert "cycle.failed" not in run.log.read_text()
        reasons = run.query("select actor from switch_audit")
        assert any("liveness" in actor or "error" in actor for (actor,) in reasons), reasons


class TestGarbageFromTheBaselineArm:
    def test_never_rolls_speculation_back(
        self, servers: tuple[MisbehavingServer, MisbehavingServer], tmp_path: Path
    ) -> None:
        """The baseline sends surrogates on every pair: those pairs say nothing against the
        speculative arm, and speculation stays on."""
        baseline, speculative = servers
        baseline.default = SURROGATES
        run = Run(tmp_path, config(tmp_path, baseline.url, speculative.url))
        try:
            deadline = time.monotonic() + 120
            while run.pairs() < 15:
                run.alive()
                if time.monotonic() > deadline:
                    pytest.fail(f"15 pairs not stored in 120 s:\n{run.log.read_text()[-3000:]}")
                time.sleep(0.1)
            time.sleep(1.5)  # at least two gate runs over those pairs
            assert run.state().get("speculative_enabled") is True, run.state()
        finally:
            assert run.stop() == 0
        errors = run.query("select error from generations where arm = 'baseline'")
        assert {e for (e,) in errors} == {"invalid_output"}
