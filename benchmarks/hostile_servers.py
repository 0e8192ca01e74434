"""`canaryd probe` and `canaryd judge` against hostile servers: peak memory and wall time.

Each scenario runs the command as a user does (`python -m canaryd …`, a process of its
own) with a healthy baseline and a speculative arm that misbehaves on loopback
(`tests.support.servers`): `endless` streams well-formed content to every request for
ever (about `--rate-mb-s` per connection) and `drip` sends one byte every `--drip-s`
seconds, for ever; `healthy` answers well, for the floor each command stands on (judge's
scoring imports alone hold several hundred MB). Reported per scenario: the exit code,
the wall time against the bound the command was given (`probe --timeout`; `judge`:
`--pairs` pairs of two generations of at most `prompts.timeout_s` each, plus the
command's start), the peak RSS (VmHWM from /proc/<pid>/status, polled, and ru_maxrss from
wait4) and its excess over the healthy run of the same command, and what the command
said (the probe's regressions, capabilities not run and read caps; the judge's verdict).
Goal: every command within its bound, and no more memory against a hostile server than
against a healthy one (the issue's figure: under 300 MB, which the probe meets).

`--pythonpath DIR` runs the commands from another checkout (the code before a change,
say: its path and working directory, which `python -m` puts first) while the servers
stay this checkout's; `--limit-s` kills a command still running
after that long, reported as killed. `tests` is importable because `make venv` installs
canaryd in editable mode, which puts the repository root on the path.

Usage: .venv/bin/python benchmarks/hostile_servers.py [--probe-timeout 30]
       [--generation-timeout 10] [--pairs 5] [--drip-s 2] [--rate-mb-s 30]
       [--limit-s 600] [--pythonpath DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.support.capability_server import CapabilityServer
from tests.support.servers import Behaviour, MisbehavingServer

GOAL_MB = 300.0
CHUNK_BYTES = 64 * 1024
MODEL = "probe-model"


@dataclass
class Outcome:
    """One command against one hostile server."""

    scenario: str
    bound_s: float
    exit_code: int | None  # None: killed at --limit-s
    wall_s: float
    peak_rss_mb: float  # VmHWM, polled
    max_rss_mb: float | None  # ru_maxrss from wait4 (None when killed)
    said: dict[str, Any] = field(default_factory=dict)

    @property
    def rss_mb(self) -> float:
        return max(self.peak_rss_mb, self.max_rss_mb or 0.0)

    @property
    def in_bound(self) -> bool:
        return self.exit_code is not None and self.wall_s <= self.bound_s


def _vm_hwm_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None  # a zombie: its memory is gone


def run_command(
    argv: list[str], env: dict[str, str], limit_s: float, cwd: str | None
) -> tuple[int | None, float, float, float | None, str]:
    """Run `argv` in `cwd` to its end (or kill it at `limit_s`): exit code, wall seconds,
    polled peak RSS, ru_maxrss (MB) and stdout."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
        peak = 0.0
        code: int | None = None
        max_rss: float | None = None
        while True:
            peak = max(peak, _vm_hwm_mb(proc.pid) or 0.0)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                max_rss = usage.ru_maxrss / 1024
                proc.returncode = code
                break
            if time.monotonic() - started > limit_s:
                proc.kill()
                proc.wait()
                break
            time.sleep(0.05)
        wall = time.monotonic() - started
        out.seek(0)
        return code, wall, peak, max_rss, out.read().decode(errors="replace")


def _summary(command: str, stdout: str) -> dict[str, Any]:
    try:
        body = json.loads(stdout)
    except ValueError:
        return {"stdout": stdout.strip()[-200:]}
    if command == "probe":
        failing = [
            c["speculative"]["reason"][:90]
            for c in body.get("capabilities", ())
            if c["speculative"]["state"] != "pass"
        ]
        return {
            "regressions": len(body.get("regressions", ())),
            "not_run": len(body.get("not_run", ())),
            "read_caps": body.get("read_caps"),
            "elapsed_s": body.get("elapsed_s"),
            "first_reason": failing[0] if failing else "",
        }
    return {k: body.get(k) for k in ("verdict", "pairs", "elapsed_s", "reason")}


@contextmanager
def candidate_server(fault: str, args: argparse.Namespace) -> Iterator[MisbehavingServer]:
    with MisbehavingServer() as server:
        if fault == "endless":
            delay = CHUNK_BYTES / (args.rate_mb_s * 1e6)
            server.default = Behaviour(
                fault="endless", chunk_bytes=CHUNK_BYTES, token_delay_s=delay
            )
        elif fault == "drip":
            server.default = Behaviour(fault="drip", drip_s=args.drip_s)
        yield server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe-timeout", type=float, default=30.0, help="0: not passed")
    parser.add_argument("--generation-timeout", type=float, default=10.0)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--drip-s", type=float, default=2.0)
    parser.add_argument("--rate-mb-s", type=float, default=30.0)
    parser.add_argument("--limit-s", type=float, default=600.0)
    parser.add_argument("--pythonpath", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        env = {
            **os.environ,
            "CANARYD_DATA_DIR": str(work / "data"),
            "CANARYD_CONFIG": "",
            "CANARYD_STORAGE__URL": f"sqlite:///{work / 'canaryd.db'}",
        }
        env.pop("CANARYD_DATABASE_URL", None)
        if args.pythonpath:
            env["PYTHONPATH"] = args.pythonpath
        judge_config = work / "judge.toml"
        judge_config.write_text(
            f"[prompts]\nmax_tokens = 32\ntimeout_s = {args.generation_timeout}\n"
            f'[storage]\nurl = "sqlite:///{work / "canaryd.db"}"\n'
        )
        probe_baseline = stack.enter_context(CapabilityServer())
        judge_baseline = stack.enter_context(MisbehavingServer())
        for fault in ("healthy", "endless", "drip"):
            with candidate_server(fault, args) as candidate, ExitStack() as probed:
                url = candidate.url
                if fault == "healthy":  # every capability, as a real server has them
                    url = probed.enter_context(CapabilityServer()).url
                argv = [
                    sys.executable, "-m", "canaryd", "probe", "--json",
                    "--baseline", probe_baseline.url, "--candidate", url,
                    "--model", MODEL,
                ]  # fmt: skip
                bound = args.probe_timeout or 180.0
                if args.probe_timeout:
                    argv += ["--timeout", f"{args.probe_timeout:g}"]
                code, wall, peak, max_rss, stdout = run_command(
                    argv, env, args.limit_s, args.pythonpath
                )
                # The command's own start (imports, the store) comes on top of the run.
                outcomes.append(
                    Outcome(
                        f"probe × {fault}", bound + 15.0, code, wall, peak, max_rss,
                        _summary("probe", stdout),
                    )
                )  # fmt: skip
            with candidate_server(fault, args) as candidate:
                argv = [
                    sys.executable, "-m", "canaryd", "judge", "--json",
                    "--config", str(judge_config), "--baseline", judge_baseline.url,
                    "--candidate", candidate.url, "--model", MODEL,
                    "--pairs", str(args.pairs),
                ]  # fmt: skip
                bound = args.pairs * 2 * args.generation_timeout + 30.0
                code, wall, peak, max_rss, stdout = run_command(
                    argv, env, args.limit_s, args.pythonpath
                )
                outcomes.append(
                    Outcome(
                        f"judge × {fault}", bound, code, wall, peak, max_rss,
                        _summary("judge", stdout),
                    )
                )  # fmt: skip

    floor = {o.scenario.split()[0]: o.rss_mb for o in outcomes if o.scenario.endswith("healthy")}

    def excess(o: Outcome) -> float:
        return o.rss_mb - floor.get(o.scenario.split()[0], 0.0)

    if args.json:
        rows = [
            {**asdict(o), "in_bound": o.in_bound, "under_goal": o.rss_mb < GOAL_MB,
             "excess_over_healthy_mb": round(excess(o), 1)}
            for o in outcomes
        ]  # fmt: skip
        json.dump({"goal_mb": GOAL_MB, "args": vars(args), "outcomes": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print(f"{'scenario':<16} {'exit':>5} {'wall s':>7} {'bound s':>7} {'in bound':>8} "
          f"{'VmHWM MB':>8} {'maxrss MB':>9} {'excess MB':>9}  said")  # fmt: skip
    for o in outcomes:
        shown_rss = "-" if o.max_rss_mb is None else f"{o.max_rss_mb:.0f}"
        shown_code = "kill" if o.exit_code is None else str(o.exit_code)
        print(
            f"{o.scenario:<16} {shown_code:>5} {o.wall_s:>7.1f} {o.bound_s:>7.0f} "
            f"{'yes' if o.in_bound else 'NO':>8} {o.peak_rss_mb:>8.0f} {shown_rss:>9} "
            f"{excess(o):>+9.0f}  {json.dumps(o.said)}"
        )


if __name__ == "__main__":
    main()
