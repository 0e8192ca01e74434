"""The slim install's size, measured as docs/install.md installs it, and a check that it runs.

In a temporary directory: the wheel built from this checkout (`pip wheel --no-deps`), a
fresh `python3 -m venv` (which comes with pip, and on Python 3.11 setuptools), then plain
`pip install --require-hashes -r requirements-runtime.lock` and `pip install --no-deps` of
the wheel: pip's defaults, so every module is compiled to bytecode as on a host. Reported:
the empty venv, the venv after the install and what the install added, in MiB of disk
(what `du -sm` says: blocks, so small files count whole) and in MB of file bytes, and the
same two figures per installed distribution (its RECORD, bytecode pip wrote included),
largest first, with pip's and setuptools' share named. With `--check`, the slim venv's own
`canaryd` (run from outside the checkout, so only the installed wheel is on its path)
judges two loopback OpenAI-compatible arms (`judge`, PASS expected) and runs the daemon
on them (`run`: `/readyz` 200, then SIGTERM, exit 0 expected) and times `canaryd switch
status` cold (the median of 5 fresh interpreters, PYTHONDONTWRITEBYTECODE=1: nothing is
cached between them, as on a read-only install); none of the `local`, `postgres` and
`report` extras' packages may be importable there. `--no-compile` installs both with
`pip install --no-compile` (no bytecode: smaller, and every start compiles what it
imports where it cannot write its caches).

Usage: .venv/bin/python benchmarks/slim_install.py [--check] [--no-compile]
       [--python python3] [--keep DIR] [--out slim.json] [--max-mib 300]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.configs import LIVENESS_ONLY  # noqa: E402
from tests.support.servers import MisbehavingServer  # noqa: E402

MIB = 1024 * 1024
# The extras' packages (and the stack canaryd no longer pulls): none may be in the venv.
NOT_IN_SLIM = (
    "torch",
    "transformers",
    "accelerate",
    "gguf",
    "safetensors",
    "psycopg",
    "matplotlib",
    "evaluate",
    "datasets",
    "pyarrow",
    "pandas",
    "nltk",
)
PIP = ("-m", "pip", "--disable-pip-version-check")
# Runs inside the measured venv: each distribution's files (by its RECORD) in bytes and in
# disk blocks, each file counted once, and what no RECORD names (bin/, pyvenv.cfg).
_SIZES = r"""
import importlib.metadata as md, json, os, sys
seen = set()
rows = {}
for dist in md.distributions():
    size = blocks = 0
    for f in dist.files or ():
        path = os.path.realpath(dist.locate_file(f))
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        st = os.stat(path)
        size += st.st_size
        blocks += st.st_blocks * 512
    rows[dist.metadata["Name"]] = [size, blocks]
size = blocks = 0
for root, _, files in os.walk(sys.prefix):
    for name in files:
        path = os.path.join(root, name)
        if os.path.islink(path) or os.path.realpath(path) in seen:
            continue
        st = os.stat(path)
        size += st.st_size
        blocks += st.st_blocks * 512
rows["(not in any RECORD)"] = [size, blocks]
print(json.dumps(rows))
"""


def disk_mib(root: Path) -> float:
    """What `du -sm` counts: each file's and directory's blocks, links not followed."""
    total = 0
    for path in [root, *root.rglob("*")]:
        total += path.lstat().st_blocks * 512
    return total / MIB


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stdout}{done.stderr}")
    return done


def build(work: Path, python: str, bytecode: bool = True) -> tuple[Path, float]:
    """The slim venv under `work`, and the empty venv's size in MiB (`bytecode`: pip's
    default; False adds --no-compile)."""
    dist = work / "dist"
    run([sys.executable, *PIP, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), "."],
        cwd=REPO)  # fmt: skip
    venv = work / "venv"
    run([python, "-m", "venv", str(venv)])
    empty = disk_mib(venv)
    vpy = str(venv / "bin" / "python")
    lock = REPO / "requirements-runtime.lock"
    flags = [] if bytecode else ["--no-compile"]
    run([vpy, *PIP, "install", "--quiet", *flags, "--require-hashes", "-r", str(lock)])
    (wheel,) = dist.glob("canaryd_specdec-*.whl")
    run([vpy, *PIP, "install", "--quiet", *flags, "--no-deps", str(wheel)])
    return venv, empty


def breakdown(venv: Path) -> dict[str, tuple[int, int]]:
    done = run([str(venv / "bin" / "python"), "-c", _SIZES])
    rows: dict[str, list[int]] = json.loads(done.stdout)
    return {name: (size, blocks) for name, (size, blocks) in rows.items()}


def env_for(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CANARYD_")}
    env.pop("PYTHONPATH", None)
    env.update(CANARYD_DATA_DIR=str(work / "data"), CANARYD_CONFIG="", COLUMNS="200")
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def check_judge(venv: Path, work: Path) -> str:
    config = work / "judge.toml"
    config.write_text(
        LIVENESS_ONLY + f'[storage]\nurl = "sqlite:///{work / "judge.db"}"\n', encoding="utf-8"
    )
    with MisbehavingServer() as baseline, MisbehavingServer() as candidate:
        done = subprocess.run(
            [str(venv / "bin" / "canaryd"), "judge", "--config", str(config),
             "--baseline", baseline.url, "--candidate", candidate.url,
             "--pairs", "20", "--model", "m"],
            cwd=work, env=env_for(work), capture_output=True, text=True, timeout=600,
            check=False,
        )  # fmt: skip
    verdict = next((x for x in done.stdout.splitlines() if "verdict:" in x), "no verdict")
    if done.returncode != 0 or "verdict: PASS" not in done.stdout:
        sys.exit(f"judge: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return f"exit 0, {verdict.strip()}"


def check_run(venv: Path, work: Path) -> str:
    port = free_port()
    with MisbehavingServer() as baseline, MisbehavingServer() as speculative:
        config = work / "run.toml"
        config.write_text(
            f'[arms.baseline]\nkind = "openai"\nbase_url = "{baseline.url}"\nmodel = "m"\n'
            f'[arms.speculative]\nkind = "openai"\nbase_url = "{speculative.url}"\n'
            'model = "m"\nspeculative = true\n'
            + LIVENESS_ONLY
            + f'[storage]\nurl = "sqlite:///{work / "run.db"}"\n'
            "[gates.budget]\ndesign_pair_interval_s = 0.2\n"
            "[schedule]\npair_interval_s = 0.2\njitter_s = 0\n"
            f'[server]\nlisten = "127.0.0.1:{port}"\n',
            encoding="utf-8",
        )
        log = (work / "run.log").open("wb")
        process = subprocess.Popen(
            [str(venv / "bin" / "canaryd"), "run", "--config", str(config)],
            cwd=work, env=env_for(work), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            started = time.monotonic()
            ready: httpx.Response | None = None
            while time.monotonic() - started < 180 and process.poll() is None:
                try:
                    ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
                except httpx.TransportError:
                    ready = None
                if ready is not None and ready.status_code == 200:
                    break
                time.sleep(0.5)
            ready_s = time.monotonic() - started
            if ready is None or ready.status_code != 200:
                process.kill()
                process.wait()
                sys.exit(f"run: /readyz never 200\n{(work / 'run.log').read_text()[-3000:]}")
            time.sleep(2)  # a few pairs through both arms
            pairs = len(speculative.requests)
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    if code != 0 or pairs == 0:
        sys.exit(f"run: exit {code}, {pairs} requests\n{(work / 'run.log').read_text()[-3000:]}")
    return f"/readyz 200 after {ready_s:.1f} s, {pairs} candidate requests, SIGTERM: exit 0"


def check_switch(venv: Path, work: Path, rounds: int = 5) -> tuple[str, float]:
    """`canaryd switch status` on a migrated SQLite database, `rounds` fresh interpreters
    that write no bytecode: the median wall time."""
    config = work / "switch.toml"
    config.write_text(
        f'[storage]\nurl = "sqlite:///{work / "switch.db"}"\n'
        f'[switch]\nstate_file = "{work / "switch.json"}"\n',
        encoding="utf-8",
    )
    canaryd = str(venv / "bin" / "canaryd")
    env = {**env_for(work), "PYTHONDONTWRITEBYTECODE": "1"}
    run([canaryd, "db", "upgrade", "--config", str(config)], cwd=work, env=env)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run([canaryd, "switch", "status", "--config", str(config)], cwd=work, env=env)
        times.append(time.perf_counter() - started)
    median = sorted(times)[len(times) // 2]
    return (
        f"median {median:.2f} s of {rounds} (max {max(times):.2f} s), no bytecode written",
        median,
    )


def absent(venv: Path) -> list[str]:
    """The NOT_IN_SLIM packages the venv could import (none expected)."""
    probe = (
        "import importlib.util, sys\n"
        f"print(','.join(n for n in {NOT_IN_SLIM!r} if importlib.util.find_spec(n)))"
    )
    found = run([str(venv / "bin" / "python"), "-c", probe], cwd=venv).stdout.strip()
    return [n for n in found.split(",") if n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="python3", help="the interpreter whose venv")
    parser.add_argument("--check", action="store_true", help="run judge and run there too")
    parser.add_argument("--keep", type=Path, default=None, help="build here and keep it")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--max-mib", type=float, default=None, help="exit 1 above this")
    parser.add_argument(
        "--no-compile", action="store_true", help="pip install --no-compile (no bytecode)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if (work / "venv").exists():
            sys.exit(f"{work / 'venv'} exists: --keep wants a new directory")
        venv, empty = build(work, args.python, bytecode=not args.no_compile)
        total = disk_mib(venv)
        rows = breakdown(venv)
        version = run([str(venv / "bin" / "python"), "-V"]).stdout.strip()
        print(f"{'distribution':<28} {'MiB disk':>9} {'MB bytes':>9}")
        for name, (size, blocks) in sorted(rows.items(), key=lambda r: -r[1][1]):
            print(f"{name:<28} {blocks / MIB:>9.1f} {size / 1e6:>9.1f}")
        bytes_total = sum(size for size, _ in rows.values())
        print(f"{'all':<28} {total:>9.1f} {bytes_total / 1e6:>9.1f}")
        venv_own = sum(rows.get(n, (0, 0))[1] for n in ("pip", "setuptools")) / MIB
        print(
            f"{version}: empty venv {empty:.1f} MiB (pip and setuptools {venv_own:.1f}),"
            f" after the install {total:.1f} MiB, added {total - empty:.1f} MiB"
        )
        result: dict[str, Any] = {
            "python": version,
            "bytecode": not args.no_compile,
            "empty_venv_mib": round(empty, 1),
            "total_mib": round(total, 1),
            "added_mib": round(total - empty, 1),
            "total_mb_bytes": round(bytes_total / 1e6, 1),
            "distributions_mib": {n: round(b / MIB, 1) for n, (_, b) in rows.items()},
        }
        extras = absent(venv)
        if extras:
            sys.exit(f"the slim venv can import {', '.join(extras)}")
        if args.check:
            result["judge"] = check_judge(venv, work)
            print(f"canaryd judge: {result['judge']}")
            result["run"] = check_run(venv, work)
            print(f"canaryd run: {result['run']}")
            result["switch_status"], result["switch_status_s"] = check_switch(venv, work)
            print(f"canaryd switch status: {result['switch_status']}")
        if args.out is not None:
            args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.max_mib is not None and total > args.max_mib:
        print(f"over {args.max_mib:g} MiB by {total - args.max_mib:.1f}")
        sys.exit(1)


if __name__ == "__main__":
    main()
