"""The command: `.venv/bin/python benchmarks/rollout_sim [--scenario NAME ...] [--tool
argo|flagger|both] [--runs N] [--time-scale S] [--out FILE] ...` plays each scenario with
each tool `--runs` times, one after another, prints a JSON row per run to stdout as it
ends (progress on stderr) and writes them all to `--out`."""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    # Run as a folder (`python benchmarks/rollout_sim`): Python put this folder first on
    # the path, where its modules would shadow top-level ones of the same name; the
    # package lives under the repository root.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

# The imports below need the path above.
import argparse
import json
import time
from collections.abc import Sequence
from typing import Any, cast

from benchmarks import rollout_sim
from benchmarks.rollout_sim.arms import StallArms
from benchmarks.rollout_sim.daemon import REPO
from benchmarks.rollout_sim.play import EXAMPLES, Settings, play
from benchmarks.rollout_sim.scenarios import SCENARIOS, Tool


def _token_ms(text: str) -> tuple[float, float]:
    baseline, speculative = (float(part) for part in text.split(","))
    return baseline, speculative


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(rollout_sim.__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[*SCENARIOS, "all"],
        help="repeat for several; default healthy",
    )
    parser.add_argument("--tool", choices=["argo", "flagger", "both"], default="both")
    parser.add_argument("--runs", type=int, default=1, help="runs of each scenario and tool")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="divide the tool's interval (and its retry waits) by this: a smoke run, NOT the "
        "shipped timing (canaryd keeps its defaults, gate runs every 60 s); 1 = real time",
    )
    parser.add_argument("--out", type=Path, default=None, help="write every row here (JSON)")
    parser.add_argument(
        "--token-ms",
        type=_token_ms,
        default=(60.0, 36.0),
        metavar="BASE,SPEC",
        help="seconds per token ×1000 of the baseline and the speculative arm (default 60,36)",
    )
    parser.add_argument(
        "--production-rps",
        type=float,
        default=5.0,
        help="production requests a second per arm in each arm's /metrics (default 5)",
    )
    parser.add_argument("--no-telemetry", action="store_true", help="no [telemetry] section")
    parser.add_argument(
        "--kill-at-minute", type=float, default=5.0, help="kill-switch: the tool minute to pull it"
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=60.0,
        help="Flagger: tool minutes after which an undecided canary is reported stuck",
    )
    parser.add_argument(
        "--stall-arms",
        choices=["either", "speculative", "baseline"],
        default="either",
        help="which arm a host stall may hit (default either, at random)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--examples", type=Path, default=EXAMPLES, help="argo/ and flagger/ here")
    parser.add_argument(
        "--extra-config", type=Path, default=None, help="TOML merged over canaryd's config"
    )
    parser.add_argument(
        "--pythonpath",
        type=Path,
        default=None,
        help="run canaryd from this checkout (its cwd and PYTHONPATH) instead of this one",
    )
    args = parser.parse_args(argv)

    names = args.scenario or ["healthy"]
    scenarios = list(SCENARIOS.values()) if "all" in names else [SCENARIOS[n] for n in names]
    tools: list[Tool] = ["argo", "flagger"] if args.tool == "both" else [cast(Tool, args.tool)]
    extra = args.extra_config.read_text(encoding="utf-8") if args.extra_config else ""
    rows: list[dict[str, Any]] = []
    began = time.monotonic()
    for scenario in scenarios:
        for tool in tools:
            for run_index in range(1, args.runs + 1):
                settings = Settings(
                    scenario=scenario,
                    tool=tool,
                    time_scale=args.time_scale,
                    baseline_ms=args.token_ms[0],
                    speculative_ms=args.token_ms[1],
                    production_rps=args.production_rps,
                    telemetry=not args.no_telemetry,
                    kill_at_minute=args.kill_at_minute,
                    max_minutes=args.max_minutes,
                    stall_arms=cast(StallArms, args.stall_arms),
                    seed=args.seed,
                    examples=args.examples,
                    extra_config=extra,
                    checkout=(args.pythonpath or REPO).resolve(),
                )
                prefix = f"[{tool} {scenario.name} #{run_index}]"

                def log(line: str, prefix: str = prefix) -> None:
                    print(f"{prefix} {line}", file=sys.stderr, flush=True)

                row = play(settings, run_index, log)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    document = {
                        "time_scale": args.time_scale,
                        "wall_minutes": round((time.monotonic() - began) / 60, 1),
                        "runs": rows,
                    }
                    args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
