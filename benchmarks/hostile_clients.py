"""`canaryd run` against hostile clients of its own ports: the sink's memory under slow
bodies, and the scrapes answered while idle connections flood the status port.

Each scenario starts a daemon of its own as a user does (`python -m canaryd run --config
…`, a process of its own, two fake arms, SQLite, JSON logs, the status server and the
mirror sink on loopback ports) and waits until `/healthz` answers 200:

- `slow_sink_bodies`: `--bodies` clients (500) each send the sink a chat request declaring
  a 1 MiB body (`traffic.max_body_bytes`' default: every body is one the sink takes) and
  trickle it in `--chunk-kib` chunks over `--body-s` seconds (3), inside the sink's 5 s
  request deadline, so that a body read is read whole (or nearly, on a loaded host: cut
  at 5 s, 408), then parsed; a client whose
  request is answered or closed opens the next one (after `--retry-s` when refused), for
  `--seconds`. Reported: the daemon's RSS before the flood, its peak during it (VmRSS
  polled every 0.1 s and VmHWM, the kernel's own high-water mark, read at the end:
  the goal is judged on it, start-up included), the answers the clients got and the
  sink's `canaryd_traffic_requests_total` by outcome. Goal: peak under 400 MB.
- `keepalive_flood`: `--connections` clients (1,000: beyond the status port's 512-connection
  budget) each hold a connection open, idle, and open a new one as soon as the daemon
  closes it (its 5 s request deadline); once they are all connected, `--scrapes` (10)
  `GET /metrics`, each on a fresh connection, `--scrape-gap-s` apart, each timed to its
  last byte (at most 30 s), each with a `GET` of an unreserved path beside it (503 while
  the budget is exceeded: the flood is in force). Goal: at least 9 of 10 scrapes answered
  200 within 5 s.

The benchmark raises its own open-file limit to the hard limit (the daemon raises its own
at start). `--pythonpath DIR` runs the daemon from another checkout (the code before a
change, say: its path and working directory).

Usage: .venv/bin/python -m benchmarks.hostile_clients [--only NAME ...] [--seconds 20]
       [--bodies 500] [--body-s 3] [--chunk-kib 32] [--retry-s 1]
       [--connections 1000] [--scrapes 10] [--scrape-gap-s 1] [--pythonpath DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
GOAL_RSS_MB = 400.0
GOAL_SCRAPE_S = 5.0
GOAL_SCRAPES_SHARE = 0.9  # of the scrapes answered 200 within GOAL_SCRAPE_S
BODY_BYTES = 1024 * 1024  # traffic.max_body_bytes' default
SCRAPE_LIMIT_S = 30.0
START_LIMIT_S = 120.0
HASH_KEY = "benchmark-hash-key-0123456789abcdef"
UNRESERVED_PATH = "/no-such-endpoint"  # 404 within the connection budget, 503 beyond

CONFIG = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
[storage]
url = "sqlite:///{db}"
[server]
listen = "{host}:{status_port}"
[traffic]
listen = "{host}:{sink_port}"
hash_key = "{hash_key}"
[logging]
format = "json"
[schedule]
pair_interval_s = 10
jitter_s = 0
"""


@dataclass
class BodiesOutcome:
    """The sink under slow 1 MiB bodies."""

    exit_code: int | None
    rss_before_mb: float
    peak_rss_mb: float  # VmRSS, polled during the flood
    peak_hwm_mb: float  # VmHWM at the end: the kernel's high-water mark, start-up included
    requests_started: int
    answers: dict[str, int]
    sink_outcomes: dict[str, float]
    healthz_after: int | None

    @property
    def met(self) -> bool:
        return self.exit_code is None and max(self.peak_hwm_mb, self.peak_rss_mb) < GOAL_RSS_MB


@dataclass
class Scrape:
    status: int | None  # None: no answer within SCRAPE_LIMIT_S (or an error)
    seconds: float
    metrics_bytes: int
    open_connections: int  # the flood's, when the scrape started
    unreserved_status: int | None  # a GET beside it of a path the budget covers
    error: str = ""

    @property
    def answered(self) -> bool:
        return self.status == 200 and self.metrics_bytes > 0 and self.seconds <= GOAL_SCRAPE_S


@dataclass
class FloodOutcome:
    """Scrapes of the status port while idle connections flood it."""

    exit_code: int | None
    connected_before_scrapes: int
    reconnects: int
    connect_failures: int
    scrapes: list[Scrape] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return sum(scrape.answered for scrape in self.scrapes)

    @property
    def wanted(self) -> int:
        return math.ceil(GOAL_SCRAPES_SHARE * len(self.scrapes))

    @property
    def met(self) -> bool:
        return self.exit_code is None and bool(self.scrapes) and self.answered >= self.wanted


# --- the daemon ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def raise_open_files() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        wanted = 65_536 if hard == resource.RLIM_INFINITY else hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        return wanted
    return soft


def memory_mb(pid: int) -> tuple[float, float]:
    """VmRSS and VmHWM (MB) of `pid` and its children, summed (canaryd forks none; an
    engine that did would count)."""
    rss = hwm = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss += int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm += int(line.split()[1]) / 1024
        pending.extend(int(child) for child in children)
    return rss, hwm


class Daemon:
    """`canaryd run` on two loopback ports (status, sink) in `work`, SIGTERM on exit."""

    def __init__(self, work: Path, pythonpath: str | None) -> None:
        self.work = work
        self.pythonpath = pythonpath
        self.status_port, self.sink_port = free_port(), free_port()
        self.log = work / "canaryd.log"
        self.config = work / "canaryd.toml"
        self.config.write_text(
            CONFIG.format(
                db=work / "canaryd.db",
                host=HOST,
                status_port=self.status_port,
                sink_port=self.sink_port,
                hash_key=HASH_KEY,
            )
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def exit_code(self) -> int | None:
        """None while it runs (as it must, throughout)."""
        assert self.process is not None
        return self.process.poll()

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    @contextmanager
    def running(self) -> Iterator[Daemon]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
        env.update(
            CANARYD_DATA_DIR=str(self.work / "data"), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1"
        )
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "canaryd", "run", "--config", str(self.config)],
                cwd=self.pythonpath or REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
            try:
                self.wait_healthy()
                yield self
            finally:
                if self.process.poll() is None:
                    self.process.send_signal(signal.SIGTERM)
                    try:
                        self.process.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        self.process.kill()
                        self.process.wait()

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + START_LIMIT_S
        while time.monotonic() < deadline:
            if self.exit_code() is not None:
                raise RuntimeError(f"canaryd run exited {self.exit_code()}:\n{self.log_tail()}")
            if get(self.status_port, "/healthz", 2.0)[0] == 200:
                return
            time.sleep(0.5)
        raise RuntimeError(f"canaryd did not answer /healthz within {START_LIMIT_S:g} s")

    def sink_outcomes(self) -> dict[str, float]:
        """`canaryd_traffic_requests_total` by outcome, from the daemon's /metrics."""
        status, body = get(self.status_port, "/metrics", 10.0)
        if status != 200:
            return {}
        return {
            sample.labels["outcome"]: sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
            if sample.name == "canaryd_traffic_requests_total" and sample.value
        }


def get(port: int, path: str, timeout_s: float) -> tuple[int | None, bytes]:
    """A GET on a fresh connection: status and body (None: no answer, or an error)."""
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout_s)
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        answer = connection.getresponse()
        return answer.status, answer.read()
    except (OSError, http.client.HTTPException):
        return None, b""
    finally:
        connection.close()


# --- slow_sink_bodies ------------------------------------------------------------------


def chat_body(size: int) -> bytes:
    """A chat request of exactly `size` bytes: one user message of filler (longer than
    any prompt the sink samples, so parsed, then counted)."""
    head = b'{"model": "m", "messages": [{"role": "user", "content": "'
    tail = b'"}]}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


async def slow_body(port: int, body: bytes, args: argparse.Namespace) -> str:
    """One request trickling `body` over `args.body_s`: the answer's status, or what
    ended it without one."""
    chunk = args.chunk_kib * 1024
    chunks = max(1, -(-len(body) // chunk))
    gap = args.body_s / chunks
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError:
        return "connect_failed"
    answer = asyncio.ensure_future(reader.readline())
    try:
        async with asyncio.timeout(args.body_s + 15.0):
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: canaryd\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body)
            )
            started = time.monotonic()
            for index in range(chunks):
                if answer.done():
                    break  # answered (or closed) before the body was sent: stop
                writer.write(body[index * chunk : (index + 1) * chunk])
                await writer.drain()
                pause = started + (index + 1) * gap - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
            line = await answer
    except TimeoutError:
        return "no_answer"
    except OSError:
        return "reset"
    finally:
        answer.cancel()
        if answer.done() and not answer.cancelled():
            answer.exception()  # seen: a reset while sending is the outcome already
        writer.close()
        with suppress(OSError):
            await writer.wait_closed()
    parts = line.split()
    return parts[1].decode() if len(parts) > 1 else "closed"


async def slow_sender(
    port: int, body: bytes, args: argparse.Namespace, until: float, answers: Counter[str]
) -> None:
    while time.monotonic() < until:
        outcome = await slow_body(port, body, args)
        answers[outcome] += 1
        if outcome not in ("202", "400"):
            await asyncio.sleep(args.retry_s)  # refused or cut: retry, as a client would


async def flood_sink(daemon: Daemon, args: argparse.Namespace) -> tuple[float, Counter[str]]:
    """The slow senders for `args.seconds` (each finishing its last request); the peak
    VmRSS polled meanwhile and the answers."""
    body = chat_body(BODY_BYTES)
    answers: Counter[str] = Counter()
    until = time.monotonic() + args.seconds
    senders = [
        asyncio.create_task(slow_sender(daemon.sink_port, body, args, until, answers))
        for _ in range(args.bodies)
    ]
    peak = 0.0
    while not all(sender.done() for sender in senders):
        peak = max(peak, memory_mb(daemon.pid)[0])
        await asyncio.sleep(0.1)
    await asyncio.gather(*senders)
    return peak, answers


def slow_sink_bodies(args: argparse.Namespace, work: Path) -> BodiesOutcome:
    with Daemon(work, args.pythonpath).running() as daemon:
        time.sleep(2.0)  # the first pair and gate run: the floor the flood stands on
        before = memory_mb(daemon.pid)[0]
        peak, answers = asyncio.run(flood_sink(daemon, args))
        _, hwm = memory_mb(daemon.pid)
        healthz = get(daemon.status_port, "/healthz", 10.0)[0]
        outcomes = daemon.sink_outcomes()
        code = daemon.exit_code()
    return BodiesOutcome(
        exit_code=code,
        rss_before_mb=round(before, 1),
        peak_rss_mb=round(peak, 1),
        peak_hwm_mb=round(hwm, 1),
        requests_started=sum(answers.values()),
        answers=dict(answers),
        sink_outcomes=outcomes,
        healthz_after=healthz,
    )


# --- keepalive_flood -------------------------------------------------------------------


@dataclass
class Holders:
    open: int = 0
    reconnects: int = 0
    connect_failures: int = 0


async def idle_holder(port: int, holders: Holders) -> None:
    """Hold a connection open, sending nothing; open a new one when the daemon closes it."""
    first = True
    while True:
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            holders.connect_failures += 1
            await asyncio.sleep(0.1)
            continue
        holders.open += 1
        holders.reconnects += 0 if first else 1
        first = False
        try:
            with suppress(OSError):
                await reader.read()  # until the daemon closes it
        finally:
            holders.open -= 1
            writer.close()


def timed_scrape(port: int, open_connections: int) -> Scrape:
    started = time.monotonic()
    connection = http.client.HTTPConnection(HOST, port, timeout=SCRAPE_LIMIT_S)
    try:
        connection.request("GET", "/metrics", headers={"Connection": "close"})
        answer = connection.getresponse()
        body = answer.read()
        status: int | None = answer.status
        error = ""
    except (OSError, http.client.HTTPException) as exc:
        status, body, error = None, b"", f"{type(exc).__name__}: {exc}"[:120]
    finally:
        connection.close()
    seconds = time.monotonic() - started
    unreserved = get(port, UNRESERVED_PATH, SCRAPE_LIMIT_S)[0]
    return Scrape(status, round(seconds, 3), len(body), open_connections, unreserved, error)


async def flood_status(daemon: Daemon, args: argparse.Namespace) -> FloodOutcome:
    holders = Holders()
    tasks = [
        asyncio.create_task(idle_holder(daemon.status_port, holders))
        for _ in range(args.connections)
    ]
    deadline = time.monotonic() + 30.0
    while holders.open < args.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    outcome = FloodOutcome(
        exit_code=None,
        connected_before_scrapes=holders.open,
        reconnects=0,
        connect_failures=0,
    )
    for _ in range(args.scrapes):
        # On a thread: the scrape's client is not held up by the flood's event loop.
        scrape = await asyncio.to_thread(timed_scrape, daemon.status_port, holders.open)
        outcome.scrapes.append(scrape)
        await asyncio.sleep(args.scrape_gap_s)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    outcome.reconnects, outcome.connect_failures = holders.reconnects, holders.connect_failures
    return outcome


def keepalive_flood(args: argparse.Namespace, work: Path) -> FloodOutcome:
    with Daemon(work, args.pythonpath).running() as daemon:
        outcome = asyncio.run(flood_status(daemon, args))
        outcome.exit_code = daemon.exit_code()
    return outcome


# --- report ----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=("slow_sink_bodies", "keepalive_flood"))
    parser.add_argument("--seconds", type=float, default=20.0, help="slow bodies sent for")
    parser.add_argument("--bodies", type=int, default=500)
    parser.add_argument("--body-s", type=float, default=3.0, help="one body trickled over")
    parser.add_argument("--chunk-kib", type=int, default=32)
    parser.add_argument("--retry-s", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=10)
    parser.add_argument("--scrape-gap-s", type=float, default=1.0)
    parser.add_argument("--pythonpath", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    open_files = raise_open_files()
    if open_files < args.connections + 64:
        parser.error(f"the open-file limit is {open_files}: too low for {args.connections}")

    results: dict[str, Any] = {}
    bodies: BodiesOutcome | None = None
    flood: FloodOutcome | None = None
    with tempfile.TemporaryDirectory() as tmp:
        if not args.only or "slow_sink_bodies" in args.only:
            (Path(tmp) / "bodies").mkdir()
            bodies = slow_sink_bodies(args, Path(tmp) / "bodies")
            results["slow_sink_bodies"] = {**asdict(bodies), "met": bodies.met}
        if not args.only or "keepalive_flood" in args.only:
            (Path(tmp) / "flood").mkdir()
            flood = keepalive_flood(args, Path(tmp) / "flood")
            results["keepalive_flood"] = {
                **asdict(flood),
                "answered_within_goal": flood.answered,
                "met": flood.met,
            }
    goals = {
        "slow_sink_bodies": f"peak RSS under {GOAL_RSS_MB:g} MB",
        "keepalive_flood": f"at least {math.ceil(GOAL_SCRAPES_SHARE * args.scrapes)} of "
        f"{args.scrapes} scrapes "
        f"answered 200 within {GOAL_SCRAPE_S:g} s",
    }
    if args.json:
        json.dump({"args": vars(args), "goals": goals, **results}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if bodies is not None:
        print(
            f"slow_sink_bodies ({args.bodies} clients, 1 MiB over {args.body_s:g} s, "
            f"{args.seconds:g} s): goal {goals['slow_sink_bodies']}"
        )
        print(
            f"  RSS before {bodies.rss_before_mb:.0f} MB, peak VmRSS {bodies.peak_rss_mb:.0f} "
            f"MB, VmHWM {bodies.peak_hwm_mb:.0f} MB -> {'met' if bodies.met else 'NOT MET'}"
        )
        print(f"  {bodies.requests_started} requests; answers {bodies.answers}")
        print(f"  sink outcomes {bodies.sink_outcomes}; /healthz after: {bodies.healthz_after}")
    if flood is not None:
        print(
            f"keepalive_flood ({args.connections} idle connections, {flood.reconnects} "
            f"reopened, {flood.connect_failures} failed): goal {goals['keepalive_flood']}"
        )
        print(
            f"  {'#':>3} {'status':>6} {'seconds':>8} {'bytes':>8} {'open':>5} {'unreserved':>10}"
        )
        for index, scrape in enumerate(flood.scrapes, 1):
            print(
                f"  {index:>3} {scrape.status!s:>6} {scrape.seconds:>8.3f} "
                f"{scrape.metrics_bytes:>8} {scrape.open_connections:>5} "
                f"{scrape.unreserved_status!s:>10} {scrape.error}"
            )
        print(
            f"  answered within {GOAL_SCRAPE_S:g} s: {flood.answered} of {len(flood.scrapes)}"
            f" -> {'met' if flood.met else 'NOT MET'}"
        )


if __name__ == "__main__":
    main()
