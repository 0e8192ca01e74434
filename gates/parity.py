"""The parity gate: does the speculative arm still do everything the baseline does?

Its evidence is not a window of pairs but the latest capability probe (`canaryd probe`'s
checklist, run by the daemon every `schedule.probe_interval_s`) of the baseline and the
switch's arm as configured now; the daemon reads it and passes it in. FAIL when the
speculative arm regresses on a capability: the baseline passes it and the speculative arm
fails it or refuses it as unsupported. A capability the baseline lacks too is no
regression. PASS when there is none. Without evidence the gate is NODATA, never FAIL: no
probe yet, a probe older than its freshness bound, or a regression found before the
switch last moved (that transition answered it — the gate's own trip, or a human's
restore — so only a new probe may trip the switch again; a passing probe stays evidence
until it ages, since what a server supports does not depend on the traffic since).
`warn` by default: a capability a few requests use can be routed away per request
(the state file's `route_to_baseline`), which costs less than rolling everything back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from gates.config import ParityGateConfig
from gates.core import GateDecision, GateState

NAME = "parity"
# Room for one probe that fails or runs late: the default bound is two intervals plus this.
PROBE_AGE_MARGIN_S = 600.0
# The interval assumed when the daemon does not probe (schedule.probe_interval_s = 0) and
# the probes come from `canaryd probe --config`.
UNSCHEDULED_INTERVAL_S = 3600.0


@dataclass(frozen=True, slots=True)
class CapabilityParity:
    """One capability of the probe on both arms: `pass`, `fail` or `unsupported` each,
    and the speculative arm's reason."""

    name: str
    baseline: str
    speculative: str
    reason: str = ""

    @property
    def regressed(self) -> bool:
        """The baseline passes and the speculative arm does not."""
        return self.baseline == "pass" and self.speculative != "pass"


@dataclass(frozen=True, slots=True)
class ProbeEvidence:
    """The latest probe of the baseline and `arm`: its run, when it ran, each capability."""

    run_id: str
    arm: str
    started_at: datetime
    finished_at: datetime
    capabilities: tuple[CapabilityParity, ...]

    @property
    def regressions(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.capabilities if c.regressed)


def max_probe_age(config: ParityGateConfig, probe_interval_s: float) -> timedelta:
    """How old a probe may be and still count: `max_probe_age_seconds`, else two probe
    intervals plus `PROBE_AGE_MARGIN_S` (one missed probe is tolerated, two are not)."""
    if config.max_probe_age_seconds is not None:
        return timedelta(seconds=config.max_probe_age_seconds)
    interval = probe_interval_s if probe_interval_s > 0 else UNSCHEDULED_INTERVAL_S
    return timedelta(seconds=2 * interval + PROBE_AGE_MARGIN_S)


def parity_gate(
    probe: ProbeEvidence | None,
    config: ParityGateConfig,
    *,
    now: datetime,
    since: datetime | None = None,
    probe_interval_s: float = UNSCHEDULED_INTERVAL_S,
) -> GateDecision:
    """FAIL when the latest probe found the speculative arm regressing on a capability,
    PASS when it found none, NODATA without a probe that counts at `now` (`since`: the
    switch's last transition; `probe_interval_s`: the daemon's schedule)."""
    limit = max_probe_age(config, probe_interval_s)
    if probe is None:
        return _decision(
            config,
            now,
            GateState.NODATA,
            "no capability probe of the baseline and the switch's arm as configured now "
            "(schedule.probe_interval_s; both arms must be OpenAI-compatible servers)",
        )
    age = now - probe.finished_at
    regressions = probe.regressions
    if age > limit:
        return _decision(
            config,
            now,
            GateState.NODATA,
            f"the latest probe (run {probe.run_id}) finished {age.total_seconds():.0f} s "
            f"ago, over the {limit.total_seconds():g} s bound (max_probe_age_seconds)",
            probe,
        )
    if regressions and since is not None and probe.finished_at <= since:
        return _decision(
            config,
            now,
            GateState.NODATA,
            f"the latest probe (run {probe.run_id}) found regressions on "
            f"{', '.join(regressions)} before the switch last moved "
            f"({since.isoformat(timespec='seconds')}); the next probe decides",
            probe,
        )
    judged = [c for c in probe.capabilities if c.baseline == "pass"]
    if regressions:
        reasons = "; ".join(
            f"{c.name}: {c.speculative} ({c.reason})" for c in probe.capabilities if c.regressed
        )
        detail = (
            f"the {probe.arm} arm regresses on {len(regressions)} of {len(judged)} "
            f"capabilities the baseline passes (run {probe.run_id}): {reasons}"
        )
        return _decision(config, now, GateState.FAIL, detail, probe)
    lacking = [c.name for c in probe.capabilities if c.baseline != "pass"]
    detail = (
        f"the {probe.arm} arm passes all {len(judged)} capabilities the baseline passes "
        f"(run {probe.run_id})"
        + (f"; the baseline lacks {', '.join(lacking)} too: no regression" if lacking else "")
    )
    return _decision(config, now, GateState.PASS, detail, probe)


def _decision(
    config: ParityGateConfig,
    now: datetime,
    state: GateState,
    detail: str,
    probe: ProbeEvidence | None = None,
) -> GateDecision:
    """The decision, with one component per capability the probe judged (the baseline
    passes it): FAIL where the speculative arm regresses, PASS where it keeps it."""
    components: tuple[GateDecision, ...] = ()
    if probe is not None and state is not GateState.NODATA:
        components = tuple(
            GateDecision(
                name=f"{NAME}.{c.name}",
                state=GateState.FAIL if c.regressed else GateState.PASS,
                mode=config.mode,
                critical=config.critical,
                evaluated_at=now,
                statistic="baseline / speculative capability state",
                window_start=probe.started_at,
                window_end=probe.finished_at,
                detail=f"baseline {c.baseline}, {probe.arm} {c.speculative}: {c.reason}",
            )
            for c in probe.capabilities
            if c.baseline == "pass"
        )
    return GateDecision(
        name=NAME,
        state=state,
        mode=config.mode,
        critical=config.critical,
        evaluated_at=now,
        statistic="capabilities regressed",
        n_baseline=sum(1 for c in probe.capabilities if c.baseline == "pass") if probe else 0,
        n_speculative=len(probe.capabilities) if probe else 0,
        estimate=float(len(probe.regressions)) if probe else None,
        threshold=0.0,
        window_start=probe.started_at if probe else None,
        window_end=probe.finished_at if probe else None,
        detail=detail,
        components=components,
    )
