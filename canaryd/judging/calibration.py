"""The tie margin calibrated on the deployment: measuring it.

`calibrate` runs prompts greedy at their full `max_tokens` on the baseline twice (A/A:
the deployment's own numeric noise; the second run on the A/A control arm,
`gates.quality.control_arm`, when one is configured: a replica on other hardware shows the
noise between servers that one server run twice cannot) and on the baseline and one
speculative arm (A/B),
judges every divergent token with the baseline as teacher (canaryd.scoring.calibrate),
and bounds the margins' tail (`tail_bound`); `Calibration.stored` is the row kept under
the arms' key. Judging with it is the reader's (`canaryd.judging.reader.tie_margin_for`
reads the margin, `gates.evidence.MarginSource` says where it came from in the quality
decision's detail).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from canaryd.config import Settings
from canaryd.config.arms import arm_key
from canaryd.scoring.calibrate import (
    TAIL_CONFIDENCE,
    TAIL_COVERAGE,
    divergent_margins,
    min_divergences,
    tail_bound,
)
from canaryd.store.abc import TieMargin
from engine.base import Engine
from engine.types import GenerationRequest, GenerationResult, SamplingParams
from gates.records import BASELINE_ARM, Prompt

__all__ = ["Calibration", "aa_arm", "calibrate"]


@dataclass(frozen=True, slots=True)
class Calibration:
    """One calibration's measurements: the margins of the A/A and A/B divergences, the
    pairs and failed requests behind them, and the bound (None: too few divergences)."""

    arm: str
    arms: str
    aa_arm: str
    aa_margins: tuple[float, ...]
    ab_margins: tuple[float, ...]
    unmeasured: int
    pairs: int
    prompts: int
    failures: int
    bound: float | None
    at: datetime

    @property
    def divergences(self) -> int:
        return len(self.aa_margins) + len(self.ab_margins)

    @property
    def needed(self) -> int:
        return min_divergences()

    def stored(self) -> TieMargin | None:
        """The row to store; None when the bound could not be computed."""
        if self.bound is None:
            return None
        return TieMargin(
            arms=self.arms,
            arm=self.arm,
            margin=self.bound,
            divergences=self.divergences,
            aa=len(self.aa_margins),
            ab=len(self.ab_margins),
            unmeasured=self.unmeasured,
            pairs=self.pairs,
            coverage=TAIL_COVERAGE,
            confidence=TAIL_CONFIDENCE,
            calibrated_at=self.at,
        )


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
    every divergent token against the first baseline output, and bound the margins
    (engines: by arm name, `baseline`, `arm` and the control arm among them, loaded)."""
    baseline = engines[BASELINE_ARM]
    replica_arm = aa_arm(settings)
    replica = engines[replica_arm]
    speculative = engines[arm]
    aa: list[float] = []
    ab: list[float] = []
    unmeasured = pairs = failures = 0
    for index, prompt in enumerate(prompts):
        request = _greedy(prompt, index, settings.prompts.timeout_s)
        first = _generate(baseline, request)
        again = _generate(replica, request)
        other = _generate(speculative, request)
        if first is None:
            failures += 1 + (again is None) + (other is None)
        else:
            for result, margins in ((again, aa), (other, ab)):
                if result is None:
                    failures += 1
                    continue
                pairs += 1
                measured = divergent_margins(baseline, prompt, first, result)
                margins.extend(measured.margins)
                unmeasured += measured.unmeasured
        if progress is not None:
            progress()
    return Calibration(
        arm=arm,
        arms=arm_key(settings, arm),
        aa_arm=replica_arm,
        aa_margins=tuple(aa),
        ab_margins=tuple(ab),
        unmeasured=unmeasured,
        pairs=pairs,
        prompts=len(prompts),
        failures=failures,
        bound=tail_bound([*aa, *ab]),
        at=now(),
    )


def aa_arm(settings: Settings) -> str:
    """The arm the A/A run repeats the baseline on: the A/A control arm when configured."""
    return settings.gates.quality.control_arm or BASELINE_ARM
