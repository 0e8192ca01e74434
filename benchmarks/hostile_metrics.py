"""`canaryd run` scraping hostile Prometheus `/metrics` endpoints: peak memory, the largest
stored interval, the refusals logged, and what the telemetry gates read.

Each scenario starts the daemon as a user does (`python -m canaryd run --config …`, a
process of its own, two fake arms, SQLite, JSON logs) with `[telemetry]` reading an honest
baseline replica and a speculative arm served by `tests.support.hostile_metrics` on
loopback, and lets it run `--seconds` (scrapes every `--scrape-s`, gates every
`--gate-s`, `timeout_s` = the scrape interval):

- `healthy`: an honest speculative replica (the floor: the daemon's own memory);
- `le_139k`: an e2e histogram of 139,000 distinct `le` bounds (7.6 MB, under the byte cap);
- `series_250k`: 250,000 fabricated series of finished requests (13 MB; `max_bytes` raised
  to 32 MiB so that the series cap, not the byte cap, is what meets it);
- `gzip_bomb`: a 2 MB gzip body inflating to 1 GiB;
- `replicas_8_at_cap`: eight replicas each sending `max_bytes` of valid samples;
- `load_balanced_pair`: one URL in front of two pods answering in turn (counters go down
  and up at every scrape), 20 % of the new requests failing.

Reported per scenario: the wall time of one read of the speculative arm as the scrape job
reads it (`read_s`, in a process of its own, before the daemon starts) with its failures'
reasons, the daemon's peak RSS (VmHWM of /proc/<pid>/status, polled), the
largest stored interval (bytes of its histogram JSON, and of the whole row's columns), the
intervals stored per arm and the speculative arm's requests and errors in them, the
`telemetry.source_refused` and `telemetry.replica_failed` log lines (by replica and bound),
`canaryd_telemetry_refused_total`, and every state the telemetry gates showed
(`canaryd_gate_state`, polled). Goals: peak RSS under 400 MB, no stored interval over
64 KB, one log line per refused replica, and the telemetry gates never PASS on a hostile
source. `--pythonpath DIR` runs the daemon from another checkout (the code before a change,
say) while the servers stay this checkout's.

Usage: .venv/bin/python -m benchmarks.hostile_metrics [--seconds 60] [--scrape-s 5]
       [--gate-s 5] [--only NAME ...] [--pythonpath DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.hostile_metrics import (
    MetricsEndpoint,
    gzip_bomb,
    load_balanced,
    many_bounds,
    many_series,
    padded,
    vllm_exposition,
)

REPO = Path(__file__).resolve().parents[1]
GOAL_RSS_MB = 400.0
GOAL_INTERVAL_BYTES = 64 * 1024
MiB = 1 << 20
MAX_BYTES = 8 * MiB  # telemetry.max_bytes' default
REQUESTS_PER_SCRAPE = 300
TELEMETRY_GATES = ("telemetry.errors", "telemetry.latency", "telemetry.acceptance")
SERVING = re.compile(r"serving /metrics.* on http://(\S+) ")

CONFIG = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
[storage]
url = "sqlite:///{db}"
[server]
listen = "127.0.0.1:0"
[logging]
format = "json"
[schedule]
pair_interval_s = 10
jitter_s = 0
gate_interval_s = {gate_s}
[telemetry]
scrape_interval_s = {scrape_s}
timeout_s = {scrape_s}
{extra}
[telemetry.arms.baseline]
metrics_url = "{baseline}"
[telemetry.arms.speculative]
metrics_url = {speculative}
"""


@dataclass
class Scenario:
    """A speculative arm's endpoints (each an exposition of the answer's number) and the
    `[telemetry]` lines it needs."""

    name: str
    endpoints: Callable[[], list[MetricsEndpoint]]
    extra: str = ""


@dataclass
class Outcome:
    scenario: str
    exit_code: int | None
    peak_rss_mb: float
    largest_histograms_bytes: int
    largest_row_bytes: int
    intervals: dict[str, int]
    speculative_requests: int | None
    speculative_errors: int | None
    refusal_lines: dict[str, int]
    failure_lines: int
    refused_total: dict[str, float]
    gate_states: dict[str, list[str]] = field(default_factory=dict)
    error: str = ""  # the daemon's own error line, when it stopped on one
    read_s: float | None = None  # one read of the speculative arm, in a process of its own
    read_failures: list[str] = field(default_factory=list)

    @property
    def passed_on_hostile(self) -> bool:
        return self.scenario != "healthy" and any(
            "PASS" in states for states in self.gate_states.values()
        )


def honest(n: int) -> str:
    return vllm_exposition(REQUESTS_PER_SCRAPE * (n + 1))


def scenarios(bomb_bytes: int) -> list[Scenario]:
    at_cap = padded(MAX_BYTES - 1, REQUESTS_PER_SCRAPE).encode()  # one body for all eight
    bomb = gzip_bomb(bomb_bytes)  # made before any daemon starts: it takes seconds

    return [
        Scenario("healthy", lambda: [MetricsEndpoint(honest)]),
        Scenario(
            "le_139k",
            lambda: [
                MetricsEndpoint(lambda n: many_bounds(139_000, REQUESTS_PER_SCRAPE * (n + 1)))
            ],
        ),
        Scenario(
            "series_250k",
            lambda: [MetricsEndpoint(lambda n: many_series(250_000, n + 1))],
            extra=f"max_bytes = {32 * MiB}",
        ),
        Scenario("gzip_bomb", lambda: [MetricsEndpoint(lambda n: bomb, encoded=True)]),
        Scenario(
            "replicas_8_at_cap", lambda: [MetricsEndpoint(lambda n: at_cap) for _ in range(8)]
        ),
        Scenario(
            "load_balanced_pair",
            lambda: [
                MetricsEndpoint(
                    lambda n: load_balanced(
                        n, requests_per_scrape=REQUESTS_PER_SCRAPE, error_share=0.2
                    )
                )
            ],
        ),
    ]


def _vm_hwm_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def _refused(address: str) -> dict[str, float]:
    """`canaryd_telemetry_refused_total` by arm and reason, from the daemon's /metrics."""
    text = httpx.get(f"http://{address}/metrics", timeout=5).text
    return {
        f"{sample.labels['arm']}/{sample.labels['reason']}": sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "canaryd_telemetry_refused_total"
    }


@contextmanager
def daemon(
    config: Path,
    log: Path,
    pythonpath: str | None,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`canaryd run --config config` (from `pythonpath`'s checkout when given), its log in
    `log`, `extra_env` added to a clean environment; SIGTERM at the end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
    env.update(CANARYD_DATA_DIR=str(config.parent / "data"), PYTHONUNBUFFERED="1")
    env.update(extra_env or {})
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "canaryd", "run", "--config", str(config)],
            cwd=pythonpath or REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def events(log: Path) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def _stored(db: Path) -> tuple[int, int, dict[str, int], int | None, int | None]:
    """Largest histogram JSON and row (bytes of every column as SQLite holds it),
    intervals per arm, the speculative arm's requests and errors."""
    with sqlite3.connect(db) as connection:
        connection.row_factory = sqlite3.Row
        try:
            rows = connection.execute("SELECT * FROM telemetry_intervals").fetchall()
        except sqlite3.OperationalError:  # the daemon never started
            rows = []

    def size(value: object) -> int:
        return 0 if value is None else len(str(value).encode())

    histograms = [sum(size(row[name]) for name in ("e2e", "ttft", "itl")) for row in rows]
    whole = [sum(size(value) for value in row) for row in rows]
    per_arm = Counter(row["arm"] for row in rows)
    spec = [row for row in rows if row["arm"] == "speculative"]
    requests = sum(row["requests"] or 0 for row in spec) if spec else None
    errors = sum(row["errors"] or 0 for row in spec) if spec else None
    return max(histograms, default=0), max(whole, default=0), dict(per_arm), requests, errors


# One read of the arm as the daemon's scrape job reads it (the same source), timed in a
# process of its own so the servers' threads here do not share its interpreter.
_TIMED_READ = """
import json, sys, time
from datetime import UTC, datetime
from canaryd.telemetry.config import TelemetryConfig
from canaryd.telemetry.sources import open_source
source = open_source("speculative", TelemetryConfig.model_validate(json.loads(sys.argv[1])))
started = time.monotonic()
reading = source.read(datetime.now(UTC))
print(json.dumps({"read_s": time.monotonic() - started,
                  "failures": [f.reason[:160] for f in reading.failures]}))
"""


def timed_read(urls: list[str], scenario: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    """The seconds one read of the speculative arm takes, and its failures' reasons."""
    config: dict[str, Any] = {
        "scrape_interval_s": args.scrape_s,
        "timeout_s": args.scrape_s,
        "arms": {"speculative": {"metrics_url": urls}},
    }
    if scenario.extra:
        key, value = (part.strip() for part in scenario.extra.split("="))
        config[key] = int(value)
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    done = subprocess.run(
        [sys.executable, "-c", _TIMED_READ, json.dumps(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=args.pythonpath or REPO,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        return {"read_s": None, "failures": [done.stderr.strip().splitlines()[-1][:160]]}
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def run(scenario: Scenario, args: argparse.Namespace, work: Path) -> Outcome:
    folder = work / scenario.name
    folder.mkdir()
    db, log = folder / "canaryd.db", folder / "canaryd.log"
    with ExitStack() as stack:
        baseline = stack.enter_context(MetricsEndpoint(honest))
        speculative = [stack.enter_context(e) for e in scenario.endpoints()]
        read = timed_read([e.url for e in speculative], scenario, args)
        config = folder / "canaryd.toml"
        config.write_text(
            CONFIG.format(
                db=db,
                gate_s=args.gate_s,
                scrape_s=args.scrape_s,
                extra=scenario.extra,
                baseline=baseline.url,
                speculative=json.dumps([e.url for e in speculative]),
            )
        )
        peak, address = 0.0, None
        refused: dict[str, float] = {}
        with daemon(config, log, args.pythonpath) as process:
            started = time.monotonic()
            last_poll = 0.0
            while time.monotonic() - started < args.seconds and process.poll() is None:
                peak = max(peak, _vm_hwm_mb(process.pid) or 0.0)
                if address is None:
                    found = SERVING.search(log.read_text(errors="replace"))
                    address = found.group(1) if found else None
                elif time.monotonic() - last_poll > 1.0:
                    last_poll = time.monotonic()
                    with suppress(httpx.HTTPError):  # busy: the next poll reads it
                        refused = _refused(address)
                time.sleep(0.2)
            peak = max(peak, _vm_hwm_mb(process.pid) or 0.0)
        code = process.returncode
    logged = events(log)
    refusals = Counter(
        f"{e.get('url', '?').rsplit(':', 1)[-1]} {e.get('bound')}"
        for e in logged
        if e.get("event") == "telemetry.source_refused"
    )
    failures = sum(1 for e in logged if e.get("event") == "telemetry.replica_failed")
    # Every gate run logs the states it decided (gate names with a dot are folded into
    # `other` in canaryd_gate_state, so the log is where the telemetry gates are named).
    seen: dict[str, set[str]] = {}
    for event in logged:
        if event.get("arm") == "speculative" and isinstance(event.get("states"), dict):
            for gate in TELEMETRY_GATES:
                if gate in event["states"]:
                    seen.setdefault(gate, set()).add(event["states"][gate])
    text = log.read_text(errors="replace").splitlines()
    error = next((line for line in text if line.startswith("canaryd: error")), "")
    histograms, row, per_arm, requests, errors = _stored(db)
    return Outcome(
        scenario=scenario.name,
        exit_code=code,
        peak_rss_mb=round(peak, 1),
        largest_histograms_bytes=histograms,
        largest_row_bytes=row,
        intervals=per_arm,
        speculative_requests=requests,
        speculative_errors=errors,
        refusal_lines=dict(refusals),
        failure_lines=failures,
        refused_total=refused,
        gate_states={gate: sorted(states) for gate, states in sorted(seen.items())},
        error=error[:300],
        read_s=None if read["read_s"] is None else round(read["read_s"], 2),
        read_failures=read["failures"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scrape-s", type=float, default=5.0)
    parser.add_argument("--gate-s", type=float, default=5.0)
    parser.add_argument("--bomb-mb", type=int, default=1024, help="the gzip bomb inflated")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--pythonpath", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in scenarios(args.bomb_mb * MiB):
            if args.only and scenario.name not in args.only:
                continue
            outcome = run(scenario, args, Path(tmp))
            outcomes.append(outcome)
            print(json.dumps(asdict(outcome)), file=sys.stderr, flush=True)
    goals = {
        "rss_under_mb": GOAL_RSS_MB,
        "interval_under_bytes": GOAL_INTERVAL_BYTES,
        "all_rss_under_goal": all(o.peak_rss_mb < GOAL_RSS_MB for o in outcomes),
        "all_intervals_under_goal": all(
            o.largest_histograms_bytes < GOAL_INTERVAL_BYTES for o in outcomes
        ),
        "telemetry_pass_on_hostile": [o.scenario for o in outcomes if o.passed_on_hostile],
    }
    if args.json:
        rows = [asdict(o) for o in outcomes]
        json.dump({"args": vars(args), "goals": goals, "outcomes": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print(
        f"{'scenario':<20} {'exit':>4} {'RSS MB':>7} {'hist B':>8} {'row B':>8} "
        f"{'spec ivl':>8} {'spec req':>10}  refusal lines / gates"
    )
    for o in outcomes:
        print(
            f"{o.scenario:<20} {o.exit_code!s:>4} {o.peak_rss_mb:>7.0f} "
            f"{o.largest_histograms_bytes:>8} {o.largest_row_bytes:>8} "
            f"{o.intervals.get('speculative', 0):>8} {o.speculative_requests or 0:>10}  "
            f"{o.refusal_lines} failed-lines={o.failure_lines} {o.gate_states}"
        )
    print(json.dumps(goals))


if __name__ == "__main__":
    main()
