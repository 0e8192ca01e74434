"""The switch policy: a pure state machine from gate evaluations and human commands to
the rollback switch's state.

Two modes, as production reads them: `auto` (speculative decoding on, gates decide) and
`rolled_back` (speculative off). `control` says who holds the switch: `gates`, or
`manual` after a human's rollback (gates never undo it; `auto` hands control back).
Rules, applied by `step` — human events first, in order, then the gates:
- trip: an enforce gate FAILs in `trip_k` of the last `trip_m` evaluations that saw new
  pairs since the last transition, or once if it is critical. warn and dry_run gates
  never trip. The gates' FAIL is already a sequential alarm with a false-alarm budget,
  so the default is 1 of 1: the first alarm trips.
- cooldown: no automatic restore until `cooldown_seconds` after a trip.
- latch: `latch_trips` automatic trips within `latch_window_seconds` latch the switch;
  then only a human can restore.
- restore: needs fresh PASS evidence — every enforce gate PASS (NODATA, INCONCLUSIVE and
  WARN never count) in the latest evaluation, at most `evidence_max_age_seconds` old.
  A human restore needs one such evaluation (or `force`, recorded as such); an automatic
  restore (only with `auto_restore`) needs `restore_passes` consecutive ones since the trip.
Per category: `categories` holds a switch per traffic category that has ever been moved
on its own (a category without one follows the top level). The top level is the master:
rolled back means off for every category. A human command naming a category moves only
that category; its restore needs fresh PASS evidence for that category (every enforce
gate's check of it — a component whose `category` names it — PASSed; at least one) or
`force`. Under `scope = "category"` a per-category gate (one component per category:
drift always, speedup and quality under that scope) that FAILs rolls back only the
categories whose components FAILed, with the same k-of-m rule counted on those
components since the category last moved; every other gate (liveness, errors, latency)
still trips the top level. Each category has its own cooldown and latch (its own trips
within the latch window) and, with `auto_restore`, restores after `restore_passes`
consecutive evaluations since its trip in which every enforce check of it PASSed, while
the top level is on under the gates. A top-level restore leaves out the per-category
checks of categories that are off on their own: they do not ride on the top level, so
they cannot hold it back. Every category change also bumps the top-level
`generation`, which orders the state file.
Only evaluations after the last transition count, so old failures never re-trip a
restored switch and old passes never restore a tripped one. Every change is a
`Transition` and bumps `generation`, which never decreases; the generation, not a time,
orders transitions. Times are only as good as the clock: a `since` ahead of `now` (the
clock went back after a transition) is pulled back to `now`, and so are a cooldown and
trips ahead of it, so the policy is blind for one evaluation at most, never until the
clock catches up.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from gates.core import (
    GateDecision,
    GateState,
    category_decisions,
    category_passed,
    judged_state,
    per_category,
)
from gates.switch.config import SwitchPolicyConfig


class SwitchMode(enum.StrEnum):
    AUTO = "auto"
    ROLLED_BACK = "rolled_back"


class Control(enum.StrEnum):
    GATES = "gates"
    MANUAL = "manual"


@dataclass(frozen=True, slots=True)
class CategorySwitch:
    """One traffic category's own switch, under the top level's, with its own latch,
    cooldown and automatic trips (the top level's rules, counted for this category)."""

    mode: SwitchMode = SwitchMode.AUTO
    control: Control = Control.GATES
    generation: int = 0  # the top-level generation of its last transition
    since: datetime | None = None
    actor: str = ""
    reason: str = ""
    latched: bool = False
    cooldown_until: datetime | None = None
    recent_trips: tuple[datetime, ...] = ()

    @property
    def speculative_enabled(self) -> bool:
        return self.mode is SwitchMode.AUTO


@dataclass(frozen=True, slots=True)
class SwitchState:
    mode: SwitchMode = SwitchMode.AUTO
    control: Control = Control.GATES
    generation: int = 0
    since: datetime | None = None  # time of the last transition
    actor: str = ""
    reason: str = "initial state"
    latched: bool = False
    cooldown_until: datetime | None = None
    recent_trips: tuple[datetime, ...] = ()  # automatic trips within the latch window
    categories: tuple[tuple[str, CategorySwitch], ...] = ()  # sorted by category

    @property
    def speculative_enabled(self) -> bool:
        return self.mode is SwitchMode.AUTO

    def category(self, name: str) -> CategorySwitch | None:
        return dict(self.categories).get(name)

    def enabled_for(self, category: str) -> bool:
        """Whether speculation is on for `category`: the master's and its own switch."""
        own = self.category(category)
        return self.speculative_enabled and (own is None or own.speculative_enabled)

    def with_category(self, name: str, switch: CategorySwitch) -> SwitchState:
        merged = {**dict(self.categories), name: switch}
        return replace(self, categories=tuple(sorted(merged.items())))

    def categories_off(self) -> frozenset[str]:
        """The categories whose own switch is rolled back."""
        return frozenset(name for name, own in self.categories if not own.speculative_enabled)

    def category_since(self) -> dict[str, datetime]:
        """When each category last moved on its own: its evidence starts there, so that a
        restored category is not judged again on the pairs that tripped it."""
        return {name: own.since for name, own in self.categories if own.since is not None}


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One run of all gates: when, and what each decided."""

    at: datetime
    decisions: tuple[GateDecision, ...]


@dataclass(frozen=True, slots=True)
class SwitchEvent:
    """A human command. `force` lets a restore through without fresh PASS evidence."""

    action: Literal["rollback", "restore", "auto"]
    user: str
    reason: str
    force: bool = False
    category: str | None = None  # None: the top level


@dataclass(frozen=True, slots=True)
class Transition:
    at: datetime
    generation: int
    previous: SwitchMode
    target: SwitchMode
    control: Control
    actor: str  # "gate:<name>" or "user:<name>"
    reason: str
    evidence: tuple[GateDecision, ...] = ()
    category: str | None = None  # None: the top level moved


@dataclass(frozen=True, slots=True)
class SwitchOutcome:
    state: SwitchState
    transitions: tuple[Transition, ...] = ()
    refused: tuple[str, ...] = ()  # human commands not carried out, with why


@dataclass(frozen=True, slots=True)
class _Latch:
    """A category's latch, cooldown and automatic trips, as a move sets them (the
    default clears them: a restore)."""

    latched: bool = False
    cooldown_until: datetime | None = None
    recent_trips: tuple[datetime, ...] = ()


def _newest_pair(evaluation: Evaluation) -> datetime | None:
    return max((d.window_end for d in evaluation.decisions if d.window_end), default=None)


def _with_new_data(evaluations: Sequence[Evaluation]) -> list[Evaluation]:
    """The evaluations that saw a pair newer than every earlier one: k-of-m counts new
    evidence, not the same window judged again a minute later. An evaluation that names
    no window (no decision read any pair) is kept: it cannot be shown to repeat one."""
    kept: list[Evaluation] = []
    newest: datetime | None = None
    for evaluation in evaluations:
        end = _newest_pair(evaluation)
        if end is not None and newest is not None and end <= newest:
            continue
        kept.append(evaluation)
        if end is not None:
            newest = end
    return kept


def all_enforced_pass(decisions: Sequence[GateDecision], off: Collection[str] = ()) -> bool:
    """True when there is at least one enforce gate and every enforce gate PASSed (a
    per-category gate: its checks of the categories not in `off`)."""
    enforced = [d for d in decisions if d.enforced]
    return bool(enforced) and all(judged_state(d, off) is GateState.PASS for d in enforced)


class _Machine:
    def __init__(self, state: SwitchState, policy: SwitchPolicyConfig, now: datetime) -> None:
        self.state = state
        self.policy = policy
        self.now = now
        self.transitions: list[Transition] = []
        self.refused: list[str] = []

    def move(
        self,
        mode: SwitchMode,
        control: Control,
        actor: str,
        reason: str,
        evidence: Sequence[GateDecision] = (),
    ) -> None:
        previous = self.state.mode
        self.state = replace(
            self.state,
            mode=mode,
            control=control,
            generation=self.state.generation + 1,
            since=self.now,
            actor=actor,
            reason=reason,
        )
        self.transitions.append(
            Transition(
                at=self.now,
                generation=self.state.generation,
                previous=previous,
                target=mode,
                control=control,
                actor=actor,
                reason=reason,
                evidence=tuple(evidence),
            )
        )

    def repair_clock(self) -> None:
        """Pull times the clock has gone back behind to `now` (no transition: the state
        is the same, its times are re-based on the clock the evidence is stamped with)."""
        state, now = self.state, self.now
        cooldown = timedelta(seconds=self.policy.cooldown_seconds)
        since = now if state.since is not None and state.since > now else state.since
        until = state.cooldown_until
        if until is not None and until - now > cooldown:
            until = now + cooldown
        trips = tuple(min(t, now) for t in state.recent_trips)
        categories = tuple((name, self.repaired(own)) for name, own in state.categories)
        self.state = replace(
            state, since=since, cooldown_until=until, recent_trips=trips, categories=categories
        )

    def repaired(self, own: CategorySwitch) -> CategorySwitch:
        """A category's times re-based on `now` as `repair_clock` does the top level's."""
        now, cooldown = self.now, timedelta(seconds=self.policy.cooldown_seconds)
        until = own.cooldown_until
        if until is not None and until - now > cooldown:
            until = now + cooldown
        since = now if own.since is not None and own.since > now else own.since
        trips = tuple(min(t, now) for t in own.recent_trips)
        return replace(own, since=since, cooldown_until=until, recent_trips=trips)

    def counted(
        self, history: Sequence[Evaluation], since: datetime | None = None
    ) -> list[Evaluation]:
        """The evaluations up to now after `since` (the top level's last transition when
        not given), oldest first."""
        since = since if since is not None else self.state.since
        return sorted(
            (e for e in history if e.at <= self.now and (since is None or e.at > since)),
            key=lambda e: e.at,
        )

    def fresh(self, evaluation: Evaluation) -> bool:
        age = self.now - evaluation.at
        return age <= timedelta(seconds=self.policy.evidence_max_age_seconds)

    def move_category(
        self,
        name: str,
        mode: SwitchMode,
        control: Control,
        actor: str,
        reason: str,
        evidence: Sequence[GateDecision] = (),
        latch: _Latch | None = None,
    ) -> None:
        """Move category `name`; `latch` replaces its latch, cooldown and trips (None
        keeps them)."""
        previous = self.state.category(name) or CategorySwitch()
        generation = self.state.generation + 1
        own = replace(
            previous,
            mode=mode,
            control=control,
            generation=generation,
            since=self.now,
            actor=actor,
            reason=reason,
        )
        if latch is not None:
            own = replace(
                own,
                latched=latch.latched,
                cooldown_until=latch.cooldown_until,
                recent_trips=latch.recent_trips,
            )
        self.state = replace(self.state.with_category(name, own), generation=generation)
        self.transitions.append(
            Transition(
                at=self.now,
                generation=generation,
                previous=previous.mode,
                target=mode,
                control=control,
                actor=actor,
                reason=reason,
                evidence=tuple(evidence),
                category=name,
            )
        )

    def human_category(
        self, name: str, event: SwitchEvent, actor: str, history: Sequence[Evaluation]
    ) -> None:
        own = self.state.category(name) or CategorySwitch()
        if event.action == "rollback":
            if own.mode is SwitchMode.ROLLED_BACK and own.control is Control.MANUAL:
                return
            self.move_category(name, SwitchMode.ROLLED_BACK, Control.MANUAL, actor, event.reason)
        elif event.action == "auto":
            if own.control is Control.MANUAL:
                self.move_category(name, own.mode, Control.GATES, actor, event.reason)
        elif own.mode is SwitchMode.ROLLED_BACK:
            latest = max((e for e in history if e.at <= self.now), key=lambda e: e.at, default=None)
            evidence = category_decisions(latest.decisions, name) if latest is not None else []
            ok = (
                latest is not None
                and self.fresh(latest)
                and bool(evidence)
                and all(d.state is GateState.PASS for d in evidence)
            )
            if not ok and not event.force:
                why = (
                    "no gate evaluation"
                    if latest is None
                    else "the latest evaluation is older than "
                    f"{self.policy.evidence_max_age_seconds:g}s"
                    if not self.fresh(latest)
                    else f"no enforce gate judged category {name!r}"
                    if not evidence
                    else f"not every enforce check of category {name!r} PASSed: "
                    + ", ".join(f"{d.name}={d.state.value}" for d in evidence)
                )
                self.refused.append(
                    f"restore of category {name!r} by {actor} refused: {why} "
                    "(use force to override)"
                )
                return
            reason = event.reason if ok else f"FORCED without passing evidence: {event.reason}"
            self.move_category(
                name,
                SwitchMode.AUTO,
                Control.GATES,
                actor,
                reason,
                evidence,
                _Latch(),
            )

    def human(self, event: SwitchEvent, history: Sequence[Evaluation]) -> None:
        actor = f"user:{event.user}"
        if event.category is not None:
            self.human_category(event.category, event, actor, history)
            return
        state = self.state
        if event.action == "rollback":
            if state.mode is SwitchMode.ROLLED_BACK and state.control is Control.MANUAL:
                return
            self.move(SwitchMode.ROLLED_BACK, Control.MANUAL, actor, event.reason)
        elif event.action == "auto":
            if state.control is Control.MANUAL:
                self.move(state.mode, Control.GATES, actor, event.reason)
        else:
            self.restore(event, actor, history)

    def restore(self, event: SwitchEvent, actor: str, history: Sequence[Evaluation]) -> None:
        state = self.state
        if state.mode is SwitchMode.AUTO and not state.latched:
            return
        latest = max((e for e in history if e.at <= self.now), key=lambda e: e.at, default=None)
        evidence = latest.decisions if latest is not None else ()
        off = state.categories_off()
        ok = latest is not None and self.fresh(latest) and all_enforced_pass(latest.decisions, off)
        if not ok and not event.force:
            left_out = f" (categories rolled back on their own left out: {', '.join(sorted(off))})"
            why = (
                "no gate evaluation"
                if latest is None
                else "the latest evaluation is older than "
                f"{self.policy.evidence_max_age_seconds:g}s"
                if not self.fresh(latest)
                else "not every enforce gate PASSed: "
                + ", ".join(
                    f"{d.name}={judged_state(d, off).value}" for d in latest.decisions if d.enforced
                )
                + (left_out if off else "")
            )
            self.refused.append(f"restore by {actor} refused: {why} (use force to override)")
            return
        reason = event.reason if ok else f"FORCED without passing evidence: {event.reason}"
        self.state = replace(state, latched=False, cooldown_until=None, recent_trips=())
        self.move(SwitchMode.AUTO, Control.GATES, actor, reason, evidence)

    def gates(self, history: Sequence[Evaluation]) -> None:
        if self.state.control is not Control.GATES:
            return
        counted = self.counted(history)
        if not counted:
            return
        if self.state.mode is SwitchMode.AUTO:
            self.maybe_trip(counted)
            if self.state.mode is SwitchMode.AUTO:
                self.maybe_restore_categories(history)
        else:
            self.maybe_restore(counted)

    def maybe_trip(self, counted: list[Evaluation]) -> None:
        policy = self.policy
        fresh = _with_new_data(counted)
        if not fresh:
            return
        recent = fresh[-policy.trip_m :]
        latest = recent[-1]
        tripped: list[tuple[str, str, GateDecision]] = []
        for current in latest.decisions:
            if not current.enforced:
                continue
            if policy.scope == "category" and per_category(current):
                self.trip_categories(current, fresh)
                continue
            failures = [
                d
                for e in recent
                for d in e.decisions
                if d.name == current.name and d.enforced and d.state is GateState.FAIL
            ]
            if current.critical and current.state is GateState.FAIL:
                tripped.append((current.name, "critical gate FAILed", current))
            elif len(failures) >= policy.trip_k:
                why = f"FAILed in {len(failures)} of the last {len(recent)} evaluations"
                tripped.append((current.name, why, failures[-1]))
        if not tripped:
            return
        trips = self.trips(self.state.recent_trips)
        latched = len(trips) >= policy.latch_trips
        reason = "; ".join(f"{name} {why}: {d.detail}" for name, why, d in tripped)
        if latched:
            reason += f"; LATCHED after {len(trips)} automatic trips (only a human can restore)"
        cooldown_until = self.now + timedelta(seconds=policy.cooldown_seconds)
        self.state = replace(
            self.state, latched=latched, cooldown_until=cooldown_until, recent_trips=trips
        )
        self.move(
            SwitchMode.ROLLED_BACK,
            Control.GATES,
            f"gate:{tripped[0][0]}",
            reason,
            [d for _, _, d in tripped],
        )

    def trips(self, earlier: tuple[datetime, ...]) -> tuple[datetime, ...]:
        """The automatic trips within the latch window, this one (now) included."""
        horizon = timedelta(seconds=self.policy.latch_window_seconds)
        return (*(t for t in earlier if self.now - t < horizon), self.now)

    def trip_categories(self, current: GateDecision, fresh: list[Evaluation]) -> None:
        """Roll back each category whose component of `current` FAILed in trip_k of the
        last trip_m evaluations since that category last moved."""
        for component in current.components:
            name = component.category
            if name is None:
                continue
            own = self.state.category(name) or CategorySwitch()
            if own.mode is SwitchMode.ROLLED_BACK or own.control is not Control.GATES:
                continue
            since = own.since
            recent = [e for e in fresh if since is None or e.at > since][-self.policy.trip_m :]
            failures = [
                c
                for e in recent
                for d in e.decisions
                if d.name == current.name and d.enforced
                for c in d.components
                if c.category == name and c.state is GateState.FAIL
            ]
            if not failures:
                continue
            if current.critical and component.state is GateState.FAIL:
                why = "critical gate FAILed"
            elif len(failures) >= self.policy.trip_k:
                why = f"FAILed in {len(failures)} of the last {len(recent)} evaluations"
            else:
                continue
            trips = self.trips(own.recent_trips)
            latched = len(trips) >= self.policy.latch_trips
            reason = f"{component.name} {why}: {failures[-1].detail}"
            if latched:
                reason += (
                    f"; LATCHED after {len(trips)} automatic trips of category {name!r} "
                    "(only a human can restore)"
                )
            self.move_category(
                name,
                SwitchMode.ROLLED_BACK,
                Control.GATES,
                f"gate:{component.name}",
                reason,
                [failures[-1]],
                _Latch(
                    latched,
                    self.now + timedelta(seconds=self.policy.cooldown_seconds),
                    trips,
                ),
            )

    def maybe_restore_categories(self, history: Sequence[Evaluation]) -> None:
        """With `auto_restore`, turn back on each category the gates rolled back that is
        neither latched nor cooling down, after `restore_passes` consecutive evaluations
        since its trip in which every enforce check of it PASSed (the latest fresh)."""
        policy = self.policy
        if not policy.auto_restore:
            return
        for name, own in self.state.categories:
            if own.mode is not SwitchMode.ROLLED_BACK or own.control is not Control.GATES:
                continue
            if own.latched or (own.cooldown_until is not None and self.now < own.cooldown_until):
                continue
            recent = self.counted(history, own.since)[-policy.restore_passes :]
            if len(recent) < policy.restore_passes or not self.fresh(recent[-1]):
                continue
            if not all(category_passed(e.decisions, name) for e in recent):
                continue
            self.move_category(
                name,
                SwitchMode.AUTO,
                Control.GATES,
                "gate:all",
                f"every enforce check of category {name!r} PASSed in the last {len(recent)} "
                "evaluations (auto-restore)",
                category_decisions(recent[-1].decisions, name),
            )

    def maybe_restore(self, counted: list[Evaluation]) -> None:
        policy, state = self.policy, self.state
        if not policy.auto_restore or state.latched:
            return
        if state.cooldown_until is not None and self.now < state.cooldown_until:
            return
        recent = counted[-policy.restore_passes :]
        if len(recent) < policy.restore_passes or not self.fresh(recent[-1]):
            return
        off = state.categories_off()
        if not all(all_enforced_pass(e.decisions, off) for e in recent):
            return
        self.move(
            SwitchMode.AUTO,
            Control.GATES,
            "gate:all",
            f"every enforce gate PASSed in the last {len(recent)} evaluations (auto-restore)",
            recent[-1].decisions,
        )


def step(
    state: SwitchState,
    history: Sequence[Evaluation],
    policy: SwitchPolicyConfig,
    *,
    now: datetime,
    events: Sequence[SwitchEvent] = (),
) -> SwitchOutcome:
    """The switch's next state at `now`: human `events` first, then the gates' evidence."""
    machine = _Machine(state, policy, now)
    machine.repair_clock()
    for event in events:
        machine.human(event, history)
    machine.gates(history)
    return SwitchOutcome(machine.state, tuple(machine.transitions), tuple(machine.refused))
