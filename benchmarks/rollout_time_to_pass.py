"""Time from a rollout tool's first `POST /v1/verdict` to a healthy revision's PASS, through
the rollout burst: a daemon on two healthy fake arms (identical outputs), the default gates
and `[rollout]` defaults (or `--rate`, `--concurrency`), a real SQLite file and real HTTP;
the script polls as Argo's template does (a POST every `--interval` seconds) until the
verdict decides or `--max-minutes` pass. Prints and writes (`--out F`) JSON: `verdict`,
`minutes_to_decision`, `pairs`, `polls`, the burst's `burst_pairs` and `burst_tokens`, and
the settings it ran with. Wall-clock: run it alone on a quiet machine.

    python -m benchmarks.rollout_time_to_pass --out rollout.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from canaryd.config import load_settings
from canaryd.daemon import Daemon
from canaryd.judging.gatejob import SwitchGates

CONFIG = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
[storage]
url = "sqlite:///{dir}/canaryd.db"
[server]
listen = "127.0.0.1:0"
[switch]
state_file = "{dir}/switch.json"
[schedule]
gate_interval_s = {gate_interval}
[rollout]
max_pairs_per_minute = {rate}
concurrency = {concurrency}
"""


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "canaryd.toml"
        path.write_text(
            CONFIG.format(
                dir=tmp,
                gate_interval=args.gate_interval,
                rate=args.rate,
                concurrency=args.concurrency,
            )
        )
        settings = load_settings(path)
        gates = SwitchGates(settings)
        daemon = Daemon(settings, config_path=path, gates=gates)
        daemon.start()
        try:
            url = f"http://{daemon.address}/v1/verdict"
            while gates.suspicion is None:  # the first gate run (gate_interval_s)
                time.sleep(0.5)
            started = time.monotonic()
            deadline = started + 60 * args.max_minutes
            polls = 0
            body: dict[str, Any] = {}
            while time.monotonic() < deadline:
                answer = httpx.post(url, params={"revision": "healthy"}, timeout=30)
                polls += 1
                if answer.status_code == 200:
                    body = answer.json()
                    print(
                        f"{(time.monotonic() - started) / 60:6.2f} min  {body['verdict']:12} "
                        f"pairs {body['pairs']:4}  estimate {body['estimate']}",
                        file=sys.stderr,
                    )
                    if body["verdict"] in ("PASS", "FAIL"):
                        break
                time.sleep(args.interval)
            elapsed = time.monotonic() - started
            burst = body.get("burst") or {}
            return {
                "verdict": body.get("verdict"),
                "minutes_to_decision": round(elapsed / 60, 2)
                if body.get("verdict") in ("PASS", "FAIL")
                else None,
                "pairs": body.get("pairs"),
                "polls": polls,
                "reason": body.get("reason"),
                "burst_pairs": burst.get("pairs"),
                "burst_tokens": burst.get("tokens"),
                "settings": {
                    "rollout.max_pairs_per_minute": args.rate,
                    "rollout.concurrency": args.concurrency,
                    "schedule.gate_interval_s": args.gate_interval,
                    "poll_interval_s": args.interval,
                },
            }
        finally:
            daemon.stop()
            gates.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=30.0, help="rollout.max_pairs_per_minute")
    parser.add_argument("--concurrency", type=int, default=4, help="rollout.concurrency")
    parser.add_argument("--gate-interval", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between polls")
    parser.add_argument("--max-minutes", type=float, default=40.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = measure(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
