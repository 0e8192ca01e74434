"""One rollout in real time: loopback arms, `canaryd run`, and the tool polling it.

`play` starts both arms (`servers.LoopbackArm`, sharing one `StallSchedule`), the daemon
(`daemon.Daemon`), waits for its first gate run (a daemon runs long before a rollout
begins), and then plays the tool against the daemon's HTTP endpoints from the first
`POST /v1/verdict` (Argo) or the `pre-rollout` iteration (Flagger): Argo's measurements
`interval` after the previous one finished, Flagger's iterations on a ticker of
`interval`, each divided by `time_scale` (1: the shipped timing). The kill switch, when
the scenario pulls it, runs `canaryd switch rollback` at `kill_at_minute` tool minutes.
The tool's counting is `argo` and `flagger` (pure); this module only does the I/O and
the clock, and writes one JSON-ready dict per run.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from benchmarks.rollout_sim import argo, flagger
from benchmarks.rollout_sim.arms import StallArms, StallSchedule
from benchmarks.rollout_sim.config import run_config, shipped, toml_text
from benchmarks.rollout_sim.daemon import REPO, Daemon, free_port
from benchmarks.rollout_sim.scenarios import SCENARIOS, Scenario, Tool
from benchmarks.rollout_sim.servers import LoopbackArm

EXAMPLES = REPO / "docs" / "examples"
Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Settings:
    """What one run is played with (the CLI's options)."""

    scenario: Scenario
    tool: Tool
    time_scale: float = 1.0
    baseline_ms: float = 60.0
    speculative_ms: float = 36.0
    production_rps: float = 5.0
    telemetry: bool = True
    kill_at_minute: float = 5.0
    max_minutes: float = 60.0  # Flagger has no count: a canary still undecided is "stuck"
    stall_arms: StallArms = "either"
    seed: int = 0
    examples: Path = EXAMPLES
    extra_config: str = ""
    ready_timeout_s: float = 300.0
    checkout: Path = REPO  # the tree canaryd runs from


@dataclass(slots=True)
class _KillSwitch:
    """The kill switch pulled once, `after_s` wall seconds after the rollout began."""

    daemon: Daemon
    after_s: float
    pulled_at_s: float | None = None
    result: tuple[int, str] | None = None
    _timer: threading.Timer | None = field(default=None, repr=False)

    def arm(self, started: float) -> None:
        def pull() -> None:
            self.pulled_at_s = time.monotonic() - started
            self.result = self.daemon.switch_rollback("rollout_sim: the kill switch")

        self._timer = threading.Timer(self.after_s, pull)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _post(url: str, timeout_s: float, **kwargs: Any) -> tuple[int | None, bytes]:
    try:
        answer = httpx.post(url, timeout=timeout_s, **kwargs)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}".encode()
    return answer.status_code, answer.content


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _short(reason: object, limit: int = 240) -> str:
    """canaryd's reason, cut where a row stays readable (the full one is in its log)."""
    text = str(reason or "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))


def play_argo(
    settings: Settings, daemon: Daemon, revision: str, started: float, log: Log
) -> dict[str, Any]:
    metric = argo.load_template(
        settings.examples / "argo" / "analysis-template.yaml",
        {"canaryd-url": daemon.url, "revision": revision, "canaryd-token": daemon.token},
    )
    result = argo.MetricResult()
    last: dict[str, Any] = {}
    ended = started
    while result.phase is None:
        headers = dict(metric.headers)
        status, body = _post(metric.url, metric.timeout_s, headers=headers)
        ended = time.monotonic()
        phase, message = argo.measurement_phase(metric, status, body)
        result.record(metric, phase)
        last = _json(body) or last
        log(
            f"{(ended - started) / 60 * settings.time_scale:5.1f} min  measurement "
            f"{len(result.phases):2} {phase:12} {last.get('verdict', status)!s:12} "
            f"pairs {last.get('pairs')}  {(message or str(last.get('reason', '')))[:90]}"
        )
        if result.phase is None:
            _sleep_until(ended + argo.next_measurement_after(metric, phase) / settings.time_scale)
    outcome = {
        "Successful": "Successful",
        "Failed": "Failed",
        "Error": "Error",
        "Inconclusive": "Inconclusive",
    }[result.phase]
    return {
        "outcome": outcome,
        "wall_s": ended - started,
        "pairs": last.get("pairs"),
        "reason": f"{result.message}; canaryd: {_short(last.get('reason'))}",
        "verdict": last.get("verdict"),
        "argo": {
            "rollout": argo.ROLLOUT_ACTION[result.phase],
            "weight_during_analysis": argo.analysis_weight(
                settings.examples / "argo" / "rollout.yaml"
            ),
            "measurements": len(result.phases),
            "count": result.count,
            "successful": result.successful,
            "failed": result.failed,
            "inconclusive": result.inconclusive,
            "error": result.error,
            "phases": "".join(p[0] for p in result.phases),
            "template": {
                "interval_s": metric.interval_s,
                "count": metric.count,
                "consecutive_success_limit": metric.consecutive_success_limit,
                "failure_limit": metric.failure_limit,
                "inconclusive_limit": metric.inconclusive_limit,
                "consecutive_error_limit": metric.consecutive_error_limit,
            },
        },
    }


def _webhook_url(hook_url: str, daemon: Daemon) -> str:
    """The hook's path and query on the daemon."""
    parts = urlsplit(hook_url)
    return f"{daemon.url}{parts.path}" + (f"?{parts.query}" if parts.query else "")


def hook_metadata(hook: flagger.Webhook, token: str) -> dict[str, str]:
    """The hook's `metadata` with `token` put in for the Canary's placeholder, as the
    guide applies it (`sed "s/<server.auth_token>/$TOKEN/"`)."""
    return {k: v.replace(flagger.TOKEN_PLACEHOLDER, token) for k, v in hook.metadata.items()}


def play_flagger(
    settings: Settings, daemon: Daemon, revision: str, started: float, log: Log
) -> dict[str, Any]:
    canary = flagger.load_canary(settings.examples / "flagger" / "canary.yaml")
    run = flagger.CanaryRun(canary)
    last: dict[str, Any] = {}

    def call(hook: flagger.Webhook, phase: flagger.CanaryPhase) -> flagger.HookAnswer:
        nonlocal last
        payload = {
            "name": canary.name,
            "namespace": canary.namespace,
            "phase": phase,
            "checksum": revision,
            "metadata": hook_metadata(hook, daemon.token),
        }
        status: int | None = None
        body = b""
        for attempt in range(hook.retries + 1):
            if attempt:  # go-retryablehttp's backoff: 1 s doubling, at most 30 s
                time.sleep(min(2 ** (attempt - 1), 30) / settings.time_scale)
            status, body = _post(_webhook_url(hook.url, daemon), hook.timeout_s, json=payload)
            if not flagger.retried(status):
                break
        answer = flagger.HookAnswer(status, _json(body))
        if answer.body.get("pairs") is not None:
            last = answer.body
        return answer

    interval = canary.interval_s / settings.time_scale
    deadline_ticks = int(settings.max_minutes * 60 / canary.interval_s) + 1
    while not run.done and run.decided_at_tick is None and run.ticks < deadline_ticks:
        _sleep_until(started + run.ticks * interval)
        before = len(run.events)
        run.tick(call)
        said = " ".join(
            f"{e.hook}:{e.status}" for e in run.events[before:]
        )  # what this iteration's webhooks answered
        log(
            f"{(time.monotonic() - started) / 60 * settings.time_scale:5.1f} min  iteration "
            f"{run.ticks:2} {run.phase:16} weight {run.canary_weight:3}  failed checks "
            f"{run.failed_checks}  {said}  {last.get('verdict')} pairs {last.get('pairs')}"
        )
    ended = time.monotonic()
    if run.phase == "Failed":
        outcome = "rolled back"
    elif run.decided_at_tick is not None:
        outcome = "promoted"
    else:
        outcome = "stuck"
        run.reason = f"undecided after {settings.max_minutes:g} minutes (--max-minutes)"
    return {
        "outcome": outcome,
        "wall_s": ended - started,
        "pairs": last.get("pairs"),
        "max_weight": run.max_weight_reached,
        "reason": f"{run.reason}; canaryd: {_short(last.get('reason'))}",
        "verdict": last.get("verdict"),
        "flagger": {
            "iterations": run.ticks,
            "failed_checks": run.failed_checks,
            "phase": run.phase,
            "hooks": [f"{e.tick}:{e.hook}:{e.status}" for e in run.events],
            "canary": {
                "interval_s": canary.interval_s,
                "threshold": canary.threshold,
                "step_weight": canary.step_weight,
                "max_weight": canary.max_weight,
            },
        },
    }


def _as_expected(settings: Settings, row: dict[str, Any]) -> bool:
    scenario = settings.scenario
    minutes = row["minutes"]
    if scenario.kill_switch:
        kill = row.get("kill_switch") or {}
        minutes = minutes - (kill.get("at_minute") or 0.0)
    if scenario.healthy and not scenario.kill_switch:
        good = row["outcome"] in ("Successful", "promoted")
    else:
        good = row["outcome"] in ("Failed", "rolled back")
    weight_ok = (
        scenario.max_flagger_weight is None
        or (row.get("max_weight") or 0) <= scenario.max_flagger_weight
    )
    return good and minutes <= scenario.within_minutes and weight_ok


def play(settings: Settings, run_index: int, log: Log) -> dict[str, Any]:
    """One run of `settings`: the JSON-ready row."""
    scenario = settings.scenario
    seed = settings.seed * 1000 + run_index
    baseline_behaviour, speculative_behaviour = scenario.arms(
        settings.baseline_ms, settings.speculative_ms
    )
    stalls = StallSchedule(scenario.stall_share, arms=settings.stall_arms, seed=seed)
    with tempfile.TemporaryDirectory(prefix="rollout-sim-") as tmp, ExitStack() as stack:
        baseline = stack.enter_context(
            LoopbackArm(
                "baseline",
                baseline_behaviour,
                stalls,
                seed=seed,
                production_rps=settings.production_rps,
            )
        )
        speculative = stack.enter_context(
            LoopbackArm(
                "speculative",
                speculative_behaviour,
                stalls,
                seed=seed,
                production_rps=settings.production_rps,
            )
        )
        # The previous revision, still serving production beside the canary: healthy
        # speculation, its own traffic (no pairs reach it), its /metrics the stable's.
        stable = stack.enter_context(
            LoopbackArm(
                "speculative",
                SCENARIOS["healthy"].arms(settings.baseline_ms, settings.speculative_ms)[1],
                StallSchedule(0.0, arms=settings.stall_arms, seed=seed),
                seed=seed + 7,
                production_rps=settings.production_rps,
            )
        )
        port = free_port()
        base, config_source = shipped(settings.examples, settings.tool)
        config = run_config(
            base,
            {"baseline": baseline.url, "speculative": speculative.url},
            port,
            Path(tmp) / "data",
            telemetry=settings.telemetry,
            stables={"speculative": stable.url},
            extra=settings.extra_config,
        )
        daemon = stack.enter_context(
            Daemon(Path(tmp), toml_text(config), port, secrets.token_hex(16), settings.checkout)
        )
        ready_s = daemon.wait_until_judging(settings.ready_timeout_s)
        log(f"canaryd judging after {ready_s:.0f} s; the rollout begins")
        revision = secrets.token_hex(5)
        started = time.monotonic()
        kill: _KillSwitch | None = None
        if scenario.kill_switch:
            kill = _KillSwitch(daemon, settings.kill_at_minute * 60.0 / settings.time_scale)
            kill.arm(started)
        try:
            if settings.tool == "argo":
                row = play_argo(settings, daemon, revision, started, log)
            else:
                row = play_flagger(settings, daemon, revision, started, log)
        finally:
            if kill is not None:
                kill.cancel()
        row = {
            "scenario": scenario.name,
            "tool": settings.tool,
            "run": run_index,
            "outcome": row.pop("outcome"),
            "minutes": round(row["wall_s"] / 60.0 * settings.time_scale, 2),
            "wall_minutes": round(row.pop("wall_s") / 60.0, 2),
            **row,
        }
        if kill is not None:
            at = None if kill.pulled_at_s is None else kill.pulled_at_s / 60 * settings.time_scale
            row["kill_switch"] = {
                "at_minute": None if at is None else round(at, 2),
                "exit_code": None if kill.result is None else kill.result[0],
                "output": None if kill.result is None else kill.result[1],
            }
        row["expected"] = scenario.expected(settings.tool)
        # canaryd runs at its own pace whatever the tool's: only real time says whether
        # the scenario ended as it should.
        row["as_expected"] = _as_expected(settings, row) if settings.time_scale == 1 else None
        row["arms"] = {
            "token_ms": {"baseline": settings.baseline_ms, "speculative": settings.speculative_ms},
            "requests": {"baseline": baseline.served, "speculative": speculative.served},
            "http_500": speculative.errors,
            "production_rps": settings.production_rps,
            "telemetry": settings.telemetry,
        }
        row["stalls"] = {
            "opened": stalls.stalls,
            "stalled_requests": dict(stalls.stalled_requests),
            "share_of_pairs": round(
                sum(stalls.stalled_requests.values()) / max(baseline.served, 1), 4
            ),
        }
        row["timing"] = (
            "shipped"
            if settings.time_scale == 1
            else f"compressed: the tool's interval divided by {settings.time_scale:g} (canaryd "
            "keeps its defaults); minutes are the tool's, not the shipped timing"
        )
        row["daemon_ready_s"] = round(ready_s, 1)
        row["config"] = config_source
    return row
