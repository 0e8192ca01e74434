"""SIGTERM keeps its bound when PostgreSQL freezes: `canaryd run` as a process, its
database reached through a loopback proxy that stops moving bytes (to the client, a
server under SIGSTOP: connections open, no answer, no server-side timeout can fire).

The in-flight pair may be lost, and only with `shutdown.pair_dropped`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.support.proxy import FreezableProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_sigterm_exits_within_its_bound_while_postgresql_is_frozen(
    database_url: str, tmp_path: Path
) -> None:
    """Pairs are stored through the proxy; it freezes; SIGTERM ends the process with exit
    0 within the shutdown timeout plus the gate-close and thread bounds, not minutes."""
    url = make_url(database_url)
    with FreezableProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        config = tmp_path / "canaryd.toml"
        config.write_text(
            f"""
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
[prompts]
max_tokens = 8
[storage]
url = "{proxied}"
[gates.budget]
over_design_rate = "rebudget"
[schedule]
pair_interval_s = 0.1
jitter_s = 0
gate_interval_s = 0.5
shutdown_timeout_s = 5
[server]
listen = "127.0.0.1:0"
[logging]
format = "json"
"""
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
        env.update(CANARYD_DATA_DIR=str(tmp_path / "data"), PYTHONUNBUFFERED="1")
        log = tmp_path / "canaryd.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "canaryd", "run", "--config", str(config)],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=sink,
            )
            try:
                deadline = time.monotonic() + 90
                while log.read_text().count('"pair.done"') < 3:
                    assert process.poll() is None, log.read_text()[-3000:]
                    assert time.monotonic() < deadline, log.read_text()[-3000:]
                    time.sleep(0.1)
                proxy.freeze()
                time.sleep(1.5)  # the next save and gate run are now stuck on the socket
                started = time.monotonic()
                process.send_signal(signal.SIGTERM)
                code = process.wait(60)
                took = time.monotonic() - started
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                proxy.thaw()
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    names = [e.get("event") for e in events]
    assert code == 0, log.read_text()[-3000:]
    # 5 s for the in-flight pair, 2 s each to store the run's end and to close the
    # gates, 1 s for worker threads: 10 s, and process start-up noise on top.
    print(f"SIGTERM to exit: {took:.1f} s")
    assert took < 18, f"SIGTERM took {took:.1f} s"
    assert "shutdown.pair_dropped" in names, names[-20:]
