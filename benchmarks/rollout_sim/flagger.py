"""Flagger's canary analysis of one revision, iteration by iteration, as its scheduler
runs it (pure: the webhook calls come from outside).

Read from fluxcd/flagger (Apache-2.0) at 15bd6ad: `pkg/controller/scheduler.go`
(`advanceCanary`, `runCanary`, `nextStepWeight`, `runPromotionTrafficShift`, `rollback`),
`scheduler_hooks.go` and `webhook.go`. One `tick` is one `analysis.interval` of the
canary's ticker, for a revision already detected (the tick that detects it and sets
`Progressing` runs no webhook and is not played):

1. While `Progressing` or `WaitingPromotion`: every `rollback` webhook, in order; the
   first 2xx (at most 202) rolls the canary back at once.
2. `Promoting` routes all traffic to the primary and goes to `Finalising`; `Finalising`
   goes to `Succeeded` (stepWeightPromotion unset, no further webhook).
3. `failedChecks >= threshold` rolls back.
4. While the canary weight is 0 and no iteration ran: the `pre-rollout` webhooks, else
   the `rollout` webhooks; the first that fails adds one failed check and ends the tick.
   Failed checks never go back down within a revision.
5. With a step weight: unless `WaitingPromotion`, the `confirm-traffic-increase` webhooks
   (a failure holds the weight, counts nothing); then below `maxWeight` the weight grows
   by `stepWeight`, else the `confirm-promotion` webhooks: a failure sets
   `WaitingPromotion`, a pass copies the spec (`Promoting`).

A webhook fails on a status above 202 or on no answer within its `timeout`; it is retried
`retries` times (go-retryablehttp: connection errors, 429 and 5xx but 501), 0 unless set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml  # type: ignore[import-untyped]  # the dev install has no stubs

from benchmarks.rollout_sim.durations import seconds

HookType = Literal[
    "confirm-rollout",
    "pre-rollout",
    "rollout",
    "confirm-traffic-increase",
    "confirm-promotion",
    "post-rollout",
    "rollback",
    "event",
]
CanaryPhase = Literal[
    "Progressing", "WaitingPromotion", "Promoting", "Finalising", "Succeeded", "Failed"
]
TOTAL_WEIGHT = 100
# What the shipped Canary's webhooks carry in `metadata.token` until the operator puts
# server.auth_token in (docs/kubernetes.md).
TOKEN_PLACEHOLDER = "<server.auth_token>"  # noqa: S105  # a placeholder, not a secret


@dataclass(frozen=True, slots=True)
class Webhook:
    name: str
    type: HookType
    url: str
    timeout_s: float
    retries: int
    metadata: dict[str, str]


@dataclass(frozen=True, slots=True)
class CanaryAnalysis:
    """A Canary's `spec.analysis` (the progressive, weighted strategy)."""

    name: str
    namespace: str
    interval_s: float
    threshold: int
    max_weight: int
    step_weight: int
    webhooks: tuple[Webhook, ...]

    def hooks(self, kind: HookType) -> tuple[Webhook, ...]:
        return tuple(w for w in self.webhooks if w.type == kind)


def load_canary(path: Path) -> CanaryAnalysis:
    """The Canary in `path` (Flagger's defaults where it sets nothing: a `rollout` webhook
    without a type, a 10 s timeout, maxWeight 100)."""
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    [canary] = [d for d in documents if d.get("kind") == "Canary"]
    analysis = canary["spec"]["analysis"]
    if analysis.get("stepWeights") or analysis.get("iterations") or analysis.get("match"):
        raise ValueError(f"{path}: only the stepWeight strategy is played")
    hooks = tuple(
        Webhook(
            name=w["name"],
            type=w.get("type") or "rollout",
            url=w["url"],
            timeout_s=seconds(w["timeout"]) if len(w.get("timeout", "")) >= 2 else 10.0,
            retries=int(w.get("retries", 0)),
            metadata={str(k): str(v) for k, v in (w.get("metadata") or {}).items()},
        )
        for w in analysis.get("webhooks", ())
    )
    return CanaryAnalysis(
        name=canary["metadata"]["name"],
        namespace=canary["metadata"].get("namespace", "default"),
        interval_s=seconds(analysis["interval"]),
        threshold=int(analysis.get("threshold", 0)),
        max_weight=int(analysis.get("maxWeight", TOTAL_WEIGHT)),
        step_weight=int(analysis.get("stepWeight", 0)),
        webhooks=hooks,
    )


@dataclass(frozen=True, slots=True)
class HookAnswer:
    """A webhook's answer: its status (None: no answer in time) and decoded body."""

    status: int | None
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """`callWebhook`'s test: an answer with a status of at most 202."""
        return self.status is not None and self.status <= 202


def retried(status: int | None) -> bool:
    """go-retryablehttp's DefaultRetryPolicy: no answer, 429, or 5xx other than 501."""
    return status is None or status == 429 or (status >= 500 and status != 501)


CallHook = Callable[[Webhook, CanaryPhase], HookAnswer]


@dataclass(slots=True)
class Event:
    tick: int
    hook: str
    status: int | None
    body: dict[str, Any]


@dataclass(slots=True)
class CanaryRun:
    """The canary's status (`CanaryStatus`) across ticks, and what each webhook said."""

    analysis: CanaryAnalysis
    phase: CanaryPhase = "Progressing"
    canary_weight: int = 0
    failed_checks: int = 0
    iterations: int = 0  # the weighted strategy never advances it
    max_weight_reached: int = 0
    ticks: int = 0
    decided_at_tick: int | None = None  # the tick that promoted or rolled back
    reason: str = ""
    events: list[Event] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def _call(self, call: CallHook, kind: HookType, phase: CanaryPhase) -> HookAnswer | None:
        """Every webhook of `kind` in order: the first failure (None when all pass)."""
        for hook in self.analysis.hooks(kind):
            answer = call(hook, phase)
            self.events.append(Event(self.ticks, kind, answer.status, answer.body))
            if not answer.ok:
                return answer
        return None

    def _rollback(self, reason: str) -> None:
        self.phase, self.canary_weight = "Failed", 0
        self.decided_at_tick = self.ticks
        self.reason = reason

    def tick(self, call: CallHook) -> None:
        """One iteration of `advanceCanary` for this canary."""
        if self.done:
            return
        self.ticks += 1
        if self.phase in ("Progressing", "WaitingPromotion"):
            for hook in self.analysis.hooks("rollback"):
                answer = call(hook, self.phase)
                self.events.append(Event(self.ticks, "rollback", answer.status, answer.body))
                if answer.ok:
                    self._rollback(f"rollback webhook {hook.name} answered {answer.status}")
                    return
        if self.phase == "Promoting":
            self.canary_weight = 0
            self.phase = "Finalising"
            return
        if self.phase == "Finalising":
            self.phase = "Succeeded"
            return
        if self.failed_checks >= self.analysis.threshold:
            self._rollback(f"failed checks threshold reached {self.failed_checks}")
            return
        first = self.canary_weight == 0 and self.iterations == 0
        refused = self._call(call, "pre-rollout" if first else "rollout", "Progressing")
        if refused is not None:
            self.failed_checks += 1
            return
        if self.analysis.step_weight <= 0:
            return
        if self.phase != "WaitingPromotion" and (
            self._call(call, "confirm-traffic-increase", "Progressing") is not None
        ):
            return
        if self.canary_weight < self.analysis.max_weight:
            self.canary_weight = min(self.canary_weight + self.analysis.step_weight, TOTAL_WEIGHT)
            self.max_weight_reached = max(self.max_weight_reached, self.canary_weight)
            return
        if self._call(call, "confirm-promotion", "Progressing") is not None:
            self.phase = "WaitingPromotion"
            return
        self.phase = "Promoting"
        self.decided_at_tick = self.ticks
        self.reason = "confirm-promotion passed: spec copied to the primary"
