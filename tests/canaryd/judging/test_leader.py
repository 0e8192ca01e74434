"""Leadership among daemons on one database, on both backends: one holder at a time,
freed by release and by the holder's death (a process killed with SIGKILL), a lost
PostgreSQL session or a replaced SQLite lock file; daemons started together migrating an
empty database in turn; and the gate hook that only evaluates and steps the switch while
it leads, while a follower mirrors the stored state."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.config import Settings
from canaryd.daemon import NoGates
from canaryd.judging.gatejob import SwitchGates
from canaryd.judging.leader import (
    APPLICATION_PREFIX,
    FileLeadership,
    Leadership,
    leadership_for,
    lock_file_for,
)
from canaryd.metrics import CanarydMetrics
from canaryd.pairs.runner import PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites
from canaryd.store import SqlStore
from canaryd.switch import read_state_file
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from gates import SwitchMode
from gates.records import RunInfo

REPO = Path(__file__).resolve().parents[3]
BASE = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
DRY = {"mode": "dry_run"}

# A process that takes leadership, says whether it got it, and holds it until killed.
HOLDER = """
import sys, time
from canaryd.judging.leader import leadership_for
leadership = leadership_for(sys.argv[1], instance=sys.argv[2])
print(leadership.acquire(), flush=True)
time.sleep(300)
"""


def eventually(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


@pytest.fixture
def leaderships(database_url: str) -> Iterator[Callable[[str], Leadership]]:
    """Leaderships on the test's database, each closed at the end."""
    made: list[Leadership] = []

    def make(instance: str) -> Leadership:
        made.append(leadership_for(database_url, instance=instance))
        return made[-1]

    yield make
    for leadership in made:
        leadership.close()


class Holders:
    """`HOLDER` processes on one database, killed at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.processes: dict[str, subprocess.Popen[str]] = {}

    def start(self, instance: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, self.url, instance],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.processes[instance] = process
        return process

    def answer(self, instance: str) -> bool:
        process = self.processes[instance]
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line in ("True", "False"), f"holder {instance} said {line!r}"
        return line == "True"

    def kill(self, instance: str) -> None:
        process = self.processes[instance]
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
            if process.stdout is not None:
                process.stdout.close()


@pytest.fixture
def holders(database_url: str) -> Iterator[Holders]:
    running = Holders(database_url)
    yield running
    running.close()


class TestLeadership:
    def test_one_leads_and_a_release_hands_over(
        self, leaderships: Callable[[str], Leadership]
    ) -> None:
        """Only the first to acquire leads; re-checks keep it; once it releases, the
        other takes it on its next try, and the first cannot take it back."""
        first, second = leaderships("host-a:1"), leaderships("host-b:2")
        assert first.holder() is None
        assert first.acquire() is True
        assert second.acquire() is False
        assert first.acquire() is True  # the re-check of every gate run
        holder = second.holder()
        assert holder is not None and holder.instance == "host-a:1"
        assert holder.since is not None
        first.release()
        assert second.holder() is None
        assert second.acquire() is True
        assert first.acquire() is False
        holder = first.holder()
        assert holder is not None and holder.instance == "host-b:2"

    @pytest.mark.slow  # two holder subprocesses, one killed
    def test_only_one_of_two_processes_leads_and_its_death_frees_the_lock(
        self, holders: Holders, leaderships: Callable[[str], Leadership]
    ) -> None:
        """Two processes race for leadership: exactly one gets it. SIGKILL of that one
        (no clean-up runs) frees it: the OS drops the flock, PostgreSQL ends the session."""
        holders.start("proc-a:1")
        holders.start("proc-b:2")
        answers = {name: holders.answer(name) for name in ("proc-a:1", "proc-b:2")}
        assert sorted(answers.values()) == [False, True]
        leader = next(name for name, leads in answers.items() if leads)
        observer = leaderships("observer:3")
        assert observer.acquire() is False
        holder = observer.holder()
        assert holder is not None and holder.instance == leader

        holders.kill(leader)
        assert eventually(observer.acquire) is True
        holder = observer.holder()
        assert holder is not None and holder.instance == "observer:3"


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
class TestPostgresLeadership:
    @pytest.fixture
    def pg_url(self, database_url: str) -> str:
        return database_url

    def test_a_lost_session_is_lost_leadership(
        self, pg_url: str, leaderships: Callable[[str], Leadership]
    ) -> None:
        """The server ends the leader's session (a dropped connection, a restart): the
        follower takes over at its next try, and the old leader, re-checking, follows."""
        first, second = leaderships("host-a:1"), leaderships("host-b:2")
        assert first.acquire() and not second.acquire()
        admin = create_engine(make_url(pg_url))
        try:
            with admin.begin() as connection:
                ended = connection.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = :name"
                    ),
                    {"name": f"{APPLICATION_PREFIX}host-a:1"},
                ).all()
        finally:
            admin.dispose()
        assert ended == [(True,)]
        assert eventually(second.acquire) is True
        assert first.acquire() is False
        holder = first.holder()
        assert holder is not None and holder.instance == "host-b:2"

    def test_each_schema_is_a_switch_of_its_own(self, pg_url: str) -> None:
        """The lock is keyed by the schema that holds the switch: daemons on two schemas
        of one database each lead their own."""
        other = make_url(pg_url).update_query_dict({"options": "-csearch_path=another_schema"})
        here = leadership_for(pg_url, instance="here:1")
        there = leadership_for(other.render_as_string(hide_password=False), instance="there:2")
        try:
            assert here.acquire() is True
            assert there.acquire() is True
        finally:
            here.close()
            there.close()


class TestFileLeadership:
    def test_the_lock_file_lies_beside_the_database(self, tmp_path: Path) -> None:
        leadership = leadership_for(f"sqlite:///{tmp_path / 'canaryd.db'}", instance="x:1")
        assert isinstance(leadership, FileLeadership)
        assert leadership.path == tmp_path / "canaryd.db.leader.lock"
        assert lock_file_for(tmp_path / "canaryd.db") == leadership.path

    def test_a_replaced_lock_file_is_lost_leadership(self, tmp_path: Path) -> None:
        """A lock file deleted by hand: the next daemon locks a new one, and the old
        leader, re-checking, sees it no longer holds the file and follows."""
        url = f"sqlite:///{tmp_path / 'canaryd.db'}"
        first, second = leadership_for(url, instance="a:1"), leadership_for(url, instance="b:2")
        try:
            assert first.acquire() is True
            lock_file_for(tmp_path / "canaryd.db").unlink()
            assert second.acquire() is True
            assert first.acquire() is False
        finally:
            first.close()
            second.close()

    def test_no_database_directory_means_no_leader(self, tmp_path: Path) -> None:
        leadership = leadership_for(f"sqlite:///{tmp_path / 'absent' / 'c.db'}", instance="x:1")
        assert leadership.holder() is None


class TestFleetStart:
    @pytest.mark.slow  # three subprocesses migrating one database
    def test_daemons_started_together_migrate_an_empty_database_in_turn(
        self, database_url: str
    ) -> None:
        """Three processes open an empty database with `create` at once: one migrates,
        the others wait for it and find the schema at head (none fails on CREATE TABLE
        or a stale SQLite snapshot)."""
        code = (
            "import sys; from canaryd.store import SqlStore; "
            "SqlStore.open(sys.argv[1], create=True).close()"
        )
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", code, database_url],
                cwd=REPO,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        errors = [process.communicate(timeout=120)[1] for process in processes]
        assert [process.returncode for process in processes] == [0, 0, 0], errors


# --- the gate hook under leadership ----------------------------------------------------


def settings(url: str, state_file: Path) -> Settings:
    """Only liveness (critical, 5 pairs) enforces, so a short test can trip the switch."""
    return Settings(
        storage={"url": url},
        switch={"state_file": str(state_file)},
        gates={
            "liveness": {"min_samples": 5, "window_pairs": 10},
            "error": DRY,
            "latency": DRY,
            "quality": DRY,
            "speedup": DRY,
            "drift": DRY,
            "policy": {"cooldown_seconds": 0},
        },
    )


def dead_arm_pairs(store: SqlStore, n: int) -> datetime:
    """`n` pairs whose speculative arm always fails, one second apart from BASE."""
    store.create_run(RunInfo("soak", "daemon", BASE, {}, "h", {}, {}, {}))
    runner = PairRunner(
        FakeEngine(FakeEngineConfig(seed=1)),
        FakeEngine(FakeEngineConfig(speculative=True, error_rate=1.0, seed=1)),
        run_id="soak",
    )
    prompts = [p for suite in load_default_suites() for p in suite.prompts]
    sampler = StratifiedSampler(prompts, seed=1)
    for i in range(n):
        record = runner.run_pair(sampler.next())
        store.save_pair(replace(record, started_at=BASE + timedelta(seconds=i + 1)))
    return BASE + timedelta(seconds=n + 1)


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened:
        yield opened


def leader_gauge(metrics: CanarydMetrics) -> float | None:
    return metrics.registry.get_sample_value("canaryd_leader")


class TestGatesUnderLeadership:
    def test_only_the_leader_evaluates_and_a_follower_takes_over(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Two gate hooks on one database: the leader's runs store evaluations and trip
        the switch; the follower's store none, yet its own state file shows the stored
        rollback. Once the leader is gone, the follower's next run leads."""
        now = dead_arm_pairs(store, 10)
        leader_file, follower_file = tmp_path / "a" / "switch.json", tmp_path / "b" / "switch.json"
        metrics_a, metrics_b = CanarydMetrics(), CanarydMetrics()
        leader = SwitchGates(
            settings(database_url, leader_file), metrics=metrics_a.switch, store=store
        )
        follower = SwitchGates(settings(database_url, follower_file), metrics=metrics_b.switch)
        try:
            leader.start()
            follower.start()
            assert (leader.role(), follower.role()) == ("leader", "follower")
            assert (leader_gauge(metrics_a), leader_gauge(metrics_b)) == (1, 0)

            follower.evaluate(now)
            assert store.evaluations(10) == []
            assert store.switch().state.mode is SwitchMode.AUTO

            leader.evaluate(now)
            assert len(store.evaluations(10)) == 1
            state = store.switch().state
            assert state.mode is SwitchMode.ROLLED_BACK and state.actor == "gate:liveness"

            follower.evaluate(now + timedelta(seconds=1))
            assert len(store.evaluations(10)) == 1
            mirrored = read_state_file(follower_file)
            assert mirrored is not None
            assert mirrored["speculative_enabled"] is False
            assert mirrored["generation"] == state.generation
            assert [e.actor for e in store.audit()] == ["gate:liveness"]  # one writer

            leader.close()
            follower.evaluate(now + timedelta(seconds=2))
            assert follower.role() == "leader" and leader_gauge(metrics_b) == 1
            assert len(store.evaluations(10)) == 2
        finally:
            leader.close()
            follower.close()

    def test_a_daemon_without_gates_has_no_role(self) -> None:
        assert NoGates().role() == "none"


class TestStatusShowsTheLeader:
    def test_status_names_the_leading_instance(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """`canaryd status` (tables and --json) names the instance that leads, and says
        when none does."""
        dead_arm_pairs(store, 2)
        url = ["--url", database_url]
        quiet = CliRunner().invoke(app, ["status", "--json", *url])
        assert quiet.exit_code == 0, quiet.output
        assert '"leader": null' in quiet.output
        gates = SwitchGates(
            settings(database_url, tmp_path / "switch.json"),
            store=store,
            leadership=leadership_for(database_url, instance="gpu-host-7:4242"),
        )
        try:
            gates.start()
            shown = CliRunner().invoke(app, ["status", "--json", *url])
            assert shown.exit_code == 0, shown.output
            assert '"instance": "gpu-host-7:4242"' in shown.output
            table = CliRunner().invoke(app, ["status", *url])
            assert table.exit_code == 0, table.output
            assert "leader: gpu-host-7:4242" in table.output
        finally:
            gates.close()
        after = CliRunner().invoke(app, ["status", *url])
        assert "leader: none" in after.output
