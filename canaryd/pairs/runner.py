"""The pair runner: one prompt on the baseline and every speculative arm, same sampling,
arm order randomised.

A pair is the unit of everything downstream: scored as a whole, stored in one
transaction, never half-written. With several speculative arms, one prompt becomes a
`PairGroup`: the baseline runs once, every speculative arm gets the same request (prompt,
sampling parameters, seed), all in one random order, and each speculative arm is scored
against that one baseline result into its own `PairRecord`. Engines return failures as
results; an engine that raises anyway (a bug) is caught here and recorded as an
`internal` error on that arm so one bad arm cannot take the daemon down, and an answer
that cannot be true (`engine.validation`) becomes an `invalid_output` failure of its arm.
"""

from __future__ import annotations

import random
import time
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import structlog

from canaryd.scoring import score_pair
from engine.base import Engine
from engine.types import ErrorKind, GenerationRequest, GenerationResult, SamplingParams
from engine.validation import checked_result
from gates.records import BASELINE_ARM, DEFAULT_ARM, Arm, PairRecord, PairSource, Prompt

__all__ = ["OwnSampling", "PairGroup", "PairParams", "PairRunner"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PairParams:
    """Sampling shared by all arms; `max_tokens` overrides the prompt's when set. With
    `seed_per_arm` a sampled request carries its own seed on every arm (`arm_seed`): the
    two outputs of a lossless pair are then independent draws from one distribution,
    exactly exchangeable, as the sign-flip test assumes; with one seed shared, two
    samplers that consume it differently give outputs whose joint law need not be
    symmetric."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int | None = None
    timeout_s: float | None = 120.0
    seed_per_arm: bool = True


def arm_seed(seed: int, arm: str) -> int:
    """The seed `arm` samples with when seeds are per arm: the pair's seed (stored as
    `sampling_seed`) on the baseline, a fixed function of it and the arm's name on every
    other arm, so a stored pair can be replayed."""
    if arm == BASELINE_ARM:
        return seed
    return zlib.crc32(f"{seed}:{arm}".encode()) & 0x7FFF_FFFF


@dataclass(frozen=True, slots=True)
class OwnSampling:
    """A prompt's own sampling, instead of the run's: a live pair replays the mirrored
    request's (its `max_tokens` already capped)."""

    temperature: float
    top_p: float
    max_tokens: int
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PairGroup:
    """One prompt on the baseline and every speculative arm: a record per speculative arm
    (in the configured order), all sharing `group_id` and the baseline result."""

    group_id: str
    order: tuple[str, ...]  # every arm's name, `baseline` included, in the order they ran
    records: tuple[PairRecord, ...]

    @property
    def baseline(self) -> GenerationResult:
        return self.records[0].baseline

    @property
    def arms(self) -> tuple[str, ...]:
        """The speculative arms' names."""
        return tuple(record.arm for record in self.records)

    def record(self, arm: str) -> PairRecord:
        """The record of the speculative arm called `arm` (KeyError for another name)."""
        for record in self.records:
            if record.arm == arm:
                return record
        raise KeyError(arm)


class PairRunner:
    """Runs pairs on `baseline` and `speculative`: one engine (the arm named
    `speculative`), or the speculative arms by name."""

    def __init__(
        self,
        baseline: Engine,
        speculative: Engine | Mapping[str, Engine],
        *,
        run_id: str,
        params: PairParams | None = None,
        seed: int = 0,
    ) -> None:
        self.baseline = baseline
        self.speculative: dict[str, Engine] = (
            dict(speculative) if isinstance(speculative, Mapping) else {DEFAULT_ARM: speculative}
        )
        if not self.speculative or BASELINE_ARM in self.speculative:
            raise ValueError(
                f"speculative arms {sorted(self.speculative)!r}: need at least one, "
                f"and none called {BASELINE_ARM!r}"
            )
        self.run_id = run_id
        self.params = params or PairParams()
        self._rng = random.Random(seed)  # noqa: S311  (arm order and seeds, not security)

    def _request(
        self, prompt: Prompt, group_id: str, seed: int, own: OwnSampling | None
    ) -> GenerationRequest:
        if own is None:
            sampling = SamplingParams(
                max_tokens=self.params.max_tokens or prompt.max_tokens,
                temperature=self.params.temperature,
                top_p=self.params.top_p,
                seed=seed,
            )
        else:
            sampling = SamplingParams(
                max_tokens=own.max_tokens,
                temperature=own.temperature,
                top_p=own.top_p,
                seed=seed,
                stop=own.stop,
            )
        return GenerationRequest(
            messages=prompt.messages,
            sampling=sampling,
            request_id=group_id,
            timeout_s=self.params.timeout_s,
            category=prompt.category,
        )

    def _for_arm(self, request: GenerationRequest, name: str) -> GenerationRequest:
        """`request` as arm `name` receives it: its own seed when sampled pairs draw a seed
        per arm (`PairParams.seed_per_arm`), else unchanged."""
        if not self.params.seed_per_arm or request.sampling.greedy:
            return request
        seed = arm_seed(request.sampling.seed, name)
        return replace(request, sampling=replace(request.sampling, seed=seed))

    def _engine(self, name: str) -> Engine:
        return self.baseline if name == BASELINE_ARM else self.speculative[name]

    def _call(self, name: str, request: GenerationRequest) -> GenerationResult:
        started = time.perf_counter()
        try:
            result = self._engine(name).generate(request)
        except Exception as exc:
            log.exception("pair.engine_raised", arm=name)
            return GenerationResult.failed(
                ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}", time.perf_counter() - started
            )
        checked = checked_result(result, request)
        if checked is not result:
            # The reason names the fault, never the text (output text is not logged).
            log.warning("pair.invalid_output", arm=name, reason=checked.error_detail)
        return checked

    def _order(self) -> tuple[str, ...]:
        names = [BASELINE_ARM, *self.speculative]
        if len(names) == 2:
            # Two arms draw exactly as they always have, so a seeded run repeats its order.
            return tuple(reversed(names)) if self._rng.random() < 0.5 else tuple(names)
        self._rng.shuffle(names)
        return tuple(names)

    def run_group(
        self,
        prompt: Prompt,
        *,
        sampling: OwnSampling | None = None,
        source: PairSource = "control",
    ) -> PairGroup:
        """Send `prompt` to every arm (one request, one seed, a random order), with the
        run's sampling or the prompt's `sampling`; its records say where it came from."""
        group_id = uuid.uuid4().hex
        seed = self._rng.randrange(2**31)
        order = self._order()
        request = self._request(prompt, group_id, seed, sampling)
        # Sampled pairs are scored for likelihood by the baseline (target) model; greedy
        # pairs that diverge have their first divergent token judged by it (a tie or not).
        greedy = request.sampling.greedy
        teacher = None if greedy else self.baseline
        tie_judge = self.baseline if greedy else None
        started_at = datetime.now(UTC)
        results = {name: self._call(name, self._for_arm(request, name)) for name in order}
        baseline = results[BASELINE_ARM]
        single = len(self.speculative) == 1
        records = []
        for name in self.speculative:
            speculative = results[name]
            roles: tuple[Arm, Arm] = (
                ("baseline", "speculative")
                if order.index(BASELINE_ARM) < order.index(name)
                else ("speculative", "baseline")
            )
            record = PairRecord(
                pair_id=group_id if single else uuid.uuid4().hex,
                run_id=self.run_id,
                prompt=prompt,
                started_at=started_at,
                arm_order=roles,
                baseline=baseline,
                speculative=speculative,
                scores=score_pair(
                    prompt, baseline, speculative, teacher=teacher, tie_judge=tie_judge
                ),
                sampling_seed=seed,
                temperature=request.sampling.temperature,
                arm=name,
                group_id=group_id,
                source=source,
            )
            records.append(record)
            log.info(
                "pair.done",
                pair_id=record.pair_id,
                group_id=group_id,
                arm=name,
                prompt_id=prompt.id,
                category=prompt.category,
                order=order[0],
                baseline_e2e_s=round(baseline.e2e_s, 4),
                speculative_e2e_s=round(speculative.e2e_s, 4),
                baseline_error=baseline.error.value,
                speculative_error=speculative.error.value,
                acceptance_length=speculative.acceptance_length,
                exact_match=record.scores.exact_match if record.scores else None,
            )
        return PairGroup(group_id=group_id, order=order, records=tuple(records))

    def run_pair(self, prompt: Prompt) -> PairRecord:
        """The one record of `prompt` on a runner with one speculative arm."""
        if len(self.speculative) != 1:
            raise ValueError(f"run_pair on {len(self.speculative)} speculative arms: use run_group")
        return self.run_group(prompt).records[0]
