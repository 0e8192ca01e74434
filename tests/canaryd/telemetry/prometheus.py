"""A real Prometheus server on loopback, for the PromQL source's tests.

`PrometheusServer` starts Debian's `prometheus` binary with its own data directory on a
free loopback port, scraping the given targets every 250 ms; each target group carries its
own labels (`deployment = …`), as a Kubernetes scrape would add them, so a selector picks
an arm's series. `wait_until` polls the query API until a query's answer satisfies a
predicate, so a test reads only after Prometheus has ingested what it changed. Without the
binary the tests skip, saying how to install it; under CI=true they fail instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SCRAPE_INTERVAL = "250ms"
WAIT_S = 60.0  # Prometheus' first scrape on a busy machine took 6 s


def prometheus_binary() -> str:
    """The binary, or a skip (a failure under CI=true) naming how to install it."""
    if Path(PROMETHEUS).is_file():
        return PROMETHEUS
    reason = "prometheus is not installed (apt-get install prometheus, or .ci/services.sh)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the PromQL source tests are required under CI=true: {reason}")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _host(url: str) -> str:
    return url.split("/")[2]


class PrometheusServer:
    """Prometheus scraping `targets`: deployment name → the /metrics URLs labelled with it."""

    def __init__(
        self,
        directory: Path,
        targets: Mapping[str, Sequence[str]],
        *,
        scrape_interval: str = SCRAPE_INTERVAL,
    ) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        groups = "".join(
            f"      - targets: [{', '.join(repr(_host(u)) for u in urls)}]\n"
            f"        labels: {{deployment: {deployment!r}}}\n"
            for deployment, urls in targets.items()
        )
        self.config = directory / "prometheus.yml"
        self.config.write_text(
            f"global:\n  scrape_interval: {scrape_interval}\n  scrape_timeout: {scrape_interval}\n"
            "scrape_configs:\n  - job_name: llm\n    static_configs:\n" + groups
        )
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        log = (self.directory / "prometheus.log").open("wb")
        self._process = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.directory / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def log_tail(self) -> str:
        return (self.directory / "prometheus.log").read_text(errors="replace")[-2000:]

    def query(self, query: str) -> list[dict[str, Any]]:
        """The instant vector of `query` now ([] while Prometheus starts)."""
        try:
            response = httpx.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=2)
        except httpx.TransportError:
            return []
        if response.status_code != 200:
            return []
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    def wait_until(self, query: str, done: Callable[[list[dict[str, Any]]], bool]) -> None:
        """Polls until `done(answer)`; fails with Prometheus' log after `WAIT_S`."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if done(self.query(query)):
                return
            time.sleep(0.1)
        pytest.fail(f"Prometheus never answered {query!r} as expected; log:\n{self.log_tail()}")

    def wait_for_value(self, query: str, value: float) -> None:
        """Polls until `query` (one series) has `value`."""
        self.wait_until(
            query, lambda result: len(result) == 1 and float(result[0]["value"][1]) == value
        )
