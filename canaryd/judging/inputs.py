"""Enforce gates whose input the configured servers cannot provide, said once at start.

An enforce gate that can never decide holds every PASS of the switch's arm at INCONCLUSIVE
in silence (a rollout that can never succeed). `unprovided` reads the configuration alone
and names each such gate with what to configure; the daemon logs each once at start
(`gates.input_unavailable`, `log_unprovided`). What it knows:

- `drift` reads each pair's acceptance length on the switch's arm. An OpenAI-compatible
  arm reports none with `speculative = false` or `server_kind = "generic"`, and TGI only
  through `metrics_url`; vLLM and SGLang report it per request only when the server does
  (vLLM 0.32 and later with `--per-request-spec-decode-metrics`, SGLang's native API), else
  through `metrics_url` (said as a possibility: the server's version is not known at start).
  Where an enforced `telemetry.acceptance` covers drift, drift's NODATA holds nothing.
- The telemetry gates compare both arms' production telemetry: with `[telemetry]`
  configured they need `[telemetry.arms.baseline]` and the switch's arm's.
- `telemetry.acceptance` reads drafts, which a gateway (`kind = "gateway"`) does not count.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from canaryd.config import Settings
from engine.config import OpenAIEngineConfig
from gates import GateMode
from gates.config import GatesConfig
from gates.cycle import TELEMETRY_GATES, section
from gates.records import BASELINE_ARM

__all__ = ["Unprovided", "log_unprovided", "unprovided"]

log = structlog.get_logger(__name__)

WARN_INSTEAD = 'or set gates.{gate}.mode = "warn" to judge without it'


@dataclass(frozen=True, slots=True)
class Unprovided:
    """An enforce gate that cannot decide on what the servers provide (`certain`), or
    may not (it depends on the server's version or flags), why, and what to configure."""

    gate: str
    reason: str
    fix: str
    certain: bool = True


def _enforced(config: GatesConfig, gate: str) -> bool:
    return section(config, gate).mode is GateMode.ENFORCE


def _drift(settings: Settings, arm: str) -> Unprovided | None:
    engine = settings.arms.arm(arm)
    if not isinstance(engine, OpenAIEngineConfig):
        return None  # the in-process engines count acceptance themselves
    fix = "; ".join(
        [
            f"set [arms.{arm}] speculative = true and its server_kind (vllm, sglang, tgi, "
            "llamacpp) with metrics_url",
            WARN_INSTEAD.format(gate="drift"),
        ]
    )
    if not engine.speculative:
        return Unprovided("drift", f"arm {arm!r} has speculative = false: no acceptance", fix)
    if engine.server_kind == "generic":
        return Unprovided("drift", f'arm {arm!r} has server_kind = "generic": no acceptance', fix)
    if engine.metrics_url is not None or engine.server_kind == "llamacpp":
        return None
    if engine.server_kind == "tgi":
        return Unprovided("drift", f"arm {arm!r} is TGI without metrics_url: no acceptance", fix)
    return Unprovided(
        "drift",
        f"arm {arm!r} ({engine.server_kind}) has no metrics_url: acceptance only if the server "
        "reports it per request",
        "run vLLM 0.32 or later with --per-request-spec-decode-metrics summary (SGLang: its "
        f"native API), or set metrics_url; {WARN_INSTEAD.format(gate='drift')}",
        certain=False,
    )


def unprovided(settings: Settings) -> list[Unprovided]:
    """The enforce gates of the switch's arm that the configured servers cannot (or may
    not) give their input, in registry order."""
    config = settings.gates
    arm = settings.switch_arm
    found: list[Unprovided] = []
    telemetry = settings.telemetry
    covered = telemetry.enabled and _enforced(config, "telemetry.acceptance")
    if _enforced(config, "drift") and not covered:
        drift = _drift(settings, arm)
        if drift is not None:
            found.append(drift)
    if not telemetry.enabled:
        return found
    missing = [name for name in (BASELINE_ARM, arm) if name not in telemetry.arms]
    for gate in TELEMETRY_GATES:
        if not _enforced(config, gate):
            continue
        if missing:
            found.append(
                Unprovided(
                    gate,
                    f"[telemetry] has no source for {', '.join(missing)}: it compares both arms",
                    f"add [telemetry.arms.{missing[0]}]; {WARN_INSTEAD.format(gate=gate)}",
                )
            )
        elif gate == "telemetry.acceptance" and telemetry.arms[arm].kind == "gateway":
            found.append(
                Unprovided(
                    gate,
                    f"arm {arm!r}'s telemetry is a gateway's, which counts no drafts",
                    f"point [telemetry.arms.{arm}] at the engine (kind = vllm or sglang); "
                    + WARN_INSTEAD.format(gate=gate),
                )
            )
    return found


def log_unprovided(settings: Settings) -> list[Unprovided]:
    """Log each of `unprovided(settings)` once (a warning when certain), and return them."""
    found = unprovided(settings)
    for gate in found:
        (log.warning if gate.certain else log.info)(
            "gates.input_unavailable",
            gate=gate.gate,
            arm=settings.switch_arm,
            reason=gate.reason,
            configure=gate.fix,
            effect="an enforce gate that cannot decide holds every PASS (INCONCLUSIVE)"
            if gate.certain
            else "if the server does not, this enforce gate holds every PASS (INCONCLUSIVE)",
        )
    return found
