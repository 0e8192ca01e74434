"""A real Prometheus server scrapes a running `canaryd run` on loopback, and a PromQL query
for the acceptance-length series returns data per category."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_daemon_process import Daemon

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

FAST_FAKE = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
[gates.budget]
over_design_rate = "rebudget"
[schedule]
pair_interval_s = 0.1
jitter_s = 0
pairs_per_cycle = 3
[server]
listen = "127.0.0.1:0"
[logging]
format = "json"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def prometheus_binary() -> str:
    if Path(PROMETHEUS).is_file():
        return PROMETHEUS
    reason = "prometheus is not installed (apt-get install prometheus, or .ci/services.sh)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the Prometheus scrape test is required under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture
def canaryd(tmp_path: Path) -> Iterator[tuple[Daemon, str]]:
    """`canaryd run` on fast fake engines, starting; yields it and its status address."""
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "canaryd.toml"
    config.write_text(
        FAST_FAKE.replace("127.0.0.1:0", address)
        + f'[storage]\nurl = "sqlite:///{tmp_path / "canaryd.db"}"\n'
    )
    daemon = Daemon(config, tmp_path)
    yield daemon, address
    daemon.close()


@pytest.fixture
def prometheus(prometheus_binary: str, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Starts Prometheus on a free loopback port scraping `target` every second; returns
    its base URL."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    log = (tmp_path / "prometheus.log").open("wb")
    processes: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> str:
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: canaryd\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        processes.append(
            subprocess.Popen(
                [
                    prometheus_binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=log,
            )
        )
        return f"http://127.0.0.1:{port}"

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    log.close()


@pytest.mark.slow  # `canaryd run` and Prometheus subprocesses
class TestPrometheusScrape:
    def test_acceptance_length_per_category_reaches_prometheus(
        self, canaryd: tuple[Daemon, str], prometheus: Callable[[str], str], tmp_path: Path
    ) -> None:
        """Prometheus scrapes /metrics every second; the acceptance-length count per
        category comes back from its query API within a bounded wait."""
        # Both start at once (canaryd takes seconds to import); Prometheus retries the
        # scrape until canaryd listens.
        daemon, address = canaryd
        url = prometheus(address)
        assert daemon.wait_started() == address
        query = "sum by (category) (canaryd_speculative_acceptance_length_count)"
        deadline = time.monotonic() + 40
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                response = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=2)
                if response.status_code == 200:
                    result = response.json()["data"]["result"]
                    if len(result) >= 2:
                        break
            except httpx.TransportError:
                pass  # Prometheus still starting
            time.sleep(0.5)
        log = (tmp_path / "prometheus.log").read_text(errors="replace")[-2000:]
        assert len(result) >= 2, f"no acceptance-length series per category; prometheus:\n{log}"
        categories = {str(series["metric"]["category"]) for series in result}
        assert categories <= {
            "code", "extraction", "math", "multi_turn", "qa", "rag", "structured",
            "summarisation", "translation", "other",
        }  # fmt: skip
        assert all(float(series["value"][1]) > 0 for series in result)
