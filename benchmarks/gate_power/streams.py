"""The daemon's pair loop in simulated time: `PairStream` runs the real `PairRunner` over
a noise model's seeded fake engines and the shipped prompt suites (`StratifiedSampler`),
stamping pair i at `first + i` spacings after `T0`, or as soon as the pair before it has
ended (its two arms, one after the other) when that is later, as the daemon's schedule
does (and its replays, when the model has several daemons replaying the same seeds,
between it and the next); a model with `BurstStalls` runs its pairs in rollout-burst
cycles of concurrent pairs instead. `FaultStream` holds the pairs after a fault's onset,
generated on demand up to a cap, so that every judge reads the same ones; `greedy_pairs`
runs each of a list of prompts once, greedy (a calibration's run).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from benchmarks.gate_power.noise import (
    DESIGN_SPACING_S,
    T0,
    Collateralised,
    Deployed,
    NoiseModel,
    Stalled,
)
from canaryd.pairs.runner import OwnSampling, PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites
from engine.fake import FakeEngine
from gates.records import PairRecord, Prompt

_PROMPTS: list[Prompt] = []


def default_prompts() -> list[Prompt]:
    if not _PROMPTS:
        _PROMPTS.extend(p for suite in load_default_suites() for p in suite.prompts)
    return _PROMPTS


class PairStream:
    """The daemon's pair loop in simulated time: seeded engines and sampler, pair i
    starting `first + i` spacings after T0."""

    def __init__(
        self,
        model: NoiseModel,
        seed: int,
        *,
        spacing_s: float = DESIGN_SPACING_S,
        first: int = 0,
        weights: dict[str, float] | None = None,
    ) -> None:
        self.runner = PairRunner(
            FakeEngine(model.baseline.model_copy(update={"seed": seed})),
            FakeEngine(model.speculative.model_copy(update={"seed": seed})),
            run_id=f"{model.name}-{seed}",
            params=model.params,
            seed=seed,
        )
        self.sampler = StratifiedSampler(default_prompts(), weights=weights, seed=seed)
        self.spacing = timedelta(seconds=spacing_s)
        self.index = first
        self.deployed = (
            Deployed(model.deployment, seed + first) if model.deployment is not None else None
        )
        self.collateral = (
            Collateralised(model.collateral, seed + first) if model.collateral else None
        )
        self.model = model
        self.sampled = random.Random(seed * 15_485_863 + first)
        self.replays: list[PairRecord] = []  # the other daemons' copies of the last pair
        self.stalled = Stalled(model.stalls, seed + first) if model.stalls else None
        self.concurrency = model.stalls.concurrency if model.stalls else 1
        self.ended = T0  # when the last pair (a burst: the last of its cycle) ended
        self.cycle_start = T0

    def _run(self, prompt: Prompt) -> PairRecord:
        model = self.model
        if model.sampled_share and self.sampled.random() < model.sampled_share:
            own = OwnSampling(
                temperature=model.sampled_temperature,
                top_p=1.0,
                max_tokens=model.params.max_tokens or prompt.max_tokens,
            )
            return self.runner.run_group(prompt, sampling=own).records[0]
        return self.runner.run_pair(prompt)

    def greedy_pairs(self, prompts: Sequence[Prompt]) -> list[PairRecord]:
        """One greedy pair of each of `prompts` at its full `max_tokens`, with the model's
        deployment noise: a calibration's run (`faults.calibrated_config`), off the
        schedule (each pair stamped by the runner's own clock)."""
        out: list[PairRecord] = []
        for prompt in prompts:
            record = self.runner.run_pair(prompt)
            out.append(self.deployed.apply(record) if self.deployed is not None else record)
        return out

    def take(self, n: int) -> list[PairRecord]:
        """The next `n` records (a pair and its replays count one each)."""
        out: list[PairRecord] = []
        while len(out) < n:
            if self.replays:
                out.append(self.replays.pop(0))
                continue
            record = self._run(self.sampler.next())
            slot = self.index % self.concurrency
            record = replace(record, started_at=self._start(slot))
            if self.deployed is not None:
                record = self.deployed.apply(record)
            if self.collateral is not None:
                record = self.collateral.apply(record)
            if self.stalled is not None:
                record = self.stalled.apply(record, slot)
            span = timedelta(seconds=record.baseline.e2e_s + record.speculative.e2e_s)
            self.ended = max(self.ended, record.started_at + span)
            out.append(record)
            replicas = self.model.replicas
            self.replays = [
                replace(
                    record,
                    pair_id=f"{record.pair_id}-replay-{k}",
                    run_id=f"{record.run_id}-replay-{k}",
                    started_at=record.started_at + k * self.spacing / replicas,
                )
                for k in range(1, replicas)
            ]
            self.index += 1
        return out

    def _start(self, slot: int) -> datetime:
        """When the next pair starts: on the schedule, or once the pair (the cycle) before
        it ended (and was stored, `SETTLE` later); a burst cycle's pairs start together,
        `LAUNCH` apart."""
        if slot == 0:
            scheduled = T0 + self.index * self.spacing
            self.cycle_start = max(scheduled, self.ended + SETTLE) if self.ended > T0 else scheduled
        return self.cycle_start + slot * LAUNCH


SETTLE = timedelta(milliseconds=1)  # storing a pair before the next one starts
LAUNCH = timedelta(milliseconds=3)  # starting one of a burst cycle's threads


class FaultStream:
    """The pairs after a fault's onset, generated on demand up to `cap`."""

    def __init__(self, stream: PairStream, cap: int) -> None:
        self.stream = stream
        self.cap = cap
        self.records: list[PairRecord] = []

    def upto(self, n: int) -> list[PairRecord]:
        n = min(n, self.cap)
        if n > len(self.records):
            self.records.extend(self.stream.take(max(n - len(self.records), 200)))
            del self.records[self.cap :]
        return self.records[:n]
