"""The kill switch in the worst hour, run as an operator runs it (`python -m canaryd` in a
subprocess): a full data volume (a real tmpfs with a size limit) and a database whose
write lock another process holds. It exits 0 with the state file rolled back, says at
once when it waits, and the database records the rollback once it can."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from canaryd.store.switching_sql import SqlSwitchStore
from canaryd.switch import read_state_file
from canaryd.switch.statefile import STATE_FILE_BLOCK, overwrite_in_place, replace_file

_ROOT = Path(__file__).resolve().parents[3]


def _canaryd(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "canaryd", *args],
        env={**os.environ, "PYTHONPATH": str(_ROOT), "CANARYD_CONFIG": "", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _run(*args: str, env: dict[str, str]) -> tuple[int, str]:
    process = _canaryd(*args, env=env)
    output, _ = process.communicate(timeout=60)
    return process.returncode, output


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted after the test: a data volume that really fills up.
    A size limit on the process (`RLIMIT_FSIZE`) would not do: it fails a write past a
    size, not a new file's first block, so it cannot tell a new temp file from an
    overwrite in place. Skips where this user may not mount (not root)."""
    mount = tmp_path / "volume"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(volume: Path) -> Path:
    """Writes a filler file until the volume refuses another byte; returns it."""
    filler = volume / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


class TestFullDataVolume:
    def test_rollback_overwrites_the_file_in_place_and_is_recorded_once_space_returns(
        self, small_volume: Path
    ) -> None:
        """Database and state file on one full volume: `switch rollback` exits 0, the file
        says disabled, and the audit row appears once space returns (`switch status`)."""
        url = f"sqlite:///{small_volume / 'canaryd.db'}"
        state_file = small_volume / "switch.json"
        env = {"CANARYD_SWITCH__STATE_FILE": str(state_file)}
        for args in (("db", "upgrade", "--url", url), ("switch", "auto", "--url", url)):
            code, output = _run(*args, env=env)
            assert code == 0, output
        before = read_state_file(state_file)
        assert before is not None and before["speculative_enabled"] is True
        filler = _fill(small_volume)
        with pytest.raises(OSError):  # a new file's first block: no room
            (small_volume / "probe").write_bytes(b"x" * 4096)
        code, output = _run("switch", "rollback", "--reason", "disk full", "--url", url, env=env)
        assert code == 0, output
        assert "Traceback" not in output
        data = read_state_file(state_file)
        assert data is not None and data["speculative_enabled"] is False
        assert data["mode"] == "rolled_back" and data["generation"] > before["generation"]
        filler.unlink()
        code, output = _run("switch", "status", "--url", url, env=env)
        assert code == 0, output
        with SqlSwitchStore.open(url) as store:
            assert store.switch().state.mode.value == "rolled_back"
            reasons = [entry.reason for entry in store.audit()]
        assert sum("disk full" in reason for reason in reasons) == 1, reasons
        synced = read_state_file(state_file)
        assert synced is not None and "pending_sync" not in synced


class TestPaddedStateFile:
    def test_the_file_is_whole_blocks_of_plain_json(self, tmp_path: Path) -> None:
        """Every write pads the file to whole blocks with room to grow; it reads as the
        plain JSON, and an overwrite in place keeps its size (needs no new block)."""
        path = tmp_path / "switch.json"
        replace_file(path, {"generation": 1, "mode": "enabled"})
        size = path.stat().st_size
        assert size % STATE_FILE_BLOCK == 0
        assert read_state_file(path) == {"generation": 1, "mode": "enabled"}
        overwrite_in_place(path, {"generation": 2, "mode": "rolled_back", "reason": "x" * 900})
        assert path.stat().st_size == size
        assert read_state_file(path) == {
            "generation": 2,
            "mode": "rolled_back",
            "reason": "x" * 900,
        }


@contextmanager
def _write_lock_held(url: str) -> Iterator[None]:
    """Another writer holds the database's write lock on the switch: SQLite's (`BEGIN
    IMMEDIATE`), or PostgreSQL's row lock on the switch's row (`SELECT … FOR UPDATE`)."""
    if url.startswith("sqlite"):
        holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            yield
        finally:
            holder.close()
        return
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT * FROM switch_state FOR UPDATE")).fetchall()
            yield
            connection.rollback()
    finally:
        engine.dispose()


def _timed_lines(process: subprocess.Popen[str]) -> list[tuple[float, str]]:
    """Each line of `process`'s output with the seconds since now when it came."""
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append((time.monotonic() - started, line.rstrip("\n")))
    return lines


class TestDatabaseLockHeld:
    def test_the_kill_switch_says_it_waits_at_once_and_rolls_back_within_seconds(
        self, database_url: str, tmp_path: Path
    ) -> None:
        """Another writer holds the database's lock: `switch rollback` prints its first
        line within 1 s of reaching the database (that it waits, for how long, and what
        follows), then exits 0 with the state file rolled back within 10 s; the database
        records it once free. Reaching the database is timed by a command that fails
        there at once (a missing SQLite file): on a loaded CI box the interpreter's
        start alone can take a second."""
        started = time.monotonic()
        _run("switch", "status", "--url", f"sqlite:///{tmp_path / 'absent.db'}", env={})
        startup = time.monotonic() - started
        state_file = tmp_path / "state" / "switch.json"
        env = {"CANARYD_SWITCH__STATE_FILE": str(state_file)}
        code, output = _run("db", "upgrade", "--url", database_url, env=env)
        assert code == 0, output
        code, output = _run("switch", "auto", "--url", database_url, env=env)
        assert code == 0, output
        with _write_lock_held(database_url):
            started = time.monotonic()
            process = _canaryd(
                "switch", "rollback", "--reason", "locked", "--url", database_url, env=env
            )
            collected: list[list[tuple[float, str]]] = []
            reader = threading.Thread(target=lambda: collected.append(_timed_lines(process)))
            reader.start()
            code = process.wait(timeout=30)
            took = time.monotonic() - started
            reader.join(timeout=5)
        lines = collected[0]
        # Start-up timed once more after the run: the slower of the two bounds it, so a
        # load spike during one interpreter start does not decide the test.
        started = time.monotonic()
        _run("switch", "status", "--url", f"sqlite:///{tmp_path / 'absent.db'}", env={})
        startup = max(startup, time.monotonic() - started)
        assert code == 0, lines
        first_at, first = lines[0]
        assert first.startswith("canaryd: waiting for the database"), lines
        assert "at most 5 s, then the kill switch writes the state file alone" in first
        assert first_at < startup + 1.0, (startup, lines)
        assert took < 10.0, lines
        data = read_state_file(state_file)
        assert data is not None and data["speculative_enabled"] is False
        assert data["pending_sync"] is True
        code, output = _run("switch", "status", "--url", database_url, env=env)
        assert code == 0, output
        with SqlSwitchStore.open(database_url) as store:
            assert store.switch().state.mode.value == "rolled_back"
        print(f"start-up {startup:.2f} s, first line at {first_at:.2f} s, exit 0 at {took:.2f} s")
