"""`canaryd run` as a real process receiving real signals: a bad config exits 2 with one
line, SIGTERM in the middle of a pair exits 0 quickly and leaves a consistent database,
and SIGHUP reloads a valid config and survives a broken one."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

# Both arms sleep for what they report: ~0.5 s to the first token plus ~10 ms per token,
# at most 12 tokens, so a pair takes about 1-1.5 s.
REALTIME_ARMS = """
[arms.baseline]
kind = "fake"
realtime = true
ttft_s = 0.5
tpot_s = 0.01
jitter = 0
[arms.speculative]
kind = "fake"
speculative = true
realtime = true
ttft_s = 0.5
tpot_s = 0.01
jitter = 0
"""


def daemon_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
    env.update(CANARYD_DATA_DIR=str(tmp_path / "data"), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def write_config(path: Path, db: Path, extra: str = "") -> Path:
    path.write_text(
        REALTIME_ARMS
        + f"""
[prompts]
max_tokens = 12
{extra}
[storage]
url = "sqlite:///{db}"
[gates.budget]
over_design_rate = "rebudget"
[schedule]
pair_interval_s = 0.1
jitter_s = 0
shutdown_timeout_s = 10
[server]
listen = "127.0.0.1:0"
[logging]
format = "json"
"""
    )
    return path


class Daemon:
    """A `canaryd run` subprocess whose stderr goes to a file the test reads as events."""

    def __init__(self, config: Path, tmp_path: Path) -> None:
        self.log_path = tmp_path / "canaryd.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "canaryd", "run", "--config", str(config)],
            cwd=REPO,
            env=daemon_env(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.text().splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line still being written
        return found

    def count(self, event: str) -> int:
        return sum(1 for e in self.events() if e.get("event") == event)

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.process.poll() is not None:
                pytest.fail(f"canaryd exited ({self.process.returncode}):\n{self.text()[-3000:]}")
            time.sleep(0.05)
        pytest.fail(f"timed out waiting for {what}:\n{self.text()[-3000:]}")

    def wait_started(self) -> str:
        """Wait for the start-up line and return the status address."""
        found = self.wait_for(
            lambda: re.search(r"serving /metrics.* on http://(\S+) ", self.text()), 90, "start-up"
        )
        return str(found.group(1))

    def stop(self, timeout: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Daemon, Path]]]:
    """The processes of this module's signal tests, started together: each pays seconds
    of imports at start-up, and the tests only need them running."""
    started: dict[str, tuple[Daemon, Path]] = {}
    for name in ("sigterm", "sighup"):
        directory = tmp_path_factory.mktemp(name)
        config = write_config(directory / "canaryd.toml", directory / "canaryd.db")
        started[name] = (Daemon(config, directory), directory)
    yield started
    for daemon, _ in started.values():
        daemon.close()


def query(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(db)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


def assert_consistent(db: Path) -> None:
    """Every pair has exactly two generations (one per arm) and nothing is orphaned."""
    assert (
        query(
            db,
            "SELECT p.pair_id, count(g.pair_id) FROM pairs p LEFT JOIN generations g "
            "ON g.pair_id = p.pair_id GROUP BY p.pair_id HAVING count(g.pair_id) != 2",
        )
        == []
    )
    assert (
        query(
            db,
            "SELECT pair_id, arm FROM generations WHERE pair_id NOT IN (SELECT pair_id FROM pairs)",
        )
        == []
    )
    assert (
        query(
            db, "SELECT pair_id FROM pair_scores WHERE pair_id NOT IN (SELECT pair_id FROM pairs)"
        )
        == []
    )
    assert query(db, "SELECT count(DISTINCT arm) FROM generations GROUP BY pair_id") in (
        [],
        [(2,)] * len(query(db, "SELECT pair_id FROM pairs")),
    )


@pytest.mark.slow  # a `canaryd run` subprocess
class TestConfigErrors:
    def test_a_bad_value_exits_2_with_one_line_naming_file_and_key(self, tmp_path: Path) -> None:
        """An invalid key fails at start: exit 2, one stderr line with the file and the key."""
        bad = tmp_path / "bad.toml"
        bad.write_text("[schedule]\npair_interval_s = -1\n")
        result = subprocess.run(
            [sys.executable, "-m", "canaryd", "run", "--config", str(bad)],
            cwd=REPO,
            env=daemon_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert str(bad) in lines[0] and "schedule.pair_interval_s" in lines[0]


@pytest.mark.slow  # a `canaryd run` subprocess
class TestSigterm:
    def test_sigterm_mid_pair_exits_0_and_leaves_the_database_consistent(
        self, daemons: dict[str, tuple[Daemon, Path]]
    ) -> None:
        """The in-flight pair completes and is saved, the run is finished, exit 0 in time."""
        daemon, directory = daemons["sigterm"]
        db = directory / "canaryd.db"
        daemon.wait_started()
        daemon.wait_for(lambda: daemon.count("pair.done") >= 1, 90, "a first pair")
        done = daemon.count("pair.done")
        daemon.wait_for(lambda: daemon.count("pair.done") > done, 30, "a pair to finish")
        # Pairs run back to back (~1-1.5 s each, 0.1 s apart): the next one is generating.
        time.sleep(0.4)
        sent = time.monotonic()
        assert daemon.stop() == 0
        elapsed = time.monotonic() - sent
        assert elapsed < 8, f"took {elapsed:.1f} s (one pair is ~1.5 s)"
        names = [e.get("event") for e in daemon.events()]
        assert names.index("signal.received") < len(names) - 1 - names[::-1].index("pair.done")
        assert "shutdown.pair_dropped" not in names
        assert_consistent(db)
        (stored,) = query(db, "SELECT count(*) FROM pairs")[0]
        assert stored == daemon.count("pair.done") >= 2
        assert query(db, "SELECT kind FROM runs WHERE finished_at IS NOT NULL") == [("daemon",)]


@pytest.mark.slow  # a `canaryd run` subprocess
class TestSighup:
    def test_reload_applies_a_valid_config_and_survives_a_broken_one(
        self, daemons: dict[str, tuple[Daemon, Path]]
    ) -> None:
        """SIGHUP swaps in changed categories and max_tokens; a broken file is logged and the
        daemon carries on with the old config."""
        daemon, directory = daemons["sighup"]
        db, config = directory / "canaryd.db", directory / "canaryd.toml"
        daemon.wait_started()
        daemon.wait_for(lambda: daemon.count("pair.done") >= 1, 60, "a first pair")

        write_config(config, db, 'categories = ["math"]').write_text(
            config.read_text().replace("max_tokens = 12", "max_tokens = 3")
        )
        daemon.process.send_signal(signal.SIGHUP)
        reloaded = daemon.wait_for(
            lambda: [e for e in daemon.events() if e.get("event") == "config.reloaded"],
            30,
            "config.reloaded",
        )
        new_run = reloaded[0]["run_id"]
        after = daemon.count("pair.done")
        daemon.wait_for(lambda: daemon.count("pair.done") >= after + 2, 30, "2 more pairs")

        config.write_text("[schedule\npair_interval_s = 1\n")
        daemon.process.send_signal(signal.SIGHUP)
        failed = daemon.wait_for(
            lambda: [e for e in daemon.events() if e.get("event") == "config.reload_failed"],
            30,
            "config.reload_failed",
        )
        assert str(config) in failed[0]["reason"] and "(syntax)" in failed[0]["reason"]
        after = daemon.count("pair.done")
        daemon.wait_for(lambda: daemon.count("pair.done") >= after + 1, 30, "a pair after")
        assert daemon.process.poll() is None
        assert daemon.stop() == 0

        assert_consistent(db)
        categories = query(db, "SELECT DISTINCT category FROM pairs WHERE run_id = ?", new_run)
        assert categories == [("math",)]
        (longest,) = query(
            db,
            "SELECT max(g.output_tokens) FROM generations g JOIN pairs p "
            "ON p.pair_id = g.pair_id WHERE p.run_id = ?",
            new_run,
        )[0]
        assert longest <= 3
        assert len(query(db, "SELECT run_id FROM runs WHERE kind = 'daemon'")) == 2
