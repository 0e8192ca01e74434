"""The latest stored probe of the arms as configured now: what the parity gate judges and
what the state file's `route_to_baseline` says.

Probes are stored as runs of kind `probe` (the daemon's every `schedule.probe_interval_s`,
and `canaryd probe`'s on the same database). One counts only when it probed the switch's
arm with the baseline and that arm configured exactly as now: after a reload to another
draft model or another server, an older probe says nothing about the new arm.
"""

from __future__ import annotations

from canaryd.config import Settings
from canaryd.config.arms import arm_pair_config
from canaryd.parity.report import ProbeReport
from canaryd.store import HistoryStore, StoredRun
from gates.parity import CapabilityParity, ProbeEvidence

__all__ = ["PROBE_RUNS_READ", "latest_probe", "probe_evidence"]

# Probe runs read back, newest first, for one of the current arms: probes of other arms
# (a `canaryd probe` of other URLs on the same database) are rare between two of the
# daemon's own.
PROBE_RUNS_READ = 20


def probe_evidence(run: StoredRun) -> ProbeEvidence | None:
    """A finished probe run as the parity gate's evidence; None for a run that is not one,
    is not finished, or whose table cannot be read."""
    section = run.info.config.get("probe")
    if run.info.kind != "probe" or run.finished_at is None or not isinstance(section, dict):
        return None
    try:
        report = ProbeReport.from_dict(section)
    except (KeyError, TypeError, ValueError):
        return None
    return ProbeEvidence(
        run_id=run.info.run_id,
        arm=report.arm,
        started_at=run.info.started_at,
        finished_at=run.finished_at,
        capabilities=tuple(
            CapabilityParity(
                c.name,
                c.baseline.state,
                c.speculative.state,
                c.speculative.reason if c.baseline.state == "pass" else c.baseline.reason,
            )
            for c in report.capabilities
        ),
    )


def latest_probe(store: HistoryStore, settings: Settings) -> ProbeEvidence | None:
    """The newest finished probe of the baseline and the switch's arm as `settings`
    configure them; None when there is none among the last `PROBE_RUNS_READ` probes."""
    arm = settings.switch_arm
    current = arm_pair_config(settings.snapshot().get("arms"), arm)
    for run in store.runs(limit=PROBE_RUNS_READ, kind="probe"):
        evidence = probe_evidence(run)
        if evidence is None or evidence.arm != arm:
            continue
        if arm_pair_config(run.info.config.get("arms"), arm) != current:
            continue
        return evidence
    return None
