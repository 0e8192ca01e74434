"""What the daemon adds to each pair, and whether its memory grows, measured in one run.

For each engine set (`fake`: the fast fake engine, which only reports timings; `embedded`:
the in-process embedded model, both arms) a real `Daemon` is started on a temporary
SQLite database with its scheduler left out, and `run_cycle()` is called directly. The
engines' `generate`, the store's `save_pair` and the pair metrics' `observe_group` are timed
in place, so per pair:

- generation = the two arms' end-to-end time as the engines report it (for the fake
  engine that is the time a real engine would have taken; it does not sleep);
- overhead = cycle wall time minus the wall time spent inside `generate`: scoring, the
  store, metrics, one JSON log line, sampling and bookkeeping (goal ≤ 2 % of generation);
- RSS growth over `--cycles` cycles with the fake engine (default 5,000), as the slope of
  resident memory against cycles after a warm-up, in MB per 1,000 cycles (goal ≈ 0).

Prints a table and then the figures as JSON (also written to `--out`).

Usage: .venv/bin/python benchmarks/daemon_overhead.py [--engines fake,embedded]
       [--pairs 200] [--embedded-pairs 12] [--cycles 5000] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from canaryd.config import LoggingConfig, Settings
from canaryd.daemon import Daemon
from canaryd.logs import configure_logging

FAKE_ARMS = {
    "baseline": {"kind": "fake"},
    "speculative": {"kind": "fake", "speculative": True},
}
EMBEDDED_ARMS: dict[str, Any] = {}  # the defaults: embedded model, plain vs prompt lookup


class Stopwatch:
    """Accumulated wall time of the calls made through `wrap`."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        return timed


def make_daemon(directory: Path, arms: dict[str, Any]) -> Daemon:
    settings = Settings(
        arms=arms,
        storage={"url": f"sqlite:///{directory / 'canaryd.db'}"},
        server={"listen": "127.0.0.1:0"},
        schedule={"pairs_per_cycle": 1, "jitter_s": 0},
    )
    daemon = Daemon(settings)
    daemon.start(schedule=False)
    return daemon


def overhead(arms: dict[str, Any], pairs: int) -> dict[str, float]:
    """Per-pair overhead of `pairs` cycles on these arms, after 3 warm-up cycles."""
    with tempfile.TemporaryDirectory(prefix="canaryd-bench-") as tmp:
        daemon = make_daemon(Path(tmp), arms)
        try:
            for _ in range(3):
                daemon.run_cycle()
            generate, store, metrics = Stopwatch(), Stopwatch(), Stopwatch()
            for engine in daemon.engines.values():
                engine.generate = generate.wrap(engine.generate)  # type: ignore[method-assign]
            daemon.store.save_pair = store.wrap(daemon.store.save_pair)  # type: ignore[method-assign]
            pair_metrics = daemon.metrics.pairs
            pair_metrics.observe_group = metrics.wrap(pair_metrics.observe_group)  # type: ignore[method-assign]
            started = time.perf_counter()
            for _ in range(pairs):
                daemon.run_cycle()
            wall = time.perf_counter() - started
            records = daemon.store.pairs(run_id=daemon.run_id)[-pairs:]
        finally:
            daemon.stop()
    reported = sum(r.baseline.e2e_s + r.speculative.e2e_s for r in records) / len(records)
    per_pair = (wall - generate.seconds) / pairs
    return {
        "pairs": pairs,
        "generation_s_per_pair": reported,
        "overhead_ms_per_pair": per_pair * 1000,
        "store_ms_per_pair": store.seconds / pairs * 1000,
        "metrics_ms_per_pair": metrics.seconds / pairs * 1000,
        "scoring_and_rest_ms_per_pair": (per_pair - (store.seconds + metrics.seconds) / pairs)
        * 1000,
        "overhead_fraction": per_pair / reported,
    }


def rss_growth(cycles: int, warmup: int) -> dict[str, float]:
    """Resident memory against cycles with the fake engine; slope after `warmup` cycles."""
    process = psutil.Process()
    with tempfile.TemporaryDirectory(prefix="canaryd-bench-") as tmp:
        daemon = make_daemon(Path(tmp), FAKE_ARMS)
        samples: list[tuple[int, float]] = []
        try:
            for cycle in range(1, cycles + 1):
                daemon.run_cycle()
                if cycle >= warmup and cycle % 100 == 0:
                    samples.append((cycle, process.memory_info().rss / 2**20))
        finally:
            daemon.stop()
    xs, ys = [float(x) for x, _ in samples], [y for _, y in samples]
    slope = statistics.linear_regression(xs, ys).slope if len(samples) > 1 else 0.0
    return {
        "cycles": cycles,
        "warmup_cycles": warmup,
        "rss_mb_start": ys[0],
        "rss_mb_end": ys[-1],
        "rss_mb_per_1000_cycles": slope * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--engines", default="fake,embedded", help="comma-separated: fake, embedded (default both)"
    )
    parser.add_argument("--pairs", type=int, default=200, help="pairs timed on the fake engine")
    parser.add_argument("--embedded-pairs", type=int, default=12)
    parser.add_argument("--cycles", type=int, default=5000, help="cycles for RSS growth")
    parser.add_argument("--warmup", type=int, default=500, help="cycles before RSS counts")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()

    # One JSON log line per pair is part of the daemon's cost, as in production; it goes
    # to /dev/null so the table stays readable.
    sys.stderr = Path(os.devnull).open("w")  # noqa: SIM115 - for the life of the process
    configure_logging(LoggingConfig(format="json"))
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    results: dict[str, Any] = {"overhead": {}}
    if "fake" in engines:
        results["overhead"]["fake"] = overhead(FAKE_ARMS, args.pairs)
    if "embedded" in engines:
        results["overhead"]["embedded"] = overhead(EMBEDDED_ARMS, args.embedded_pairs)
    if args.cycles:
        results["rss"] = rss_growth(args.cycles, min(args.warmup, args.cycles // 2))

    print(f"{'engine':<10} {'pairs':>6} {'gen s/pair':>11} {'overhead ms':>12} "
          f"{'store ms':>9} {'metrics ms':>11} {'scoring+ ms':>12} {'fraction':>9}")  # fmt: skip
    for name, row in results["overhead"].items():
        print(
            f"{name:<10} {row['pairs']:>6} {row['generation_s_per_pair']:>11.3f} "
            f"{row['overhead_ms_per_pair']:>12.2f} {row['store_ms_per_pair']:>9.2f} "
            f"{row['metrics_ms_per_pair']:>11.3f} {row['scoring_and_rest_ms_per_pair']:>12.2f} "
            f"{row['overhead_fraction']:>8.2%}"
        )
    if "rss" in results:
        rss = results["rss"]
        print(
            f"RSS over {rss['cycles']} fake cycles: {rss['rss_mb_start']:.1f} -> "
            f"{rss['rss_mb_end']:.1f} MB, {rss['rss_mb_per_1000_cycles']:+.2f} MB per 1,000 "
            f"cycles (after {rss['warmup_cycles']} warm-up cycles)"
        )
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
