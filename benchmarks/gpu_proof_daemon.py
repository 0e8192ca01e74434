"""The GPU proof's daemon run: `canaryd run` as a user runs it, on a tiny model saved
as a transformers directory, on the proof's device, with SQLite, in a data directory of
its own; then what it stored, counted and checked.

Three arms: the baseline, a causal draft-heads arm (a comparison arm) and the switch's
arm, prompt lookup under logit noise (`numeric_noise`): a deliberately broken decoder
whose greedy outputs differ from the baseline's, so that the quality gate FAILs and the
policy trips the switch. The false-alarm budget is spent freely (a test-sized
calibration), so the trip comes within seconds of the first pairs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.demo_check import pairs as stored_pairs
from benchmarks.gpu_proof_arms import resources
from canaryd.bench.resources import ResourceMonitor

REPO = Path(__file__).resolve().parents[1]
BROKEN_ARM = "noisy"
HEADS_ARM = "heads"


@dataclass(frozen=True)
class DaemonSetup:
    """What the daemon runs on, and for how long after its first pair."""

    model_dir: Path
    models_dir: Path  # holds the model's trained heads
    categories: list[str]  # the prompt categories that fit the model's context
    device: str
    dtype: str
    max_tokens: int
    gate_interval_s: float
    seconds: float
    threads: int  # CPU torch threads (0: torch's default)


BROKEN_ARM = "noisy"
HEADS_ARM = "heads"


def daemon_config(setup: DaemonSetup, work: Path) -> Path:
    """A config for `canaryd run`: the tiny model on three arms, fast gates, a budget
    spent freely (a test-sized calibration) so that the broken arm trips within seconds."""
    categories = ", ".join(json.dumps(c) for c in setup.categories)
    arm = f"""kind = "transformers"
model = {json.dumps(str(setup.model_dir))}
device = "{setup.device}"
dtype = "{setup.dtype}"
warmup_tokens = 2
"""
    text = f"""[arms.baseline]
{arm}
[arms.{HEADS_ARM}]
{arm}
[arms.{HEADS_ARM}.speculative]
method = "draft_heads"
causal = true

[arms.{BROKEN_ARM}]
{arm}
[arms.{BROKEN_ARM}.speculative]
method = "prompt_lookup"
num_draft_tokens = 4
numeric_noise = 50.0

[prompts]
categories = [{categories}]
max_tokens = {setup.max_tokens}

[storage]
url = {json.dumps(f"sqlite:///{work / 'canaryd.db'}")}

[schedule]
pair_interval_s = 0.1
jitter_s = 0
gate_interval_s = {setup.gate_interval_s}
probe_interval_s = 0
shutdown_timeout_s = 30

[server]
listen = "127.0.0.1:0"

[logging]
format = "json"

[switch]
arm = "{BROKEN_ARM}"
state_file = {json.dumps(str(work / "switch.json"))}

[gates.budget]
false_rollbacks_per_30_days = 1000000.0
over_design_rate = "rebudget"
"""
    path = work / "canaryd.toml"
    path.write_text(text, encoding="utf-8")
    return path


def query(database: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
        return connection.execute(sql, params).fetchall()


def switch_state(path: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state


class DaemonRun:
    """`canaryd run` on the tiny model as a user runs it, in its own process and data
    directory (whose models are the tiny model's, heads included)."""

    def __init__(self, setup: DaemonSetup, work: Path) -> None:
        self.work = work
        self.setup = setup
        work.mkdir()
        data = work / "data"
        data.mkdir()
        (data / "models").symlink_to(setup.models_dir.resolve(), target_is_directory=True)
        self.config = daemon_config(setup, work)
        self.database, self.state_file = work / "canaryd.db", work / "switch.json"
        self.log = work / "canaryd.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
        self.env |= {"CANARYD_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        if setup.threads:
            self.env["OMP_NUM_THREADS"] = str(setup.threads)
        self._stack = contextlib.ExitStack()
        self._process: subprocess.Popen[bytes] | None = None
        self._monitor = ResourceMonitor()
        self._began = 0.0

    def start(self) -> None:
        self._began = time.monotonic()
        self._stack.enter_context(self._monitor)
        sink = self._stack.enter_context(self.log.open("wb"))
        self._process = subprocess.Popen(
            [sys.executable, "-m", "canaryd", "run", "--config", str(self.config)],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )

    def finish(self) -> dict[str, Any]:
        """Run on until `seconds` after the first pair and the broken arm's trip
        (within a bound that leaves a failing run its report), stop it with SIGTERM as
        systemd does, and count what it stored."""
        process = self._process
        assert process is not None, "start() first"
        first_pair_at = None
        with self._stack:
            try:
                limit = self._began + 240 + self.setup.seconds
                while time.monotonic() < limit and process.poll() is None:
                    if first_pair_at is None and stored_pairs(self.database) > 0:
                        first_pair_at = time.monotonic()
                    ran = first_pair_at is not None and time.monotonic() - first_pair_at
                    tripped = switch_state(self.state_file).get("mode") == "rolled_back"
                    if ran and ran >= self.setup.seconds and tripped:
                        break
                    time.sleep(0.2)
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                code: int | None = process.wait(90)
            except subprocess.TimeoutExpired:
                code = None  # it did not stop within 90 s of SIGTERM: killed below
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        ran_s = time.monotonic() - first_pair_at if first_pair_at is not None else 0.0
        out: dict[str, Any] = {
            "exit_code": code,
            "seconds_total": round(time.monotonic() - self._began, 1),
            "seconds_after_first_pair": round(ran_s, 1),
            "resources": resources(self._monitor),
        }
        if code != 0 or not self.database.exists():
            out["log_tail"] = self.log.read_text(errors="replace")[-3000:]
        if self.database.exists():
            out |= self.stored()
        return out

    def stored(self) -> dict[str, Any]:
        """The rows the run stored, counted per table and read for the checks."""
        database = self.database
        tables = ("runs", "pairs", "generations", "pair_scores", "gate_decisions", "switch_audit")
        rows = {t: query(database, f"SELECT count(*) FROM {t}")[0][0] for t in tables}  # noqa: S608
        heads_scores = query(
            database,
            "SELECT count(*), coalesce(sum(s.exact_match), 0) FROM pair_scores s "
            "JOIN pairs p ON p.pair_id = s.pair_id WHERE p.arm = ?",
            HEADS_ARM,
        )[0]
        identities = query(database, "SELECT baseline_identity FROM runs")
        return {
            "rows": rows,
            "pairs_by_arm": dict(query(database, "SELECT arm, count(*) FROM pairs GROUP BY arm")),
            "complete_pairs": query(database, "SELECT count(*) FROM pairs WHERE complete")[0][0],
            "gate_states": [
                {"gate": gate, "state": state, "count": count}
                for gate, state, count in query(
                    database,
                    "SELECT gate, state, count(*) FROM gate_decisions "
                    "WHERE comparison_arm IS NULL GROUP BY gate, state ORDER BY gate, state",
                )
            ],
            "transitions": [
                {"actor": actor, "target": target}
                for actor, target in query(
                    database,
                    "SELECT actor, target FROM switch_audit WHERE kind = 'transition' ORDER BY id",
                )
            ],
            "heads_arm": {"scored_pairs": heads_scores[0], "exact_matches": heads_scores[1]},
            "engine_device": json.loads(identities[0][0]).get("device") if identities else None,
            "switch_file": switch_state(self.state_file),
        }


def daemon_checks(daemon: dict[str, Any], device: str) -> dict[str, bool]:
    rows = daemon.get("rows", {})
    by_arm = daemon.get("pairs_by_arm", {})
    heads = daemon.get("heads_arm", {})
    state = daemon.get("switch_file", {})
    return {
        "daemon_exit_0": daemon["exit_code"] == 0,
        "daemon_on_device": str(daemon.get("engine_device")).startswith(device.split(":")[0]),
        "daemon_pairs_on_every_arm": all(by_arm.get(a, 0) > 0 for a in (HEADS_ARM, BROKEN_ARM)),
        "daemon_two_generations_per_pair": rows.get("pairs", 0) > 0
        and rows.get("generations") == 2 * rows["pairs"],
        "daemon_scores_per_complete_pair": rows.get("pairs", 0) > 0
        and rows.get("pair_scores") == daemon.get("complete_pairs"),
        "daemon_gate_decisions": rows.get("gate_decisions", 0) > 0,
        "daemon_switch_tripped": any(
            t["target"] == "rolled_back" and t["actor"].startswith("gate:")
            for t in daemon.get("transitions", [])
        )
        and state.get("speculative_enabled") is False,
        "daemon_heads_arm_lossless": heads.get("scored_pairs", 0) > 0
        and heads.get("exact_matches") == heads.get("scored_pairs"),
    }


def print_daemon(daemon: dict[str, Any]) -> None:
    print(
        f"\ndaemon: exit {daemon['exit_code']}, {daemon['seconds_after_first_pair']} s after "
        f"its first pair, rows {daemon.get('rows')}, pairs by arm {daemon.get('pairs_by_arm')}"
    )
    for transition in daemon.get("transitions", []):
        print(f"switch -> {transition['target']} by {transition['actor']}")
