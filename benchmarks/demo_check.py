"""`make demo` as a new user runs it, N times in a row: the `once` table, then the daemon
storing pairs until Ctrl-C. Each run starts `make demo` in its own process group, waits
for the table and then for the daemon's first stored pair (a pair stored after the
table's), sends SIGINT to the group (as Ctrl-C does), and requires the daemon's clean stop
(`daemon.stopped`), no traceback, and make ending by that SIGINT or with 0.

    python benchmarks/demo_check.py --runs 5 [--repo PATH]

Run it in a fresh clone to check what a new user gets (the first run also builds .venv
and pulls the embedded model). Prints one line per run and a summary; exit 1 on any
failure. CANARYD_DATA_DIR is a fresh directory per run, sharing only the converted model.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pairs(database: Path) -> int:
    """Pairs stored in the SQLite file at `database`, read-only; 0 before its schema exists."""
    if not database.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
            return int(connection.execute("select count(*) from pairs").fetchone()[0])
    except sqlite3.OperationalError:
        return 0  # the schema is being created


def one_run(repo: Path, models: Path, timeout_s: float) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="canaryd-demo-") as scratch:
        data = Path(scratch) / "data"
        data.mkdir()
        if models.is_dir():
            (data / "models").symlink_to(models.resolve(), target_is_directory=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
        env.update(CANARYD_DATA_DIR=str(data), PYTHONUNBUFFERED="1")
        log = Path(scratch) / "demo.log"
        started = time.monotonic()
        with log.open("wb") as sink:
            process = subprocess.Popen(
                ["make", "demo"], cwd=repo, env=env, stdout=sink, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            database = data / "canaryd.db"
            try:
                table_pairs = None
                while time.monotonic() - started < timeout_s:
                    if process.poll() is not None:
                        return False, f"make demo exited {process.returncode}: {tail(log)}"
                    text = log.read_text(errors="replace")
                    if table_pairs is None and "its gates decide" in " ".join(text.split()):
                        table_pairs = pairs(database)
                    if table_pairs is not None and pairs(database) > table_pairs:
                        break
                    time.sleep(0.5)
                else:
                    return False, f"no daemon pair within {timeout_s:.0f} s: {tail(log)}"
                os.killpg(process.pid, signal.SIGINT)
                code = process.wait(60)
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        text = log.read_text(errors="replace")
        took = time.monotonic() - started
        # Ctrl-C reaches make and canaryd together: canaryd stops cleanly (exit 0), and
        # make then ends by the signal itself, as it does for any interrupted recipe.
        make_ok = code in (0, -signal.SIGINT, 128 + signal.SIGINT)
        if not make_ok or "Traceback" in text or "daemon.stopped" not in text:
            return False, f"exit {code} after SIGINT: {tail(log)}"
        return (
            True,
            f"table, {pairs(database) - (table_pairs or 0)} daemon pair(s), exit 0 in {took:.0f} s",
        )


def tail(log: Path, chars: int = 1500) -> str:
    return log.read_text(errors="replace")[-chars:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    args = parser.parse_args()
    xdg = os.environ.get("XDG_CACHE_HOME")
    default_data = Path(
        os.environ.get("CANARYD_DATA_DIR")
        or (Path(xdg) if xdg else Path.home() / ".cache") / "canaryd"
    )
    models = default_data / "models"
    failures = 0
    for number in range(1, args.runs + 1):
        ok, what = one_run(args.repo.resolve(), models, args.timeout)
        failures += not ok
        print(f"run {number}: {'ok' if ok else 'FAILED'}: {what}", flush=True)
    print(f"{args.runs - failures} of {args.runs} runs ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
