"""The switch series: what the gates decided and what the rollback switch did about it.

`SwitchMetrics` owns each gate's latest state and its evaluations (gate names capped at
16), each check's sequential-detector progress, the measured pair rate against the
budget's design rate, the switch as stored (top level and each
category's own), whether this daemon leads, the switch's transitions by target and
actor, and failed actuator attempts. Categories share the composition's bounded
`category` label.
"""

from __future__ import annotations

from collections.abc import Iterable

from canaryd.metrics.declare import Declarer
from canaryd.metrics.labels import (
    ACTOR_KINDS,
    ACTUATORS,
    CHECK_VALUE,
    GATE_STATES,
    OTHER,
    SWITCH_TARGETS,
    BoundedLabel,
)


class SwitchMetrics:
    """Gate, detector, switch, leader and actuator series; `category` bounds categories."""

    def __init__(self, declare: Declarer, *, category: BoundedLabel) -> None:
        self._category = category
        # Gate names are dotted where a family has several (`telemetry.errors`).
        self._gate_name = BoundedLabel(16, pattern=CHECK_VALUE)
        self._check_name = BoundedLabel(64, pattern=CHECK_VALUE)  # drift: one per category
        self.gate_state = declare.gauge(
            "canaryd_gate_state",
            "1 for each gate's state in its latest evaluation, 0 for its other states "
            "(PASS, WARN, FAIL, INCONCLUSIVE, NODATA).",
            ("gate", "state"),
            'canaryd_gate_state{state="FAIL"} == 1',
        )
        self.gate_evaluations = declare.counter(
            "canaryd_gate_evaluations_total",
            "Gate evaluations, by gate and the state it decided.",
            ("gate", "state"),
            'sum by (gate) (increase(canaryd_gate_evaluations_total{state="FAIL"}[1h]))',
        )
        self.detector_progress = declare.gauge(
            "canaryd_gate_detector_progress",
            "Each check's sequential detector in the latest evaluation: its CUSUM statistic "
            "over the threshold it FAILs at (1: FAIL; 0.5: WARN; 0: no evidence of a fault).",
            ("check",),
            "max by (check) (canaryd_gate_detector_progress) > 0.5",
        )
        self.pair_rate_ratio = declare.gauge(
            "canaryd_pair_rate_ratio",
            "Pairs a minute stored on the database over the last 24 h (every daemon's) over "
            "the false-alarm budget's design rate (60 / gates.budget.design_pair_interval_s), "
            "at the last gate run this daemon led; above 1 the gates judge re-budgeted for it.",
            (),
            "canaryd_pair_rate_ratio > 1",
        )
        self.rolled_back = declare.gauge(
            "canaryd_switch_rolled_back",
            "1 while the rollback switch has speculative decoding disabled, else 0.",
            (),
            "canaryd_switch_rolled_back == 1",
        )
        self.generation = declare.gauge(
            "canaryd_switch_generation",
            "The switch state's generation; it only grows, by one per transition.",
            (),
            "changes(canaryd_switch_generation[1h])",
        )
        self.latched = declare.gauge(
            "canaryd_switch_latched",
            "1 when repeated automatic trips latched the switch (only a human can restore).",
            (),
            "canaryd_switch_latched == 1",
        )
        self.category_rolled_back = declare.gauge(
            "canaryd_switch_category_rolled_back",
            "1 while a category's own switch has speculative decoding disabled for it, else "
            "0; only categories ever moved on their own (the top level still rules all).",
            ("category",),
            "max by (category) (canaryd_switch_category_rolled_back) == 1",
        )
        self.category_latched = declare.gauge(
            "canaryd_switch_category_latched",
            "1 when repeated automatic trips latched a category's own switch (only a human "
            "can restore it).",
            ("category",),
            "canaryd_switch_category_latched == 1",
        )
        self.leader = declare.gauge(
            "canaryd_leader",
            "1 while this daemon leads (runs the gates and writes the switch), else 0; "
            "of the daemons on one database, exactly one should read 1.",
            (),
            "sum(canaryd_leader) != 1",
        )
        self.transitions = declare.counter(
            "canaryd_switch_transitions_total",
            "Switch transitions, by target mode (auto, rolled_back) and who made them "
            "(gate, user).",
            ("target", "actor_kind"),
            'increase(canaryd_switch_transitions_total{target="rolled_back"}[1h])',
        )
        self.actuator_failures = declare.counter(
            "canaryd_actuator_failures_total",
            "Failed attempts to apply the switch state, by actuator (state_file, command, "
            "webhook, alertmanager); the state itself is kept and re-applied.",
            ("actuator",),
            "sum by (actuator) (increase(canaryd_actuator_failures_total[15m])) > 0",
        )
        for target in SWITCH_TARGETS:
            for actor_kind in ACTOR_KINDS:
                self.transitions.labels(target=target, actor_kind=actor_kind)
        for actuator in ACTUATORS:
            self.actuator_failures.labels(actuator=actuator)
        self.rolled_back.set(0)
        self.latched.set(0)
        self.leader.set(0)

    def observe_gates(self, decisions: Iterable[tuple[str, str]]) -> None:
        """One evaluation's `(gate name, state)` pairs: count each, and set the state
        gauges (1 for the decided state, 0 for the gate's other states)."""
        for name, state in decisions:
            gate = self._gate_name(name)
            self.gate_evaluations.labels(gate=gate, state=state).inc()
            for candidate in GATE_STATES:
                self.gate_state.labels(gate=gate, state=candidate).set(
                    1 if candidate == state else 0
                )

    def observe_detectors(self, readings: Iterable[tuple[str, float]]) -> None:
        """One evaluation's `(check name, detector progress)` pairs."""
        for name, progress in readings:
            self.detector_progress.labels(check=self._check_name(name)).set(progress)

    def set_state(
        self,
        *,
        rolled_back: bool,
        generation: int,
        latched: bool,
        categories: Iterable[tuple[str, bool, bool]] = (),
    ) -> None:
        """The switch as stored now; `categories`: (category, rolled back, latched) of each
        category's own switch."""
        self.rolled_back.set(1 if rolled_back else 0)
        self.generation.set(generation)
        self.latched.set(1 if latched else 0)
        for category, category_rolled_back, category_latched in categories:
            label = self._category(category)
            self.category_rolled_back.labels(category=label).set(1 if category_rolled_back else 0)
            self.category_latched.labels(category=label).set(1 if category_latched else 0)

    def set_leader(self, leading: bool) -> None:
        """Whether this daemon leads the gates and the switch now."""
        self.leader.set(1 if leading else 0)

    def transition(self, target: str, actor_kind: str) -> None:
        """A transition to `target` (auto, rolled_back) by a `gate` or a `user`."""
        self.transitions.labels(target=target, actor_kind=actor_kind).inc()

    def actuator_failed(self, actuator: str) -> None:
        """One failed attempt of `actuator` (state_file, command, webhook, alertmanager)."""
        label = actuator if actuator in ACTUATORS else OTHER
        self.actuator_failures.labels(actuator=label).inc()
