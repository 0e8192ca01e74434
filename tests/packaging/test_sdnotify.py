"""sd_notify against a real AF_UNIX datagram socket: the module speaks systemd's protocol
(path and abstract sockets, a no-op outside systemd), and a real `canaryd run` process
sends READY=1 only once its engines are loaded and its database checked, then WATCHDOG=1
from the scheduler's heartbeat, and STOPPING=1 on SIGTERM; a start-up that fails never
says READY."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from canaryd.daemon import sdnotify

REPO = Path(__file__).resolve().parents[2]


class Listener:
    """A notify socket as systemd binds it: datagrams, one notification each."""

    def __init__(self, sock: socket.socket, env_value: str) -> None:
        self.sock = sock
        self.env_value = env_value  # what NOTIFY_SOCKET says

    def receive(self, timeout: float = 5.0) -> list[str]:
        """The lines of the next notification (fails the test after `timeout`)."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            pytest.fail(f"no notification within {timeout} s")
        return data.decode().split("\n")

    def drain(self) -> list[list[str]]:
        """Every notification already waiting, without blocking."""
        self.sock.setblocking(False)
        messages = []
        try:
            while True:
                messages.append(self.sock.recv(4096).decode().split("\n"))
        except BlockingIOError:
            pass
        return messages


@pytest.fixture
def path_listener(tmp_path: Path) -> Iterator[Listener]:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        yield Listener(sock, str(path))


@pytest.fixture
def abstract_listener() -> Iterator[Listener]:
    name = f"canaryd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        yield Listener(sock, "@" + name)


@pytest.fixture(autouse=True)
def _no_systemd_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)


class TestNotify:
    def test_outside_systemd_every_call_is_a_no_op(self) -> None:
        """Without NOTIFY_SOCKET nothing is sent and nothing raises."""
        assert not sdnotify.ready()
        assert not sdnotify.watchdog()
        assert not sdnotify.stopping()
        assert not sdnotify.status("idle")
        assert not sdnotify.reloading()

    def test_ready_reaches_a_path_socket(
        self, path_listener: Listener, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """READY=1 arrives as one datagram on a filesystem socket, with its status line."""
        monkeypatch.setenv("NOTIFY_SOCKET", path_listener.env_value)
        assert sdnotify.ready("2 engines loaded")
        assert path_listener.receive() == ["READY=1", "STATUS=2 engines loaded"]

    def test_abstract_socket_is_addressed_with_a_leading_nul(
        self, abstract_listener: Listener, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """'@name' in NOTIFY_SOCKET is the abstract-namespace socket '\\0name'."""
        monkeypatch.setenv("NOTIFY_SOCKET", abstract_listener.env_value)
        assert sdnotify.watchdog()
        assert abstract_listener.receive() == ["WATCHDOG=1"]

    def test_each_message_kind(
        self, path_listener: Listener, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """stopping, status and reloading send the documented keys; status is one line."""
        monkeypatch.setenv("NOTIFY_SOCKET", path_listener.env_value)
        sdnotify.stopping()
        sdnotify.status("cycle 3\nok")
        sdnotify.reloading()
        assert path_listener.receive() == ["STOPPING=1"]
        assert path_listener.receive() == ["STATUS=cycle 3 ok"]
        reloading = path_listener.receive()
        assert reloading[0] == "RELOADING=1"
        assert reloading[1].startswith("MONOTONIC_USEC=")

    def test_a_missing_socket_is_reported_not_raised(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A socket that is gone makes the call return False; the daemon keeps running."""
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
        assert not sdnotify.ready()

    def test_unsupported_socket_kinds_are_ignored(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """vsock addresses (for VMs) are not used by a host daemon: no-op."""
        monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
        assert not sdnotify.watchdog()


class TestWatchdogInterval:
    def test_off_without_watchdog_usec(self) -> None:
        """No WATCHDOG_USEC: the watchdog is off."""
        assert sdnotify.watchdog_interval_s() is None

    def test_reads_microseconds(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """WATCHDOG_USEC=60000000 is a 60 s timeout."""
        monkeypatch.setenv("WATCHDOG_USEC", "60000000")
        assert sdnotify.watchdog_interval_s() == 60.0

    def test_for_another_pid_it_is_off(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """WATCHDOG_PID naming another process means the watchdog is not ours."""
        monkeypatch.setenv("WATCHDOG_USEC", "60000000")
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
        assert sdnotify.watchdog_interval_s() is None
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
        assert sdnotify.watchdog_interval_s() == 60.0

    def test_garbage_and_zero_are_off(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A value that is not a positive integer turns the watchdog off."""
        for value in ("", "abc", "0", "-5"):
            monkeypatch.setenv("WATCHDOG_USEC", value)
            assert sdnotify.watchdog_interval_s() is None


# -- the daemon under a notify socket ---------------------------------------------------

FAKE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
"""
# Loads after the baseline engine and the database, then fails: its key is not set.
FAILING_SPECULATIVE_ARM = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "openai"
base_url = "http://127.0.0.1:9"
speculative = true
api_key_env = "CANARYD_TEST_KEY_THAT_IS_NOT_SET"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_daemon(
    tmp_path: Path,
    listener: Listener,
    arms: str,
    port: int,
    *,
    schedule: str = "",
    server: str = "",
) -> subprocess.Popen[bytes]:
    config = tmp_path / "canaryd.toml"
    config.write_text(
        arms
        + f"""
[prompts]
max_tokens = 8
[storage]
url = "sqlite:///{tmp_path / "canaryd.db"}"
[gates.budget]
over_design_rate = "rebudget"
[schedule]
pair_interval_s = 0.2
jitter_s = 0
heartbeat_interval_s = 0.2
{schedule}
[server]
listen = "127.0.0.1:{port}"
{server}
[logging]
format = "json"
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
    env.update(
        CANARYD_DATA_DIR=str(tmp_path / "data"),
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        NOTIFY_SOCKET=listener.env_value,
        WATCHDOG_USEC="2000000",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "canaryd", "run", "--config", str(config)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "canaryd.log").open("wb"),
    )


def stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def wait_for_key(
    listener: Listener,
    key: str,
    timeout: float,
    process: subprocess.Popen[bytes] | None = None,
) -> list[list[str]]:
    """Notifications up to and including the first carrying `key`.

    With `process`, fail early when it exits, or when it logged `daemon.started` (start-up
    finished) 10 s ago and still sent no `key` (the daemon does not notify at all)."""
    seen: list[list[str]] = []
    deadline = time.monotonic() + timeout
    started_at: float | None = None
    while True:
        now = time.monotonic()
        if now > deadline:
            pytest.fail(f"no {key} within {timeout} s; got {seen}")
        if process is not None:
            log = _log(process)
            if process.poll() is not None:
                pytest.fail(f"canaryd exited {process.returncode} before {key}; got {seen}:\n{log}")
            if started_at is None and '"daemon.started"' in log:
                started_at = now
            if started_at is not None and now - started_at > 10:
                pytest.fail(f"canaryd started 10 s ago but sent no {key} (sd_notify not wired?)")
        listener.sock.settimeout(0.2)
        try:
            message = listener.sock.recv(4096).decode().split("\n")
        except TimeoutError:
            continue
        seen.append(message)
        if key in message:
            return seen


def _log(process: subprocess.Popen[bytes]) -> str:
    return Path(str(process.args[-1])).with_name("canaryd.log").read_text()[-3000:]


@pytest.mark.slow
class TestDaemonNotifies:
    def test_ready_after_warm_up_then_watchdog_then_stopping(
        self, tmp_path: Path, path_listener: Listener
    ) -> None:
        """READY=1 comes once /readyz already says engines loaded and database reachable,
        no WATCHDOG=1 precedes it, pings follow at the heartbeat, and SIGTERM says
        STOPPING=1 before the process exits 0."""
        port = free_port()
        process = start_daemon(tmp_path, path_listener, FAKE_ARMS, port)
        try:
            before_ready = wait_for_key(path_listener, "READY=1", 120, process)
            # At the moment READY=1 arrives, readiness must already hold: the warm-up and
            # the database check happened before the notification, not after.
            readyz = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
            assert readyz.status_code == 200, readyz.text
            assert readyz.json()["engines_loaded"] is True
            assert readyz.json()["database"] == "reachable"
            earlier = [line for message in before_ready[:-1] for line in message]
            assert "READY=1" not in earlier
            assert "WATCHDOG=1" not in earlier

            pings = [wait_for_key(path_listener, "WATCHDOG=1", timeout=5) for _ in range(3)]
            assert all("READY=1" not in m for batch in pings for m in batch)

            process.send_signal(signal.SIGTERM)
            wait_for_key(path_listener, "STOPPING=1", timeout=15)
            assert process.wait(timeout=30) == 0
        finally:
            stop(process)

    def test_a_wedged_cycle_stops_the_watchdog_pings(
        self, tmp_path: Path, path_listener: Listener
    ) -> None:
        """A generation stuck past the stall limit (`server.max_cycle_age_s = 1`): READY=1
        comes as usual, then `cycle.stalled` is logged and WATCHDOG=1 stops while the
        process still runs, so systemd's WatchdogSec restarts it."""
        stuck = FAKE_ARMS.replace(
            "speculative = true", "speculative = true\nrealtime = true\nttft_s = 60.0"
        )
        process = start_daemon(
            tmp_path,
            path_listener,
            stuck,
            free_port(),
            schedule="shutdown_timeout_s = 0.5",
            server="max_cycle_age_s = 1.0",
        )
        try:
            wait_for_key(path_listener, "READY=1", 120, process)
            deadline = time.monotonic() + 20
            while '"cycle.stalled"' not in _log(process):
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"no cycle.stalled logged:\n{_log(process)}")
                time.sleep(0.1)
            time.sleep(0.3)  # a ping sent just before the stall was noticed
            path_listener.drain()
            time.sleep(2.0)  # ten heartbeats
            later = [line for message in path_listener.drain() for line in message]
            assert "WATCHDOG=1" not in later
            assert process.poll() is None
        finally:
            stop(process)

    def test_a_failed_warm_up_never_says_ready(
        self, tmp_path: Path, path_listener: Listener
    ) -> None:
        """An arm that cannot load makes `canaryd run` exit 2 without READY=1 (systemd
        then reports the start as failed instead of running a half-started canary)."""
        process = start_daemon(tmp_path, path_listener, FAILING_SPECULATIVE_ARM, free_port())
        try:
            assert process.wait(timeout=90) == 2
        finally:
            stop(process)
        lines = [line for message in path_listener.drain() for line in message]
        assert "READY=1" not in lines
