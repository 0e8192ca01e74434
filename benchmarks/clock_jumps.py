"""`canaryd run` under a wall clock that jumps: seconds from the jump to the next pair and
the next gate run.

Each scenario starts the daemon as a user does (`python -m canaryd run --config …`, a
process of its own, two fake arms, SQLite, JSON logs, pairs every `--pair-s`, gates every
`--gate-s`) under libfaketime: `LD_PRELOAD` of its thread-safe library, the offset read
from a file at most once a second (`FAKETIME_CACHE_DURATION=1`), and the monotonic clock
left alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`), as `date -s`, an NTP step or a restored VM
leave it. As soon as it sees the `--warmup-gates`th gate run finish, the benchmark writes
the scenario's offsets to that file, one after the other `--between-s` apart (so a jump
comes just after a gate run: the next one is a whole interval away, the worst case):

- `back_1h`: the wall clock set back an hour;
- `forward_1h`: set forward an hour;
- `forward_then_back`: forward an hour, then back to the true time.

The benchmark polls `/metrics` every 0.1 s throughout for `canaryd_pairs_total` and
`canaryd_gate_runs_total` (a run is counted when it ends) and reports, per counter, the
seconds from the last jump (the benchmark's monotonic clock at the write) to its first
move (`*_after_jump_s`) and from its last move before the jump to that first move after
(`*_gap_s`: the pair or gate interval when the schedule kept its place on the monotonic
clock), with the `/healthz` answers seen after the jump and the `clock.jumped` lines
logged. A counter that has not moved `--observe-s` after the jump is reported as null.
Goal: pairs and gate runs resume within one gate interval of the jump, plus `SLACK_S` for
the measurement (the run's own time before it is counted, and the poll). `--pythonpath
DIR` runs the daemon from another checkout (the code before a change, say).

Usage: .venv/bin/python -m benchmarks.clock_jumps [--pair-s 5] [--gate-s 10]
       [--warmup-gates 2] [--between-s 15] [--observe-s 60] [--only NAME ...]
       [--libfaketime PATH] [--pythonpath DIR] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import hostile_metrics

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
SERVING = re.compile(r"serving /metrics.* on http://(\S+) ")
POLL_S = 0.1
# On top of the gate interval in the goal: a run is counted when it ends (a gate run takes
# a few tenths of a second on 2 busy cores), and the counters are read every POLL_S.
SLACK_S = 1.0
START_LIMIT_S = 120.0

SCENARIOS: dict[str, tuple[str, ...]] = {
    "back_1h": ("-3600",),
    "forward_1h": ("+3600",),
    "forward_then_back": ("+3600", "+0"),
}

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
[gates.budget]
over_design_rate = "rebudget"
[schedule]
pair_interval_s = {pair_s}
jitter_s = 0
gate_interval_s = {gate_s}
"""


@dataclass
class Outcome:
    """One scenario: when pairs and gate runs moved again after the last jump."""

    scenario: str
    offsets: tuple[str, ...]
    gate_interval_s: float
    pair_after_jump_s: float | None = None  # None: no pair within --observe-s
    gate_run_after_jump_s: float | None = None
    pair_gap_s: float | None = None  # last pair before the jump to the first after
    gate_run_gap_s: float | None = None
    healthz_after_jump: dict[str, int] = field(default_factory=dict)  # status: answers
    clock_jumped_lines: list[float] = field(default_factory=list)  # their jump_s
    error: str = ""

    @property
    def within_goal(self) -> bool:
        return all(
            seconds is not None and seconds <= self.gate_interval_s + SLACK_S
            for seconds in (self.pair_after_jump_s, self.gate_run_after_jump_s)
        )


@dataclass
class Counters:
    """The two counters as last read, and the monotonic times they last moved."""

    values: tuple[float, float] | None = None
    moved_at: list[float | None] = field(default_factory=lambda: [None, None])

    def read(self, address: str) -> None:
        with suppress(httpx.HTTPError):  # busy: the next poll reads it
            values = _counters(address)
            now = time.monotonic()
            for i, value in enumerate(values):
                if self.values is not None and value > self.values[i]:
                    self.moved_at[i] = now
            self.values = values

    def poll_for(self, address: str, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.read(address)
            time.sleep(POLL_S)


def _counters(address: str) -> tuple[float, float]:
    """Pairs run and gate runs finished, from the daemon's /metrics."""
    text = httpx.get(f"http://{address}/metrics", timeout=5).text
    pairs = gates = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "canaryd_pairs_total":
                pairs += sample.value
            elif sample.name == "canaryd_gate_runs_total":
                gates += sample.value
    return pairs, gates


def daemon(
    config: Path, log: Path, offset_file: Path, args: argparse.Namespace
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """hostile_metrics' daemon under libfaketime, the wall clock read from `offset_file`
    and the monotonic clock left alone."""
    return hostile_metrics.daemon(
        config,
        log,
        args.pythonpath,
        {
            "LD_PRELOAD": str(args.libfaketime),
            "FAKETIME_TIMESTAMP_FILE": str(offset_file),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        },
    )


def _address(process: subprocess.Popen[bytes], log: Path) -> str | None:
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline and process.poll() is None:
        found = SERVING.search(log.read_text(errors="replace"))
        if found:
            return found.group(1)
        time.sleep(0.2)
    return None


def run(name: str, args: argparse.Namespace, work: Path) -> Outcome:
    folder = work / name
    folder.mkdir()
    offsets = SCENARIOS[name]
    config, log, offset_file = folder / "canaryd.toml", folder / "canaryd.log", folder / "offset"
    config.write_text(
        CONFIG.format(db=folder / "canaryd.db", pair_s=args.pair_s, gate_s=args.gate_s)
    )
    offset_file.write_text("+0\n")
    outcome = Outcome(name, offsets, args.gate_s)
    counters = Counters()
    with daemon(config, log, offset_file, args) as process:
        address = _address(process, log)
        if address is None:
            outcome.error = "the daemon did not start: " + log.read_text(errors="replace")[-300:]
            return outcome
        # Warm up: the first gate runs, so that every job has run on the true clock.
        deadline = time.monotonic() + START_LIMIT_S
        while time.monotonic() < deadline:
            counters.read(address)
            if counters.values is not None and counters.values[1] >= args.warmup_gates:
                break
            time.sleep(POLL_S)
        for position, offset in enumerate(offsets):
            if position:
                counters.poll_for(address, args.between_s)
            offset_file.write_text(offset + "\n")
        jumped_at = time.monotonic()
        before = list(counters.moved_at)
        after: list[float | None] = [None, None]
        while time.monotonic() - jumped_at < args.observe_s and process.poll() is None:
            counters.read(address)
            for i, moved in enumerate(counters.moved_at):
                if after[i] is None and moved is not None and moved > jumped_at:
                    after[i] = moved
            with suppress(httpx.HTTPError):
                status = str(httpx.get(f"http://{address}/healthz", timeout=5).status_code)
                outcome.healthz_after_jump[status] = outcome.healthz_after_jump.get(status, 0) + 1
            if None not in after:
                break
            time.sleep(POLL_S)

    def since(moved: float | None, start: float | None) -> float | None:
        return None if moved is None or start is None else round(moved - start, 2)

    outcome.pair_after_jump_s = since(after[0], jumped_at)
    outcome.gate_run_after_jump_s = since(after[1], jumped_at)
    outcome.pair_gap_s = since(after[0], before[0])
    outcome.gate_run_gap_s = since(after[1], before[1])
    outcome.clock_jumped_lines = [
        e.get("jump_s", 0.0)
        for e in hostile_metrics.events(log)
        if e.get("event") == "clock.jumped"
    ]
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair-s", type=float, default=5.0)
    parser.add_argument("--gate-s", type=float, default=10.0)
    parser.add_argument("--warmup-gates", type=int, default=2)
    parser.add_argument("--between-s", type=float, default=15.0)
    parser.add_argument("--observe-s", type=float, default=60.0)
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(SCENARIOS))
    parser.add_argument("--libfaketime", type=Path, default=LIBFAKETIME)
    parser.add_argument("--pythonpath", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.libfaketime.exists():
        parser.error(f"no libfaketime at {args.libfaketime} (apt-get install faketime)")

    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in SCENARIOS:
            if args.only and name not in args.only:
                continue
            outcome = run(name, args, Path(tmp))
            outcomes.append(outcome)
            print(json.dumps(asdict(outcome)), file=sys.stderr, flush=True)
    if args.json:
        rows = [{**asdict(o), "within_goal": o.within_goal} for o in outcomes]
        json.dump({"args": {**vars(args), "libfaketime": str(args.libfaketime)},
                   "outcomes": rows}, sys.stdout, indent=2)  # fmt: skip
        sys.stdout.write("\n")
        return
    print(f"{'scenario':<18} {'pair s':>7} {'gate s':>7} {'pair gap':>8} {'gate gap':>8} "
          f"{'goal s':>6} {'met':>4}  /healthz after the jump, clock.jumped lines")  # fmt: skip
    for o in outcomes:
        shown = [
            "-" if seconds is None else f"{seconds:.1f}"
            for seconds in (
                o.pair_after_jump_s, o.gate_run_after_jump_s, o.pair_gap_s, o.gate_run_gap_s
            )
        ]  # fmt: skip
        print(
            f"{o.scenario:<18} {shown[0]:>7} {shown[1]:>7} {shown[2]:>8} {shown[3]:>8} "
            f"{o.gate_interval_s + SLACK_S:>6g} {'yes' if o.within_goal else 'NO':>4}  "
            f"{o.healthz_after_jump} {o.clock_jumped_lines} {o.error}"
        )


if __name__ == "__main__":
    main()
