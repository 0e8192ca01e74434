"""The command: `.venv/bin/python benchmarks/gate_power [--quick] [--out FILE] ...` or
`.venv/bin/python -m benchmarks.gate_power ...` parses the options, runs
`benchmark.run` (or the embedded fit with `--refit`), writes the JSON and prints the
table."""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    # Run as a folder (`python benchmarks/gate_power`): Python put this folder first on the
    # path, where its modules would shadow top-level ones of the same name; the package
    # lives under the repository root.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

# The imports below need the path above.
import argparse
import json
import logging
import os
from collections.abc import Sequence

import structlog

from benchmarks import gate_power
from benchmarks.gate_power.benchmark import (
    FULL_CADENCE_PAIRS,
    FULL_HEALTHY_MINUTES,
    FULL_STRESS_PAIRS,
    QUICK_CADENCE_PAIRS,
    log_to_stderr,
    run,
)
from benchmarks.gate_power.fit import fit_embedded
from benchmarks.gate_power.tables import table


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(gate_power.__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="20k healthy pairs (also stressed), 3 seeds"
    )
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--healthy-minutes",
        type=float,
        default=None,
        help=f"full run: minutes of healthy simulation per model (default {FULL_HEALTHY_MINUTES})",
    )
    parser.add_argument(
        "--fault-seeds",
        type=int,
        default=None,
        help="seeds per fault (default 3 with --quick, else 30: a 95 %% interval on each "
        "median needs at least 6)",
    )
    parser.add_argument(
        "--cadence-pairs",
        type=int,
        default=None,
        help="healthy pairs per model also judged at the daemon's 60 s cadence "
        f"(default {QUICK_CADENCE_PAIRS} with --quick, else {FULL_CADENCE_PAIRS})",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="2: the fault runs, drift pins and default schedule in a second process beside "
        "the healthy section (the same figures, about half the wall time on 2 cores); 1: one "
        "process",
    )
    parser.add_argument(
        "--stress-pairs",
        type=int,
        default=None,
        help=f"healthy pairs per model also judged under the stress budgets (default all of "
        f"them with --quick, else {FULL_STRESS_PAIRS})",
    )
    parser.add_argument("--refit", action="store_true", help="refit the embedded model, print")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.refit:
        rates = fit_embedded(args.seed)
        print(json.dumps(rates, indent=2))
        return
    result = run(
        quick=args.quick,
        seed=args.seed,
        healthy_budget_s=None if args.healthy_minutes is None else args.healthy_minutes * 60.0,
        fault_seeds=args.fault_seeds,
        cadence_pairs=args.cadence_pairs,
        stress_pairs=args.stress_pairs,
        jobs=args.jobs,
        log=log_to_stderr,
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(result))


if __name__ == "__main__":
    main()
