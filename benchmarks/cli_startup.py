"""Cold start of the `canaryd` commands an operator runs in an incident, against Python.

Each command runs in a fresh interpreter (as an operator's shell runs it), and the rounds
are interleaved (`python -c pass`, then each command, round after round) so that machine
noise hits every command alike. Reported per command: the median and max wall time over
`--rounds` runs and the ratio of its median to `python -c pass`'s, the median CPU time
(user + system: what the command costs, which a loaded machine inflates less than wall
time), plus the heavy modules (statistics, engines, scoring, plotting, migrations, the HTTP
client) it imported, which should be none.

The switch commands run against a migrated SQLite database named by a config file like the
service's: `[traffic] listen` set and its hash key absent, as in a shell without the
service's EnvironmentFile. `switch restore` is refused there (no gate evidence, exit 1):
its time to the refusal is what is measured. One untimed round first writes the bytecode
caches, as `pip install` does; "cold" is a fresh interpreter, not an empty page cache.

Usage: .venv/bin/python benchmarks/cli_startup.py [--rounds 7] [--out startup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = (
    "scipy",
    "numpy",
    "torch",
    "transformers",
    "evaluate",
    "datasets",
    "matplotlib",
    "alembic",
    "httpx",
)
# Reports the heavy modules a command imported, on stderr, as it exits.
_PROBE = (
    "import atexit, sys\n"
    f"atexit.register(lambda: print('heavy:' + ','.join(m for m in {HEAVY!r} "
    "if m in sys.modules), file=sys.stderr))\n"
    "sys.argv = ['canaryd', *sys.argv[1:]]\n"
    "from canaryd.cli.app import main\n"
    "main()\n"
)


def commands(config: Path) -> dict[str, list[str]]:
    c = ["--config", str(config)]
    return {
        "canaryd --version": ["--version"],
        "canaryd --help": ["--help"],
        "canaryd switch status": ["switch", "status", *c],
        "canaryd switch rollback": ["switch", "rollback", "--reason", "benchmark", *c],
        "canaryd switch restore": ["switch", "restore", "--reason", "benchmark", *c],
    }


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """Wall time and CPU time (user + system) of one run, its exit code and its stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()

    # As installed: bytecode cached on disk (pip compiles it), so let the first, untimed
    # round write it where a checkout has none.
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CANARYD_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env["CANARYD_DATA_DIR"] = str(root / "data")
        config = root / "canaryd.toml"
        config.write_text(
            f'[storage]\nurl = "sqlite:///{root / "canaryd.db"}"\n'
            f'[switch]\nstate_file = "{root / "switch.json"}"\n'
            '[traffic]\nlisten = "127.0.0.1:0"\n',
            encoding="utf-8",
        )
        upgrade = [sys.executable, "-m", "canaryd", "db", "upgrade", "--config", str(config)]
        subprocess.run(upgrade, env=env, check=True, capture_output=True)
        runs: dict[str, list[float]] = {"python -c pass": []}
        cpu: dict[str, list[float]] = {"python -c pass": []}
        codes: dict[str, set[int]] = {"python -c pass": set()}
        heavy: dict[str, set[str]] = {}
        table = commands(config)
        for argv in table.values():  # the untimed round
            timed([sys.executable, "-c", _PROBE, *argv], env)
        for _ in range(args.rounds):
            seconds, cpu_s, code, _err = timed([sys.executable, "-c", "pass"], env)
            runs["python -c pass"].append(seconds)
            cpu["python -c pass"].append(cpu_s)
            codes["python -c pass"].add(code)
            for name, argv in table.items():
                seconds, cpu_s, code, err = timed([sys.executable, "-c", _PROBE, *argv], env)
                runs.setdefault(name, []).append(seconds)
                cpu.setdefault(name, []).append(cpu_s)
                codes.setdefault(name, set()).add(code)
                line = next((x for x in err.splitlines() if x.startswith("heavy:")), "heavy:")
                heavy.setdefault(name, set()).update(filter(None, line[6:].split(",")))

    base = statistics.median(runs["python -c pass"])
    results = {
        name: {
            "median_s": round(statistics.median(times), 4),
            "max_s": round(max(times), 4),
            "ratio_to_python": round(statistics.median(times) / base, 1),
            "median_cpu_s": round(statistics.median(cpu[name]), 4),
            "exit_codes": sorted(codes[name]),
            "heavy_modules": sorted(heavy.get(name, set())),
        }
        for name, times in runs.items()
    }
    print(f"{'command':<26} {'median s':>9} {'max s':>7} {'× python':>9} {'cpu s':>6}  exit  heavy")
    for name, r in results.items():
        print(
            f"{name:<26} {r['median_s']:>9.3f} {r['max_s']:>7.3f} {r['ratio_to_python']:>9.1f}"
            f" {r['median_cpu_s']:>6.3f}  {','.join(map(str, r['exit_codes'])):<5}"
            f" {','.join(r['heavy_modules']) or '-'}"
        )
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if args.out is not None:
        args.out.write_text(
            json.dumps({"rounds": args.rounds, "commands": results}, indent=2) + "\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
