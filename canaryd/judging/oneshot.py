"""The one-shot pre-deploy judge behind `canaryd judge`: pairs of the baseline and a
candidate, one after another, each time judging every pair so far, until the enforce
gates decide or the budget (pairs, minutes) runs out.

`judge_candidate` opens the store, loads the arms, stores every pair as a run of kind
`judge`, and gathers the evidence of each step with the one reader
(`canaryd.judging.reader.gather`) from what it holds in memory: the pairs it ran, the
drift references this database held at its start, and, with `[telemetry]`, both arms'
production telemetry scraped from the start of the run (`canaryd.telemetry.recorder`,
kept in memory, not stored). Drift, which watches one arm against its own pinned past,
is judged only where the database holds references for these arms (else it runs in
`dry_run`: it would stay NODATA for ever). The command (`canaryd.cli.judge`) parses the
options, shows the progress and prints the `JudgeOutcome`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime

from canaryd.config import Settings
from canaryd.config.arms import arm_key
from canaryd.judging.reader import Held, gather
from canaryd.pairs.plan import configured_suites, new_run, pair_runner, suite_sampler
from canaryd.scoring import load_metrics
from canaryd.store import SqlStore
from canaryd.store.text import storable
from canaryd.telemetry.recorder import TelemetryRecorder
from engine.base import Engine
from gates import GateDecision, GateMode
from gates.config import GatesConfig
from gates.cycle import Judgement, Verdict, judge
from gates.records import PairRecord

__all__ = ["JudgeOutcome", "Progress", "judge_candidate"]

# What shows the progress: entered around the pairs with the pair budget (None: only
# minutes), it gives what to call with the verdict after each pair.
Progress = Callable[[int | None], AbstractContextManager[Callable[[Verdict], None]]]


def _no_progress(budget: int | None) -> AbstractContextManager[Callable[[Verdict], None]]:
    return nullcontext(lambda verdict: None)


@dataclass(frozen=True, slots=True)
class JudgeOutcome:
    """One judge run: its verdict and why, on how many pairs, the decisions behind it,
    whether drift was judged, how long it took (store and engines closed) and after how
    long it decided (None: not within the budget)."""

    run_id: str
    verdict: Verdict
    reason: str
    pairs: int
    decisions: tuple[GateDecision, ...]
    drift_judged: bool
    elapsed_s: float
    decided_after_s: float | None


def _gates(settings: Settings, drift_judged: bool) -> GatesConfig:
    """The gates config to judge with: drift in `dry_run` when nothing to drift from."""
    gates = settings.gates
    if drift_judged:
        return gates
    drift = gates.drift.model_copy(update={"mode": GateMode.DRY_RUN})
    return gates.model_copy(update={"drift": drift})


def _judge_now(
    store: SqlStore, settings: Settings, gates: GatesConfig, held: Held, subject: str
) -> Judgement:
    """The pairs and telemetry held so far, judged now."""
    now = datetime.now(UTC)
    evidence = gather(
        store, settings, settings.switch_arm, now, config=gates, held=held, subject=subject
    )
    return judge(evidence, gates, now)


def judge_candidate(
    settings: Settings,
    *,
    pairs: int | None,
    minutes: float,
    load_engines: Callable[[Settings], dict[str, Engine]],
    telemetry_origin: str = "[telemetry]",
    progress: Progress = _no_progress,
) -> JudgeOutcome:
    """Run pairs of the baseline and `settings.switch_arm` until the enforce gates decide,
    `pairs` pairs ran (None: no pair limit) or `minutes` passed (the pair running then
    finishes). `load_engines` builds and loads the arms; `telemetry_origin` names where
    `[telemetry]` came from in the recorder's errors."""
    suites = configured_suites(settings)
    sampler = suite_sampler(settings, None, suites)
    arm = settings.switch_arm
    store = SqlStore.open(settings.storage.resolved_url(), create=True)
    engines: dict[str, Engine] = {}
    recorder: TelemetryRecorder | None = None
    try:
        references = store.drift_references(arm_key(settings, arm))
        gates = _gates(settings, bool(references))
        load_metrics()  # scoring's imports, before the clock of the time to a decision
        engines = load_engines(settings)
        if settings.telemetry.enabled:
            recorder = TelemetryRecorder(settings.telemetry, telemetry_origin)
            recorder.start()
        budget_config = {"judge": {"pairs": pairs, "max_minutes": minutes}}
        run = new_run(settings, "judge", engines, extra_config=budget_config)
        store.create_run(run)
        runner = pair_runner(settings, engines, run.run_id)
        started = time.monotonic()
        deadline = started + 60 * minutes
        records: list[PairRecord] = []
        decisions: tuple[GateDecision, ...] = ()
        verdict: Verdict = "NODATA"
        reason = "no pair was run"
        decided_after_s: float | None = None
        with progress(pairs) as advance:
            while (pairs is None or len(records) < pairs) and time.monotonic() < deadline:
                group = runner.run_group(sampler.next())
                for record in group.records:
                    store.save_pair(storable(record)[0])
                records.append(group.record(arm))
                telemetry = recorder.evidence(arm) if recorder is not None else None
                held = Held(tuple(records), references, telemetry)
                judged = _judge_now(store, settings, gates, held, f"judge run {run.run_id}")
                decisions, verdict, reason = judged.decisions, judged.verdict, judged.reason
                advance(verdict)
                if verdict in ("PASS", "FAIL"):
                    decided_after_s = time.monotonic() - started
                    break
        store.finish_run(run.run_id, datetime.now(UTC))
    finally:
        if recorder is not None:
            recorder.close()
        for engine in engines.values():
            engine.close()
        store.close()
    return JudgeOutcome(
        run_id=run.run_id,
        verdict=verdict,
        reason=reason,
        pairs=len(records),
        decisions=decisions,
        drift_judged=bool(references),
        elapsed_s=time.monotonic() - started,
        decided_after_s=decided_after_s,
    )
