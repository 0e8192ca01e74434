"""Two real `canaryd run` daemons on one PostgreSQL database: both start together (one
migrates, the other waits), both measure and store pairs, exactly one evaluates the gates
and writes the switch; after the leader is killed with SIGKILL the other takes over
within a few gate intervals."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from canaryd.store import SqlStore

REPO = Path(__file__).resolve().parents[2]
GATE_INTERVAL_S = 0.5

# Fast fake arms (timings are reported, not slept), gates twice a second.
CONFIG = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
[storage]
url = "{url}"
[gates.budget]
over_design_rate = "rebudget"
[schedule]
pair_interval_s = 0.2
jitter_s = 0
pairs_per_cycle = 5
gate_interval_s = {gate_interval}
[server]
listen = "127.0.0.1:0"
[logging]
format = "json"
"""


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


class Member:
    """One `canaryd run` of the fleet, in a directory of its own (its own state file)."""

    def __init__(self, name: str, url: str, tmp_path: Path) -> None:
        self.directory = tmp_path / name
        self.directory.mkdir()
        self.config = self.directory / "canaryd.toml"
        self.config.write_text(CONFIG.format(url=url, gate_interval=GATE_INTERVAL_S))
        self.state_file = self.directory / "data" / "switch.json"
        self.log_path = self.directory / "canaryd.log"
        self._log = self.log_path.open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
        env.update(
            CANARYD_DATA_DIR=str(self.directory / "data"),
            HF_HUB_OFFLINE="1",
            PYTHONUNBUFFERED="1",
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "canaryd", "run", "--config", str(self.config)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        self.address = ""

    @property
    def instance(self) -> str:
        return f"{socket.gethostname()}:{self.process.pid}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def count(self, event: str) -> int:
        return self.log().count(f'"event": "{event}"')

    def wait_started(self) -> None:
        def started() -> re.Match[str] | None:
            if self.process.poll() is not None:
                pytest.fail(f"canaryd exited ({self.process.returncode}):\n{self.log()[-3000:]}")
            return re.search(r"serving /metrics.* on http://(\S+) ", self.log())

        self.address = str(wait_for(started, 60, "start-up").group(1))

    def ready(self) -> dict[str, Any]:
        return dict(httpx.get(f"http://{self.address}/readyz", timeout=5).json())

    def leader_gauge(self) -> float:
        metrics = httpx.get(f"http://{self.address}/metrics", timeout=5).text
        found = re.search(r"^canaryd_leader (\S+)$", metrics, re.MULTILINE)
        assert found is not None, "canaryd_leader is not exported"
        return float(found.group(1))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        self._log.close()


@pytest.fixture
def fleet(database_url: str, tmp_path: Path) -> Iterator[tuple[Member, Member]]:
    members = (Member("a", database_url, tmp_path), Member("b", database_url, tmp_path))
    try:
        for member in members:
            member.wait_started()
        yield members
    finally:
        for member in members:
            member.close()


def status_leader(url: str, tmp_path: Path) -> dict[str, Any] | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
    env["CANARYD_DATA_DIR"] = str(tmp_path / "cli")
    shown = subprocess.run(
        [sys.executable, "-m", "canaryd", "status", "--json", "--url", url],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    leader = json.loads(shown.stdout)["leader"]
    return None if leader is None else dict(leader)


def stored_evaluations(url: str) -> int:
    with SqlStore.open(url) as store:
        return len(store.evaluations(10_000))


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
class TestTwoDaemonsOnOneDatabase:
    def test_one_evaluates_and_the_other_takes_over_when_it_is_killed(
        self, fleet: tuple[Member, Member], database_url: str, tmp_path: Path
    ) -> None:
        """Both store pairs; only the leader evaluates (the follower logs no evaluation,
        /readyz and the metric say who is who, `canaryd status` names the leader), and
        the follower mirrors the switch into its own state file. SIGKILL of the leader:
        the follower leads and evaluates within a few gate intervals."""
        a, b = fleet
        wait_for(lambda: a.count("gates.evaluated") + b.count("gates.evaluated") >= 4, 30,
                 "four gate evaluations")  # fmt: skip
        leader, follower = (a, b) if a.count("gates.evaluated") else (b, a)
        assert follower.count("gates.evaluated") == 0, "both daemons evaluate the gates"
        assert follower.count("leader.following") >= 1
        wait_for(lambda: follower.count("pair.done") >= 5, 30, "the follower's pairs")
        assert (leader.ready()["switch_role"], follower.ready()["switch_role"]) == (
            "leader",
            "follower",
        )
        assert (leader.leader_gauge(), follower.leader_gauge()) == (1.0, 0.0)
        holder = status_leader(database_url, tmp_path)
        assert holder is not None and holder["instance"] == leader.instance
        assert holder["since"] is not None
        mirrored = json.loads(follower.state_file.read_text())
        assert mirrored["mode"] == "auto" and "confirmed_at" in mirrored

        leader.process.send_signal(signal.SIGKILL)
        leader.process.wait(10)
        killed_at = time.monotonic()
        before = stored_evaluations(database_url)
        wait_for(lambda: follower.count("gates.evaluated") >= 2, 10 * GATE_INTERVAL_S + 5,
                 "the follower to take over and evaluate")  # fmt: skip
        took = time.monotonic() - killed_at
        assert follower.count("leader.acquired") == 1
        assert stored_evaluations(database_url) > before
        assert follower.ready()["switch_role"] == "leader"
        assert follower.leader_gauge() == 1.0
        holder = status_leader(database_url, tmp_path)
        assert holder is not None and holder["instance"] == follower.instance
        assert took < 10 * GATE_INTERVAL_S + 5

        follower.process.send_signal(signal.SIGTERM)
        assert follower.process.wait(30) == 0
        assert status_leader(database_url, tmp_path) is None
