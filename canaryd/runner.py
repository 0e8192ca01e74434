"""The pair runner: one prompt on both arms, same sampling, arm order randomised.

A pair is the unit of everything downstream: scored as a whole, stored in one
transaction, never half-written. Engines return failures as results; an engine that
raises anyway (a bug) is caught here and recorded as an `internal` error on that arm so
one bad arm cannot take the daemon down.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog

from canaryd.scoring import score_pair
from engine.base import Engine
from engine.types import ErrorKind, GenerationRequest, GenerationResult, SamplingParams
from gates.records import Arm, PairRecord, Prompt

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PairParams:
    """Sampling shared by both arms; `max_tokens` overrides the prompt's when set."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int | None = None
    timeout_s: float | None = 120.0


class PairRunner:
    def __init__(
        self,
        baseline: Engine,
        speculative: Engine,
        *,
        run_id: str,
        params: PairParams | None = None,
        seed: int = 0,
    ) -> None:
        self.arms: dict[Arm, Engine] = {"baseline": baseline, "speculative": speculative}
        self.run_id = run_id
        self.params = params or PairParams()
        self._rng = random.Random(seed)  # noqa: S311  (arm order and seeds, not security)
        # Sampled pairs are scored for likelihood by the baseline (target) model.
        self._teacher = baseline if self.params.temperature > 0 else None

    def _request(self, prompt: Prompt, pair_id: str, seed: int) -> GenerationRequest:
        sampling = SamplingParams(
            max_tokens=self.params.max_tokens or prompt.max_tokens,
            temperature=self.params.temperature,
            top_p=self.params.top_p,
            seed=seed,
        )
        return GenerationRequest(
            messages=prompt.messages,
            sampling=sampling,
            request_id=f"{pair_id}",
            timeout_s=self.params.timeout_s,
            category=prompt.category,
        )

    def _call(self, arm: Arm, request: GenerationRequest) -> GenerationResult:
        started = time.perf_counter()
        try:
            return self.arms[arm].generate(request)
        except Exception as exc:
            log.exception("pair.engine_raised", arm=arm)
            return GenerationResult.failed(
                ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}", time.perf_counter() - started
            )

    def run_pair(self, prompt: Prompt) -> PairRecord:
        pair_id = uuid.uuid4().hex
        seed = self._rng.randrange(2**31)
        order: tuple[Arm, Arm] = ("baseline", "speculative")
        if self._rng.random() < 0.5:
            order = ("speculative", "baseline")
        request = self._request(prompt, pair_id, seed)
        started_at = datetime.now(UTC)
        results = {arm: self._call(arm, request) for arm in order}
        baseline, speculative = results["baseline"], results["speculative"]
        record = PairRecord(
            pair_id=pair_id,
            run_id=self.run_id,
            prompt=prompt,
            started_at=started_at,
            arm_order=order,
            baseline=baseline,
            speculative=speculative,
            scores=score_pair(prompt, baseline, speculative, teacher=self._teacher),
            sampling_seed=seed,
            temperature=self.params.temperature,
        )
        log.info(
            "pair.done",
            pair_id=pair_id,
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
        return record
