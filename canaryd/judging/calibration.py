"""The tie margin calibrated on the deployment: measuring it, and when a stored one applies.

`calibrate` runs prompts greedy at their full `max_tokens` on the baseline twice (A/A:
the deployment's own numeric noise; the second run on the A/A control arm,
`gates.quality.control_arm`, when one is configured: a replica on other hardware shows the
noise between servers that one server run twice cannot) and on the baseline and the
speculative arm (A/B), judges every divergent token with the baseline as teacher
(canaryd.scoring.calibrate), and bounds the tail of the A/A pairs' margins
(`tail_bound`, one margin per divergent pair: the tokens of one pair cluster).

Only the A/A run sets the margin. The A/B run measures the arm under test, and an arm
with a verify bug would set the margin that excuses its own divergences (a kernel that
takes the runner-up of close calls spreads its margins up to the gap it takes it at, and
a bound on those margins calls all of them ties); it is reported for information. A
deployment whose baseline reproduces itself bit for bit has no numeric noise to bound:
fewer than `min_divergences()` divergent A/A pairs store nothing, and the configured
`gates.quality.tie_margin_nats` keeps judging.

`Calibration.stored` is the row kept under the arms' key, with the engines it was
measured on (`engines_key`: what the baseline and the arm said they are, and for an
in-process engine the torch and transformers versions). `not_applicable` says when a
stored margin no longer judges: older than `gates.quality.tie_margin_max_age_days`
(`expires_at`), other engines behind the pairs judged, or stored before the A/A-only
rule. A changed arm configuration has another arms key, under which nothing is stored.
Judging with it is the reader's (`canaryd.judging.reader.tie_margin_for`;
`gates.evidence.MarginSource` says which margin judged in the quality decision's detail).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from canaryd.config import Settings
from canaryd.config.arms import arm_key, arms_key
from canaryd.pairs.plan import software_versions
from canaryd.redact import redact_value
from canaryd.scoring.calibrate import (
    TAIL_CONFIDENCE,
    TAIL_COVERAGE,
    Measured,
    divergent_margins,
    min_divergences,
    tail_bound,
)
from canaryd.store.abc import TieMargin
from engine.base import Engine
from engine.types import GenerationRequest, GenerationResult, SamplingParams
from gates.records import BASELINE_ARM, Prompt, RunInfo

__all__ = [
    "Calibration",
    "RunDivergences",
    "aa_arm",
    "calibrate",
    "engines_key",
    "expires_at",
    "not_applicable",
    "run_engines_key",
]

# The libraries whose versions move an in-process engine's numerics (kernels, reductions).
IN_PROCESS_SOFTWARE = ("torch", "transformers")
IN_PROCESS_KINDS = frozenset({"transformers"})


@dataclass(frozen=True, slots=True)
class RunDivergences:
    """One run's greedy outputs against the first baseline output: the `arm` it ran on,
    the pairs compared, one margin per divergent pair with a measured margin (its
    largest, as the quality gate judges it), every divergent token's margin (for
    information), and the divergent pairs nothing measured."""

    arm: str
    pairs: int = 0
    pair_margins: tuple[float, ...] = ()
    token_margins: tuple[float, ...] = ()
    unmeasured: int = 0

    @classmethod
    def of(cls, arm: str, measured: Iterable[Measured]) -> RunDivergences:
        """The tally of one `Measured` per pair compared (outputs that agree included)."""
        pairs = unmeasured = 0
        pair_margins: list[float] = []
        tokens: list[float] = []
        for one in measured:
            pairs += 1
            unmeasured += one.unmeasured
            tokens.extend(one.margins)
            if (margin := one.margin) is not None:
                pair_margins.append(margin)
        return cls(arm, pairs, tuple(pair_margins), tuple(tokens), unmeasured)

    @property
    def divergent_pairs(self) -> int:
        """Divergent pairs with a measured margin: the bound's sample."""
        return len(self.pair_margins)

    @property
    def max_margin(self) -> float | None:
        return max(self.pair_margins, default=None)


@dataclass(frozen=True, slots=True)
class Calibration:
    """One calibration's measurements: the A/A run (which alone sets the margin) and the
    A/B run (information), the failed requests, the engines measured (`engines_key`), and
    the bound on the A/A pairs' margins (None: fewer divergent A/A pairs than `needed`)."""

    arm: str
    arms: str
    engines: str
    aa: RunDivergences
    ab: RunDivergences
    prompts: int
    failures: int
    at: datetime

    @property
    def aa_arm(self) -> str:
        return self.aa.arm

    @property
    def needed(self) -> int:
        return min_divergences()

    @property
    def bound(self) -> float | None:
        return tail_bound(list(self.aa.pair_margins))

    def why_not_stored(self) -> str | None:
        """Why nothing is stored, in a sentence; None when a margin is."""
        if self.bound is not None:
            return None
        against = "itself" if self.aa_arm == BASELINE_ARM else f"control arm {self.aa_arm!r}"
        seen = (
            f"{self.aa.divergent_pairs} of {self.aa.pairs} A/A pairs (the baseline against "
            f"{against}) diverged with a measured margin, {self.needed} needed"
        )
        if self.aa.divergent_pairs == 0 and self.aa.unmeasured == 0:
            return (
                f"{seen}: the baseline reproduced {against} on every prompt, so the "
                "deployment shows no numeric noise to bound (the A/B run never sets the "
                "margin)"
            )
        return f"{seen} (the A/B run never sets the margin)"

    def stored(self) -> TieMargin | None:
        """The row to store; None when the A/A pairs bound nothing."""
        bound = self.bound
        if bound is None:
            return None
        return TieMargin(
            arms=self.arms,
            arm=self.arm,
            margin=bound,
            divergences=len(self.aa.token_margins) + len(self.ab.token_margins),
            aa=len(self.aa.token_margins),
            ab=len(self.ab.token_margins),
            unmeasured=self.aa.unmeasured + self.ab.unmeasured,
            pairs=self.aa.pairs + self.ab.pairs,
            coverage=TAIL_COVERAGE,
            confidence=TAIL_CONFIDENCE,
            calibrated_at=self.at,
            aa_arm=self.aa_arm,
            aa_divergent_pairs=self.aa.divergent_pairs,
            engines=self.engines,
        )


def engines_key(
    baseline: Mapping[str, str], arm: Mapping[str, str], software: Mapping[str, str]
) -> str:
    """A short key of the engines a margin was measured on or pairs were run with: the
    baseline's and the arm's identities (`Engine.identity`, redacted as run records keep
    them) and, where either runs in process, the versions of `IN_PROCESS_SOFTWARE`. A
    server's own version is not visible to canaryd; its identity (kind, model, URL) is."""
    in_process = any(identity.get("kind") in IN_PROCESS_KINDS for identity in (baseline, arm))
    versions = (
        {name: software.get(name, "absent") for name in IN_PROCESS_SOFTWARE} if in_process else {}
    )
    return arms_key({"baseline": dict(baseline), "arm": dict(arm), "software": versions})


def run_engines_key(run: RunInfo, arm: str) -> str:
    """The `engines_key` of the engines a run's pairs of `arm` came from."""
    identity = run.arm_identities.get(arm, run.speculative_identity)
    return engines_key(run.baseline_identity, identity, run.software)


def expires_at(calibrated_at: datetime, max_age_days: float) -> datetime:
    """When a margin measured at `calibrated_at` stops judging."""
    return calibrated_at + timedelta(days=max_age_days)


def not_applicable(
    stored: TieMargin, now: datetime, max_age_days: float, engines: str | None
) -> str | None:
    """Why `stored` must not judge, at `now`, pairs run on `engines` (None: unknown, e.g.
    no pairs yet); None when it applies. A margin expires `max_age_days` after it was
    measured (`gates.quality.tie_margin_max_age_days`), belongs to the engines it was
    measured on, and a row stored before the A/A-only rule (no `aa_divergent_pairs`) was
    set partly by the arm under test."""
    if stored.aa_divergent_pairs is None or stored.engines is None:
        return (
            "it was calibrated before the margin came from A/A divergences alone (the "
            "arm under test's own divergences set it); run canaryd calibrate again"
        )
    expiry = expires_at(stored.calibrated_at, max_age_days)
    if now >= expiry:
        return (
            f"it expired at {expiry.astimezone(UTC).isoformat(timespec='seconds')} "
            f"(gates.quality.tie_margin_max_age_days = {max_age_days:g}); run canaryd "
            "calibrate again"
        )
    if engines is not None and engines != stored.engines:
        return (
            f"the engines behind the pairs (key {engines}) are not the ones it was measured "
            f"on (key {stored.engines}); run canaryd calibrate again"
        )
    return None


def _greedy(prompt: Prompt, index: int, timeout_s: float | None) -> GenerationRequest:
    return GenerationRequest(
        messages=prompt.messages,
        sampling=SamplingParams(max_tokens=prompt.max_tokens, temperature=0.0, seed=0),
        request_id=f"calibrate-{index}",
        timeout_s=timeout_s,
        category=prompt.category,
    )


def _generate(engine: Engine, request: GenerationRequest) -> GenerationResult | None:
    try:
        result = engine.generate(request)
    except Exception:  # an engine bug: the pair is lost, the calibration goes on
        return None
    return result if result.ok else None


def calibrate(
    settings: Settings,
    engines: dict[str, Engine],
    arm: str,
    prompts: Sequence[Prompt],
    *,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    progress: Callable[[], None] | None = None,
) -> Calibration:
    """Run every prompt greedy at its full `max_tokens` on the baseline, again on the A/A
    arm (`aa_arm`: the control arm when configured, else the baseline) and on `arm`, judge
    every divergent token against the first baseline output, and bound the A/A pairs'
    margins (engines: by arm name, `baseline`, `arm` and the control arm among them,
    loaded)."""
    baseline = engines[BASELINE_ARM]
    replica_arm = aa_arm(settings)
    replica = engines[replica_arm]
    speculative = engines[arm]
    aa: list[Measured] = []
    ab: list[Measured] = []
    failures = 0
    for index, prompt in enumerate(prompts):
        request = _greedy(prompt, index, settings.prompts.timeout_s)
        first = _generate(baseline, request)
        again = _generate(replica, request)
        other = _generate(speculative, request)
        if first is None:
            failures += 1 + (again is None) + (other is None)
        else:
            for result, measured in ((again, aa), (other, ab)):
                if result is None:
                    failures += 1
                    continue
                measured.append(divergent_margins(baseline, prompt, first, result))
        if progress is not None:
            progress()
    software = software_versions()
    return Calibration(
        arm=arm,
        arms=arm_key(settings, arm),
        engines=engines_key(
            redact_value(baseline.identity), redact_value(speculative.identity), software
        ),
        aa=RunDivergences.of(replica_arm, aa),
        ab=RunDivergences.of(arm, ab),
        prompts=len(prompts),
        failures=failures,
        at=now(),
    )


def aa_arm(settings: Settings) -> str:
    """The arm the A/A run repeats the baseline on: the A/A control arm when configured."""
    return settings.gates.quality.control_arm or BASELINE_ARM
