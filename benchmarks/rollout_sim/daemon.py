"""`canaryd run` as an operator starts it: a subprocess of its own, every default but what
a rollout deployment must set.

The configuration file is `config.run_config`'s (the shipped example's, pointed at
loopback); the data directory (`CANARYD_DATA_DIR`) is the run's own; the bearer token
comes from `CANARYD_SERVER__AUTH_TOKEN`, as the guide says to set it. `checkout` runs
canaryd from another tree (its working directory and `PYTHONPATH`: the code before a
change, say), this one's by default.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Daemon:
    """`canaryd run --config FILE` in `work`, stopped by SIGTERM on exit."""

    def __init__(
        self, work: Path, config: str, port: int, token: str, checkout: Path = REPO
    ) -> None:
        self.work, self.port, self.token, self.checkout = work, port, token, checkout
        self.config = work / "canaryd.toml"
        self.config.write_text(config, encoding="utf-8")
        self.log_path = work / "canaryd.log"
        self._log: IO[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
        env.update(
            CANARYD_DATA_DIR=str(self.work / "data"),
            CANARYD_SERVER__AUTH_TOKEN=self.token,
            HF_HUB_OFFLINE="1",
            PYTHONUNBUFFERED="1",
        )
        if self.checkout != REPO:
            env["PYTHONPATH"] = str(self.checkout)
        return env

    def __enter__(self) -> Daemon:
        (self.work / "data").mkdir(exist_ok=True)
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "canaryd", "run", "--config", str(self.config)],
            cwd=self.checkout,
            env=self.environment(),
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_until_judging(self, timeout_s: float) -> float:
        """Wait until the verdict endpoint answers 200 (a gate run has completed, as on a
        daemon that ran before the rollout began); the seconds it took."""
        started = time.monotonic()
        headers = {"Authorization": f"Bearer {self.token}"}
        while time.monotonic() - started < timeout_s:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"canaryd run exited {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                answer = httpx.get(
                    f"{self.url}/v1/verdict",
                    params={"revision": "before-the-rollout"},
                    headers=headers,
                    timeout=5.0,
                )
                if answer.status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"canaryd did not judge within {timeout_s:g} s:\n{self.log_tail()}")

    def switch_rollback(self, reason: str) -> tuple[int, str]:
        """`canaryd switch rollback --reason REASON` on the daemon's own config and data
        (the kill switch, as an operator pulls it): exit code and output."""
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "canaryd",
                "switch",
                "rollback",
                "--reason",
                reason,
                "--config",
                str(self.config),
            ],
            cwd=self.checkout,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        said = done.stdout.strip() or done.stderr.strip()
        return done.returncode, said[-300:]
