"""The default schedule: `default_schedule` runs a healthy daemon at the shipped pair and
gate intervals from an empty store, pinning references and judging every window through
the product's judging path and switch policy, and reports the hours until every enforce
gate first PASSes (capped), when each gate first passed, and any trip on the way."""

from __future__ import annotations

from typing import Any

from benchmarks.gate_power.noise import NoiseModel
from benchmarks.gate_power.streams import PairStream
from canaryd.config import ScheduleConfig
from gates import (
    Evaluation,
    GateDecision,
    GatesConfig,
    GateState,
    ReferenceStats,
    SwitchState,
    step,
)
from gates.cycle import evaluate_all, latest_window, pins
from gates.records import PairRecord
from gates.switch.policy import all_enforced_pass


def default_schedule(
    model: NoiseModel, *, seed: int, config: GatesConfig, cap_hours: float
) -> dict[str, Any]:
    """Hours from an empty store to the first evaluation with every enforce gate PASS."""
    schedule = ScheduleConfig()
    spacing = schedule.pair_interval_s
    per_gate = max(1, round(schedule.gate_interval_s / spacing))
    stream = PairStream(model, seed, spacing_s=spacing)
    records: list[PairRecord] = []
    references: dict[str, ReferenceStats] = {}
    state = SwitchState()
    history: list[Evaluation] = []
    trips: list[str] = []
    last: tuple[GateDecision, ...] = ()
    first_pass: dict[str, float] = {}
    passes: dict[str, int] = {}
    since_first: dict[str, int] = {}
    evaluations = 0
    total = int(cap_hours * 3600 / spacing)
    while len(records) < total:
        records.extend(stream.take(per_gate))
        window = latest_window(records, config)
        now = window[-1].started_at
        references.update(pins(window, references, state, config, now))
        decisions = evaluate_all(window, config, now=now, references=references, since=state.since)
        evaluations += 1
        history.append(Evaluation(now, tuple(decisions)))
        outcome = step(state, history[-20:], config.policy, now=now)
        if outcome.state.mode is not state.mode:
            trips.append(f"{outcome.state.actor} at {len(records)} pairs")
        state = outcome.state
        last = tuple(decisions)
        hours = round(len(records) * spacing / 3600, 3)
        for decision in decisions:
            if decision.enforced and decision.state is GateState.PASS:
                first_pass.setdefault(decision.name, hours)
                passes[decision.name] = passes.get(decision.name, 0) + 1
            if decision.name in first_pass:
                since_first[decision.name] = since_first.get(decision.name, 0) + 1
        if all_enforced_pass(decisions):
            break
    passed = all_enforced_pass(last)
    return {
        "hours_to_all_pass": round(len(records) * spacing / 3600, 3) if passed else None,
        "pairs": len(records),
        "evaluations": evaluations,
        "pair_interval_s": spacing,
        "cap_hours": cap_hours,
        "model": model.name,
        "first_pass_hours_by_gate": first_pass,
        "pass_share_since_first_pass": {
            name: round(passes[name] / since_first[name], 3) for name in first_pass
        },
        "trips": trips,
        "not_passing_at_end": {
            d.name: d.state.value for d in last if d.enforced and d.state is not GateState.PASS
        },
    }
