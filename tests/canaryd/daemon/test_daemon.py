"""The daemon in-process on fake engines, a real SQLite file and real HTTP on loopback:
cycles run and are stored, probes tell the truth, the database can go away and come back
without losing a pair, shutdown drops an unfinished pair whole, and reloads are atomic."""

from __future__ import annotations

import gc
import json
import sqlite3
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from canaryd.config import Settings, load_settings
from canaryd.config.docs import config_reference
from canaryd.daemon import CYCLE_JOB, GATE_JOB, HEARTBEAT_JOB, Daemon, PendingPairs
from canaryd.daemon.buffer import PairWriter
from canaryd.daemon.quarantine import Quarantine
from canaryd.errors import ConfigError, DatabaseError, RecordRejectedError
from canaryd.metrics import CanarydMetrics
from canaryd.store import SqlStore
from engine.types import ErrorKind, GenerationResult, Message
from gates.records import PairRecord, Prompt, RunInfo

REPO = Path(__file__).resolve().parents[3]
HOUR = timedelta(hours=1)

FAKE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
"""


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for {what or predicate}")


@pytest.fixture(autouse=True)
def _clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    for name in ("CANARYD_CONFIG", "CANARYD_STORAGE__URL", "CANARYD_SERVER__LISTEN"):
        monkeypatch.delenv(name, raising=False)


def write_config(
    tmp_path: Path, extra: str = "", *, arms: str = FAKE_ARMS, storage: str = "", server: str = ""
) -> Path:
    """A config on fake arms, a SQLite file whose writers give up after 0.2 s, any port."""
    path = tmp_path / "canaryd.toml"
    path.write_text(
        arms
        + f"""
[storage]
url = "sqlite:///{tmp_path / "canaryd.db"}?timeout=0.2"
{storage}
[server]
listen = "127.0.0.1:0"
{server}
"""
        + extra
    )
    return path


def fast_schedule(**overrides: float) -> str:
    values = {"pair_interval_s": 0.05, "jitter_s": 0, "heartbeat_interval_s": 0.1}
    values.update(overrides)
    # Faster than the budget's design rate: accepted, the gates re-budgeting if need be.
    rebudget = '[gates.budget]\nover_design_rate = "rebudget"\n'
    pairs = "\n".join(f"{key} = {value}" for key, value in values.items())
    return rebudget + "[schedule]\n" + pairs + "\n"


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def make(extra: str = "", *, start: bool = True, **sections: str) -> Daemon:
        path = write_config(tmp_path, extra, **sections)
        daemon = Daemon(load_settings(path), config_path=path)
        if start:
            daemon.start()
            started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()


def get(daemon: Daemon, path: str) -> httpx.Response:
    return httpx.get(f"http://{daemon.address}{path}", timeout=5)


def stored_pairs(daemon: Daemon) -> int:
    with SqlStore.open(daemon.settings.storage.resolved_url()) as store:
        return len(store.pairs())


def sample(daemon: Daemon, name: str, **labels: str) -> float:
    return daemon.metrics.registry.get_sample_value(name, labels) or 0.0


def pairs_run(daemon: Daemon) -> float:
    """Every pair the daemon ran, by the pairs counter (all categories and outcomes)."""
    total = 0.0
    for family in daemon.metrics.registry.collect():
        if family.name == "canaryd_pairs":
            total += sum(s.value for s in family.samples if s.name == "canaryd_pairs_total")
    return total


def gate_runs(daemon: Daemon) -> float:
    """Gate runs the daemon completed, by the gate runs counter."""
    return sample(daemon, "canaryd_gate_runs_total", outcome="ok")


def record(n: int) -> PairRecord:
    """A minimal pair record numbered `n` (its content does not matter to the buffer)."""
    result = GenerationResult.failed(ErrorKind.INTERNAL, "x", 0.0)
    return PairRecord(
        pair_id=str(n),
        run_id="r",
        prompt=Prompt(id="p", category="qa", messages=(), max_tokens=4),
        started_at=datetime.now(UTC),
        arm_order=("baseline", "speculative"),
        baseline=result,
        speculative=result,
        scores=None,
    )


class TestPendingPairs:
    def test_keeps_order_and_drops_only_the_oldest_when_full(self) -> None:
        """A full buffer drops its oldest pair, counts it, and keeps the rest in order."""
        pending = PendingPairs(2)
        assert pending.add(record(1)) is None
        assert pending.add(record(2)) is None
        dropped = pending.add(record(3))
        assert dropped is not None and dropped.pair_id == "1"
        assert pending.dropped == 1
        assert pending.oldest().pair_id == "2"
        pending.remove_oldest()
        assert pending.oldest().pair_id == "3"

    def test_resize_drops_the_oldest_beyond_the_new_capacity(self) -> None:
        """Shrinking the buffer drops the oldest pairs and counts them."""
        pending = PendingPairs(5)
        for n in range(4):
            pending.add(record(n))
        assert [r.pair_id for r in pending.resize(2)] == ["0", "1"]
        assert len(pending) == 2 and pending.dropped == 2


class TestDaemonCycles:
    def test_cycles_store_pairs_move_metrics_and_report_healthy(
        self, make_daemon: Callable[..., Daemon]
    ) -> None:
        """Cycles run on the schedule; pairs are stored, counted in /metrics, probes are 200."""
        daemon = make_daemon(fast_schedule())
        wait_for(lambda: stored_pairs(daemon) >= 3, what="3 stored pairs")
        body = get(daemon, "/metrics").text
        assert "canaryd_pairs_total{" in body
        assert pairs_run(daemon) >= 3
        assert sample(daemon, "canaryd_cycles_total", outcome="ok") >= 3
        assert sample(daemon, "canaryd_engine_ready", arm="speculative") == 1
        wait_for(lambda: daemon.last_heartbeat, what="a heartbeat")
        assert sample(daemon, "canaryd_heartbeat_timestamp_seconds") > 0
        health = get(daemon, "/healthz")
        assert health.status_code == 200, health.text
        assert health.json()["scheduler"] == "running"
        ready = get(daemon, "/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["database"] == "reachable"

    def test_run_row_is_created_at_start_and_finished_at_stop(
        self, make_daemon: Callable[..., Daemon]
    ) -> None:
        """The daemon records one `daemon` run while it runs and marks it finished on stop."""
        daemon = make_daemon(fast_schedule())
        url, run_id = daemon.settings.storage.resolved_url(), daemon.run_id
        with SqlStore.open(url) as store:
            (run,) = store.runs()
            assert run.info.kind == "daemon" and run.finished_at is None
        daemon.stop()
        with SqlStore.open(url) as store:
            (run,) = store.runs()
            assert run.info.run_id == run_id and run.finished_at is not None

    def test_healthz_goes_unhealthy_when_cycles_stop(
        self, make_daemon: Callable[..., Daemon]
    ) -> None:
        """With the cycle job paused, /healthz turns 503 once the last cycle is too old."""
        daemon = make_daemon(fast_schedule(), server="max_cycle_age_s = 0.5")
        wait_for(lambda: daemon.cycles >= 1, what="a cycle")
        assert get(daemon, "/healthz").status_code == 200
        daemon.scheduler.pause_job(CYCLE_JOB)
        response = wait_for(
            lambda: (r := get(daemon, "/healthz")).status_code == 503 and r, what="a 503"
        )
        problems = " ".join(response.json()["problems"])
        assert "last cycle finished" in problems and "0.5 s limit" in problems
        assert response.json()["scheduler"] == "running"

    def test_startup_refuses_a_newer_schema_and_releases_what_it_opened(
        self, tmp_path: Path, make_daemon: Callable[..., Daemon]
    ) -> None:
        """A database at an unknown revision is refused with what to do; nothing stays open."""
        connection = sqlite3.connect(tmp_path / "canaryd.db")
        connection.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        connection.execute("INSERT INTO alembic_version VALUES ('ffffffffffff')")
        connection.commit()
        connection.close()
        daemon = make_daemon(start=False)
        with pytest.raises(DatabaseError, match="newer than this canaryd"):
            daemon.start()
        assert not daemon.running


class TestDatabaseAway:
    def test_pairs_are_buffered_while_locked_and_saved_when_back(
        self, tmp_path: Path, make_daemon: Callable[..., Daemon]
    ) -> None:
        """A locked database buffers pairs and fails /readyz; unlocked, every pair is saved."""
        daemon = make_daemon(fast_schedule(pair_interval_s=0.1))
        wait_for(lambda: stored_pairs(daemon) >= 1, what="a stored pair")
        lock = sqlite3.connect(tmp_path / "canaryd.db", isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # every other writer now gets "database is locked"
        try:
            wait_for(lambda: len(daemon.pending) >= 3, what="3 buffered pairs")
            ready = get(daemon, "/readyz")
            assert ready.status_code == 503
            assert ready.json()["database"] == "unreachable"
            assert "database unreachable" in " ".join(ready.json()["problems"])
            assert sample(daemon, "canaryd_store_pending_pairs") >= 1
            assert sample(daemon, "canaryd_store_errors_total", kind="save_pair") >= 1
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        wait_for(lambda: len(daemon.pending) == 0, what="the buffer to drain")
        wait_for(lambda: get(daemon, "/readyz").status_code == 200, what="ready again")
        daemon.stop()
        assert stored_pairs(daemon) == pairs_run(daemon)  # nothing lost
        assert daemon.pending.dropped == 0

    def test_a_full_buffer_drops_the_oldest_and_counts_it(
        self, tmp_path: Path, make_daemon: Callable[..., Daemon]
    ) -> None:
        """With room for 2 pairs, a longer outage loses the oldest ones, counted and logged."""
        daemon = make_daemon(fast_schedule(), storage="buffer_pairs = 2")
        wait_for(lambda: daemon.cycles >= 1, what="a cycle")
        lock = sqlite3.connect(tmp_path / "canaryd.db", isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        try:
            wait_for(lambda: daemon.pending.dropped >= 2, what="2 dropped pairs")
            assert len(daemon.pending) == 2
            assert sample(daemon, "canaryd_store_errors_total", kind="pair_dropped") >= 2
            assert get(daemon, "/readyz").json()["lost_pairs"] >= 2
        finally:
            lock.execute("ROLLBACK")
            lock.close()


class TestShutdown:
    def test_a_pair_still_generating_at_the_timeout_is_dropped_whole(
        self, make_daemon: Callable[..., Daemon]
    ) -> None:
        """stop() returns after the shutdown timeout; the unfinished pair is never stored."""
        slow = FAKE_ARMS.replace('kind = "fake"', 'kind = "fake"\nrealtime = true\nttft_s = 1.5')
        daemon = make_daemon(fast_schedule(shutdown_timeout_s=0.3), arms=slow)
        url = daemon.settings.storage.resolved_url()
        # the first cycle starts at once; once it runs, its pair generates for 1.5 s
        wait_for(lambda: not daemon._idle.is_set(), what="the first cycle to start")
        time.sleep(0.1)
        started = time.monotonic()
        daemon.stop()
        assert time.monotonic() - started < 2.0
        assert daemon.abandoned
        time.sleep(3.2)  # let the abandoned generation finish: it must not be saved
        with SqlStore.open(url) as store:
            assert store.pairs() == []
            (run,) = store.runs()
            assert run.finished_at is not None

    def test_stop_is_idempotent(self, make_daemon: Callable[..., Daemon]) -> None:
        """A second stop() does nothing."""
        daemon = make_daemon(fast_schedule())
        daemon.stop()
        daemon.stop()
        assert not daemon.running


class TestReload:
    def test_changed_prompts_take_effect_under_a_new_run_with_the_same_engines(
        self, tmp_path: Path, make_daemon: Callable[..., Daemon]
    ) -> None:
        """A valid reload swaps the config in, starts a new run and keeps unchanged engines."""
        daemon = make_daemon(fast_schedule(pair_interval_s=1000))
        old_run, old_engines = daemon.run_id, dict(daemon.engines)
        write_config(tmp_path, fast_schedule() + '[prompts]\ncategories = ["math"]\n')
        assert daemon.reload()
        assert daemon.run_id != old_run
        assert daemon.engines == old_engines
        daemon.run_cycle()
        with SqlStore.open(daemon.settings.storage.resolved_url()) as store:
            pairs = store.pairs(run_id=daemon.run_id)
            assert pairs and {p.prompt.category for p in pairs} == {"math"}
            finished = {r.info.run_id: r.finished_at for r in store.runs()}
            assert finished[old_run] is not None

    def test_an_unchanged_config_keeps_the_run_and_its_pairs_are_stored(
        self, make_daemon: Callable[..., Daemon]
    ) -> None:
        """A SIGHUP with the same file keeps the run, and later pairs are saved under it
        (not under a run id that has no row, which the database refuses)."""
        daemon = make_daemon(fast_schedule(pair_interval_s=1000))
        run_id = daemon.run_id
        wait_for(lambda: daemon.cycles >= 1, what="the first cycle")
        assert daemon.reload()
        assert daemon.run_id == run_id
        daemon.run_cycle()
        assert len(daemon.pending) == 0
        with SqlStore.open(daemon.settings.storage.resolved_url()) as store:
            assert {p.run_id for p in store.pairs()} == {run_id}
            assert len(store.pairs(run_id=run_id)) == 2

    def test_a_changed_arm_is_rebuilt_and_the_other_kept(
        self, tmp_path: Path, make_daemon: Callable[..., Daemon]
    ) -> None:
        """Only the arm whose engine config changed gets a new engine."""
        daemon = make_daemon(fast_schedule(pair_interval_s=1000))
        before = dict(daemon.engines)
        write_config(
            tmp_path,
            fast_schedule(pair_interval_s=1000),
            arms=FAKE_ARMS.replace("speculative = true", "speculative = true\nseed = 7"),
        )
        assert daemon.reload()
        assert daemon.engines["baseline"] is before["baseline"]
        assert daemon.engines["speculative"] is not before["speculative"]

    def test_a_broken_file_keeps_the_running_config(
        self, tmp_path: Path, make_daemon: Callable[..., Daemon]
    ) -> None:
        """An invalid file or an unknown category is refused and nothing changes."""
        daemon = make_daemon(fast_schedule(pair_interval_s=1000))
        settings, run_id = daemon.settings, daemon.run_id
        (tmp_path / "canaryd.toml").write_text("[schedule\n")
        assert not daemon.reload()
        write_config(tmp_path, '[prompts]\ncategories = ["no_such_category"]\n')
        assert not daemon.reload()
        assert daemon.settings is settings and daemon.run_id == run_id

    def test_an_engine_that_fails_to_load_with_any_error_keeps_the_running_config(
        self, tmp_path: Path, make_daemon: Callable[..., Daemon]
    ) -> None:
        """A new model directory that transformers cannot read (an OSError, not an
        EngineError) is refused like a bad file: reload() returns False, the daemon keeps
        its engines and run, and cycles go on."""
        daemon = make_daemon(fast_schedule(pair_interval_s=1000))
        engines, run_id = dict(daemon.engines), daemon.run_id
        broken = tmp_path / "broken-model"
        broken.mkdir()
        (broken / "config.json").write_text("{")
        write_config(
            tmp_path,
            fast_schedule(pair_interval_s=1000),
            arms=FAKE_ARMS.split("[arms.speculative]")[0]
            + f'[arms.speculative]\nkind = "transformers"\nmodel = "{broken}"\n'
            + 'device = "cpu"\n[arms.speculative.speculative]\nmethod = "prompt_lookup"\n',
        )
        assert not daemon.reload()
        assert daemon.engines == engines and daemon.run_id == run_id
        assert get(daemon, "/readyz").json()["engines_loaded"] is True
        cycles = daemon.cycles
        daemon.run_cycle()
        assert daemon.cycles == cycles + 1 and stored_pairs(daemon) >= 1

    def test_restart_only_keys_keep_their_running_values(
        self, tmp_path: Path, make_daemon: Callable[..., Daemon]
    ) -> None:
        """A reload cannot move the store or the listen address; those stay as started."""
        daemon = make_daemon(fast_schedule(pair_interval_s=1000))
        url = daemon.settings.storage.url
        path = write_config(tmp_path, fast_schedule(pair_interval_s=999))
        path.write_text(path.read_text().replace("canaryd.db", "other.db"))
        assert daemon.reload()
        assert daemon.settings.storage.url == url
        assert daemon.settings.schedule.pair_interval_s == 999

    def test_a_new_schedule_moves_the_pair_cycle_onto_its_interval(
        self, tmp_path: Path, make_daemon: Callable[..., Daemon]
    ) -> None:
        """A reload that changes `pair_interval_s` reschedules the cycle job and the pace
        gauge with it."""
        daemon = make_daemon(fast_schedule(pair_interval_s=1000))
        write_config(tmp_path, fast_schedule(pair_interval_s=999))
        assert daemon.reload()
        trigger: Any = daemon.scheduler.get_job(CYCLE_JOB).trigger
        assert trigger.interval.total_seconds() == 999
        assert sample(daemon, "canaryd_pair_interval_seconds") == 999


class TestConfigReference:
    def test_docs_carry_the_generated_reference_verbatim(self) -> None:
        """docs/configuration.md contains `config_reference()` exactly (regenerate it if not)."""
        docs = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
        assert config_reference() in docs

    def test_every_settings_section_is_documented(self) -> None:
        """Each section of Settings has a table in the reference."""
        reference = config_reference()
        for section in Settings.model_fields:
            assert f"`{section}." in reference

    def test_the_annotated_example_is_a_valid_config(self) -> None:
        """docs/canaryd.example.toml loads, and it names every section."""
        path = REPO / "docs" / "canaryd.example.toml"
        settings = load_settings(path)
        text = path.read_text(encoding="utf-8")
        for section in Settings.model_fields:
            assert f"[{section}" in text
        assert settings.schedule.pair_interval_s > 0


def run_info(run_id: str = "r") -> RunInfo:
    return RunInfo(
        run_id=run_id,
        kind="daemon",
        started_at=datetime.now(UTC),
        config={},
        config_hash="c" * 16,
        baseline_identity={"kind": "fake"},
        speculative_identity={"kind": "fake"},
    )


def answered(n: int, text: str = "an answer", output_tokens: int = 2) -> PairRecord:
    """A complete pair numbered `n` whose arms answered `text` in `output_tokens` tokens."""
    result = GenerationResult(
        text=text,
        token_ids=(1, 2),
        finish_reason="stop",
        prompt_tokens=3,
        output_tokens=output_tokens,
        ttft_s=0.01,
        tpot_s=0.01,
        e2e_s=0.02,
    )
    return replace(
        record(n),
        prompt=Prompt(
            id="p", category="qa", messages=(Message("user", f"say {text}"),), max_tokens=4
        ),
        baseline=result,
        speculative=result,
    )


@pytest.fixture
def writer_on(
    database_url: str, tmp_path: Path
) -> Iterator[tuple[PairWriter, SqlStore, Quarantine, CanarydMetrics]]:
    """A PairWriter on a fresh database (SQLite file, or a PostgreSQL schema of its own)."""
    store = SqlStore.open(database_url, create=True)
    store.create_run(run_info())
    metrics = CanarydMetrics()
    quarantine = Quarantine(tmp_path / "data" / "quarantined-pairs.jsonl")
    writer = PairWriter(10, metrics.store, quarantine)
    writer.open(store)
    yield writer, store, quarantine, metrics
    writer.close()
    store.close()


def quarantined(quarantine: Quarantine) -> list[dict[str, Any]]:
    if not quarantine.path.exists():
        return []
    return [json.loads(line) for line in quarantine.path.read_text().splitlines()]


def metric(metrics: CanarydMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


class TestStorageFaults:
    def test_nul_in_text_is_stored_sanitised(
        self, writer_on: tuple[PairWriter, SqlStore, Quarantine, CanarydMetrics]
    ) -> None:
        """A NUL character in the output and the prompt (which PostgreSQL refuses in text
        and JSON) is stored as U+FFFD on every backend, counted and logged; the pair is
        neither lost nor quarantined."""
        writer, store, quarantine, metrics = writer_on
        assert writer.save(answered(1, text="a\x00b"))
        assert writer.save(answered(2))
        (first, second) = sorted(store.pairs(), key=lambda p: p.pair_id)
        assert first.baseline.text == "a\ufffdb" == first.speculative.text
        assert first.prompt.messages[0].content == "say a\ufffdb"
        assert second.baseline.text == "an answer"
        assert metric(metrics, "canaryd_pairs_sanitised_total") == 1
        assert quarantined(quarantine) == []
        assert writer.problem is None

    def test_an_integer_out_of_range_is_quarantined_and_the_next_pair_stored(
        self, writer_on: tuple[PairWriter, SqlStore, Quarantine, CanarydMetrics]
    ) -> None:
        """A garbage token count (2**70: beyond SQLite's 64 bits and PostgreSQL's integer)
        is refused by the database: the pair goes to the quarantine file with the reason,
        counted, and the cycle's next pair is stored as usual (no buffering, the database
        is not away)."""
        writer, store, quarantine, metrics = writer_on
        assert writer.save(answered(1, output_tokens=2**70))
        assert writer.save(answered(2))
        assert [p.pair_id for p in store.pairs()] == ["2"]
        (entry,) = quarantined(quarantine)
        assert entry["pair"]["pair_id"] == "1"
        assert entry["pair"]["baseline"]["output_tokens"] == 2**70
        assert "refused by the database" in entry["reason"]
        assert metric(metrics, "canaryd_pairs_quarantined_total") == 1
        assert len(writer.pending) == 0 and writer.problem is None
        assert quarantine.path.stat().st_mode & 0o777 == 0o600

    def test_a_refused_pair_in_the_buffer_does_not_hold_back_the_rest(
        self, writer_on: tuple[PairWriter, SqlStore, Quarantine, CanarydMetrics]
    ) -> None:
        """Buffered while the database was away, a pair it then refuses is quarantined at
        the flush and the pairs behind it are saved (it would otherwise fail every flush)."""
        writer, store, quarantine, _metrics = writer_on
        writer.buffer(answered(1, output_tokens=2**70))
        writer.buffer(answered(2))
        writer.buffer(answered(3, text="x\x00"))
        assert writer.flush()
        assert sorted(p.pair_id for p in store.pairs()) == ["2", "3"]
        assert [e["pair"]["pair_id"] for e in quarantined(quarantine)] == ["1"]

    def test_an_unexpected_error_is_retried_then_quarantined(self, tmp_path: Path) -> None:
        """A store failing with something other than `DatabaseError` (a bug, a constraint
        race) gets one more try; failing again, the pair is quarantined with its traceback
        in the file, and save() reports it handled, so the cycle goes on."""

        class Broken:
            calls = 0

            def save_pair(self, record: PairRecord) -> None:
                self.calls += 1
                raise RuntimeError("no such column\n[parameters: secret text]")

        metrics = CanarydMetrics()
        quarantine = Quarantine(tmp_path / "q.jsonl")
        writer = PairWriter(10, metrics.store, quarantine)
        broken = Broken()
        writer.open(broken)  # type: ignore[arg-type]
        assert writer.save(answered(1))
        assert broken.calls == 2
        (entry,) = quarantined(quarantine)
        assert entry["reason"] == "RuntimeError: no such column"
        assert "Traceback" in entry["detail"]
        assert metric(metrics, "canaryd_pairs_quarantined_total") == 1

    def test_an_unwritable_quarantine_is_a_counted_loss(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """When the quarantine file cannot be written either, the pair is lost loudly:
        logged as `pair.lost` and counted as a dropped pair."""

        class Refusing:
            def save_pair(self, record: PairRecord) -> None:
                raise RecordRejectedError("saving pair", "integer out of range")

        blocker = tmp_path / "not-a-directory"
        blocker.write_text("")
        metrics = CanarydMetrics()
        writer = PairWriter(10, metrics.store, Quarantine(blocker / "q.jsonl"))
        writer.open(Refusing())  # type: ignore[arg-type]
        assert writer.save(answered(1))
        assert metric(metrics, "canaryd_store_errors_total", kind="pair_dropped") == 1
        assert "pair.lost" in capsys.readouterr().out

    def test_the_quarantine_file_is_bounded(self, tmp_path: Path) -> None:
        """Past its size limit the file is rotated to one `.1` file: at most about twice
        the limit is kept, newest entries last."""
        quarantine = Quarantine(tmp_path / "q.jsonl", max_bytes=4000)
        for n in range(40):
            quarantine.add(answered(n), "refused")
        assert quarantine.path.stat().st_size <= 4000
        assert quarantine.rotated.stat().st_size <= 4000
        assert not quarantine.path.with_name("q.jsonl.2").exists()
        last = quarantine.path.read_text().splitlines()[-1]
        assert json.loads(last)["pair"]["pair_id"] == "39"


class TestStorageFaultsInTheDaemon:
    def test_a_suite_prompt_holding_nul_is_refused_at_start(self, tmp_path: Path) -> None:
        """A suite prompt holding a NUL character (which PostgreSQL refuses) stops the
        start with the file and line, before anything runs; NUL in an engine's output is
        stored sanitised (`test_nul_in_text_is_stored_sanitised`)."""
        from canaryd.errors import PromptFileError

        suite = tmp_path / "nul.jsonl"
        prompt = {
            "id": "nul-001",
            "category": "qa",
            "messages": [{"role": "user", "content": "echo a\u0000b a\u0000b"}],
            "max_tokens": 8,
        }
        suite.write_text(json.dumps(prompt) + "\n")
        path = write_config(tmp_path, fast_schedule() + f'[prompts]\nsuites = ["{suite}"]\n')
        daemon = Daemon(load_settings(path), config_path=path)
        with pytest.raises(PromptFileError, match=f"{suite}:1: a NUL character"):
            daemon.start()
        assert not daemon.running


class TestWedgedCycle:
    def test_a_stuck_generation_stops_feeding_the_watchdog_until_pairs_progress(
        self, make_daemon: Callable[..., Daemon]
    ) -> None:
        """A generation stuck past `max_stall_s` (here `server.max_cycle_age_s = 1`) keeps
        the heartbeat job running but stops calling the watchdog hooks, and /healthz says
        why; once the pair finishes, the hooks are called again."""
        stuck = FAKE_ARMS.replace(
            "speculative = true", "speculative = true\nrealtime = true\nttft_s = 5.0"
        )
        daemon = make_daemon(
            fast_schedule(shutdown_timeout_s=0.3), arms=stuck, server="max_cycle_age_s = 1.0"
        )
        fed: list[float] = []
        daemon.heartbeat_hooks.append(fed.append)
        health = wait_for(
            lambda: (
                (r := get(daemon, "/healthz")).status_code == 503
                and "no cycle progress" in r.text
                and r
            ),
            what="/healthz to report the stall",
        )
        # The stall is reported once the age passes 1 s; the JSON rounds it to 3 places,
        # so an age of 1.0004 s reads 1.0.
        assert health.json()["last_progress_age_s"] >= 1.0
        assert health.json()["max_stall_s"] == 1.0
        # A heartbeat that found the soak progressing just before the stall may still be
        # calling the hooks. Heartbeats never overlap (max_instances = 1), so once the
        # next one has begun, the earlier one is done and every later one starts after
        # the stall was seen.
        beat = daemon.last_heartbeat
        wait_for(lambda: daemon.last_heartbeat != beat, what="a heartbeat after the stall")
        fed_at_stall, beats_at_stall = len(fed), daemon.last_heartbeat
        time.sleep(0.6)
        assert len(fed) == fed_at_stall, "the watchdog was fed while the cycle was stuck"
        assert daemon.last_heartbeat != beats_at_stall  # the scheduler itself is alive
        wait_for(lambda: len(fed) > fed_at_stall, timeout=10, what="the hooks again")
        assert pairs_run(daemon) >= 1


class TestClockJumps:
    def test_pairs_and_gate_runs_resume_soon_after_the_clock_is_set_back_an_hour(
        self, tmp_path: Path
    ) -> None:
        """A wall clock set back an hour leaves every job's next run an hour away on
        APScheduler's clock; the clock watch sees the step against the monotonic clock,
        logs `clock.jumped` and moves the jobs back, so that pairs and gate runs resume
        within seconds, not an hour, and /healthz stays 200."""
        path = write_config(tmp_path, fast_schedule(gate_interval_s=1.0))
        behind = [0.0]
        daemon = Daemon(
            load_settings(path), config_path=path, wall_clock=lambda: time.time() - behind[0]
        )
        daemon.start()
        try:
            wait_for(lambda: gate_runs(daemon) >= 1, what="a gate run")
            scheduler = daemon.scheduler
            # APScheduler reads the real clock here: to it, a clock set back an hour is
            # every next run an hour later. Paused meanwhile, so that none runs between.
            scheduler.pause()
            for job in scheduler.get_jobs():
                if job.next_run_time is not None:
                    scheduler.modify_job(job.id, next_run_time=job.next_run_time + HOUR)
            scheduler.resume()
            soonest = min(j.next_run_time for j in scheduler.get_jobs() if j.next_run_time)
            assert soonest > datetime.now(UTC) + HOUR - timedelta(seconds=60)
            cycles, gates = daemon.cycles, gate_runs(daemon)
            with capture_logs() as logs:
                behind[0] = 3600.0
                # Two more of each: one may have been in flight when the jobs were moved.
                wait_for(lambda: daemon.cycles >= cycles + 2, what="pairs again")
                wait_for(lambda: gate_runs(daemon) >= gates + 2, what="gate runs again")
            (jumped,) = [e for e in logs if e["event"] == "clock.jumped"]
            assert jumped["jump_s"] == pytest.approx(-3600.0, abs=1.0)
            assert set(jumped["next_runs_in_s"]) >= {CYCLE_JOB, GATE_JOB, HEARTBEAT_JOB}
            health = get(daemon, "/healthz")
            assert health.status_code == 200, health.text
        finally:
            daemon.stop()


class TestSwitchStateAtStart:
    def test_the_state_file_is_written_before_the_engines_fail_to_load(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """After a reboot /run is empty; the database says rolled back. A GPU that fails
        at engine load stops the daemon, but production already has the stored state in
        the state file (confirmed only as far as a completed gate run was)."""
        from canaryd.judging.gatejob import SwitchGates
        from canaryd.switch import SwitchService, read_state_file
        from engine.fake import FakeEngine
        from gates import SwitchEvent

        state_file = tmp_path / "run" / "switch.json"
        path = write_config(tmp_path, f'[switch]\nstate_file = "{state_file}"\n')
        settings = load_settings(path)
        with SqlStore.open(settings.storage.resolved_url(), create=True) as store:
            SwitchService(store, settings.switch, settings.gates.policy).command(
                SwitchEvent("rollback", "alice", "INC-3")
            )
        state_file.unlink()  # the reboot

        def broken_gpu(_engine: FakeEngine) -> None:
            raise RuntimeError("CUDA error: no CUDA-capable device is detected")

        monkeypatch.setattr(FakeEngine, "load", broken_gpu)
        gates = SwitchGates(settings)
        daemon = Daemon(settings, config_path=path, gates=gates)
        try:
            with pytest.raises(RuntimeError, match="CUDA"):
                daemon.start()
        finally:
            gates.close()
        assert not daemon.running
        data = read_state_file(state_file)
        assert data is not None
        assert data["mode"] == "rolled_back" and data["speculative_enabled"] is False
        assert data["generation"] == 1 and data["reason"] == "INC-3"
        # Only a completed gate run confirms the file; none has, so it claims no freshness.
        assert "confirmed_at" not in data


class TestReloadReleasesModels:
    def test_a_reload_to_another_model_frees_the_old_one(
        self, tmp_path: Path, make_daemon: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Both arms on transformers model "a", reloaded onto model "b": "b" is loaded once
        for both arms, and the old model object is freed (no engine or cache keeps it),
        so a reload does not leave the old weights in (GPU) memory."""
        import engine.loading
        from engine.testing import tiny_llama

        tokenizer = tiny_llama()[1]
        loaded: dict[str, list[weakref.ref[Any]]] = {}

        def load(path: str, **_kwargs: Any) -> tuple[Any, Any]:
            model, _ = tiny_llama(tokenizer=tokenizer)
            loaded.setdefault(str(path), []).append(weakref.ref(model))
            return model, tokenizer

        monkeypatch.setattr(engine.loading, "load_causal_lm", load)

        def arms(model: str) -> str:
            arm = f'kind = "transformers"\nmodel = "{model}"\ndevice = "cpu"\nwarmup_tokens = 0\n'
            return (
                f"[arms.baseline]\n{arm}[arms.speculative]\n{arm}"
                '[arms.speculative.speculative]\nmethod = "prompt_lookup"\n'
            )

        slow = fast_schedule(pair_interval_s=1000) + "[prompts]\nmax_tokens = 2\n"
        daemon = make_daemon(slow, arms=arms("a"))
        assert [len(refs) for refs in loaded.values()] == [1]
        write_config(tmp_path, slow, arms=arms("b"))
        assert daemon.reload()
        gc.collect()
        assert len(loaded["b"]) == 1 and loaded["b"][0]() is not None
        assert loaded["a"][0]() is None, "the old model is still referenced after reload"


class TestBufferBound:
    def test_buffer_pairs_has_an_upper_bound(self, tmp_path: Path) -> None:
        """A buffer of a billion pairs (tens of GB of text in a long outage) is refused
        at load, naming the key; the largest allowed value loads."""
        path = write_config(tmp_path, storage="buffer_pairs = 1000000000")
        with pytest.raises(ConfigError, match=r"storage\.buffer_pairs"):
            load_settings(path)
        path = write_config(tmp_path, storage="buffer_pairs = 100000")
        assert load_settings(path).storage.buffer_pairs == 100_000
