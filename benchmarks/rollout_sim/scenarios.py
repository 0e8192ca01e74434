"""The scenarios a rollout is played under, and what each should end in.

Each names the speculative arm's faults (the baseline is always healthy), whether host
stalls hit the pairs, whether the kill switch is pulled mid-rollout, and the outcome the
issue asks for: a healthy canary promoted within the template's `count`, a 5 % fault
rolled back within 15 minutes and never past 10 % weight in Flagger, the kill switch
ending the rollout within 2 minutes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from benchmarks.rollout_sim.arms import ArmBehaviour

Tool = Literal["argo", "flagger"]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    other_text_share: float = 0.0
    error_share: float = 0.0
    stall_share: float = 0.0  # share of pairs a host stall slows on one arm
    kill_switch: bool = False
    healthy: bool = True  # expected: promoted (True) or rolled back (False)
    within_minutes: float = 45.0  # ... within this many tool minutes (of the first POST or
    # pre-rollout; the kill switch: of the kill)
    max_flagger_weight: int | None = None  # a faulty canary must never pass this weight

    def arms(self, baseline_ms: float, speculative_ms: float) -> tuple[ArmBehaviour, ArmBehaviour]:
        baseline = ArmBehaviour(token_delay_s=baseline_ms / 1000.0)
        speculative = ArmBehaviour(
            token_delay_s=speculative_ms / 1000.0,
            speculative=True,
            other_text_share=self.other_text_share,
            error_share=self.error_share,
        )
        return baseline, speculative

    def expected(self, tool: Tool) -> str:
        if self.kill_switch:
            outcome = "Failed" if tool == "argo" else "rolled back"
            return f"{outcome} within {self.within_minutes:g} min of the kill switch"
        if self.healthy:
            outcome = "Successful" if tool == "argo" else "promoted"
            return f"{outcome} within {self.within_minutes:g} min, never rolled back"
        outcome = "Failed" if tool == "argo" else "rolled back"
        limit = (
            f", weight never past {self.max_flagger_weight} %"
            if tool == "flagger" and self.max_flagger_weight is not None
            else ""
        )
        return f"{outcome} within {self.within_minutes:g} min{limit}"


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("healthy", "identical text, no stalls"),
        Scenario(
            "healthy-stalls",
            "identical text; 2 % of pairs stalled 3-20x on one arm, "
            "in the clusters a burst's concurrent pairs share",
            stall_share=0.02,
        ),
        Scenario(
            "other-text-5pct",
            "5 % of speculative answers part from the baseline's",
            other_text_share=0.05,
            healthy=False,
            within_minutes=15.0,
            max_flagger_weight=10,
        ),
        Scenario(
            "http500-5pct",
            "5 % of speculative requests (pairs and production telemetry) answer HTTP 500",
            error_share=0.05,
            healthy=False,
            within_minutes=15.0,
            max_flagger_weight=10,
        ),
        Scenario(
            "other-text-100pct",
            "every speculative answer parts from the baseline's",
            other_text_share=1.0,
            healthy=False,
            within_minutes=15.0,
            max_flagger_weight=10,
        ),
        Scenario(
            "kill-switch",
            "healthy arms; `canaryd switch rollback` mid-rollout",
            kill_switch=True,
            healthy=False,
            within_minutes=2.0,
        ),
    )
}
