"""What a pair cycle runs with, assembled from `Settings`: the `Plan` (settings, prompt
sampler, pair runner, every arm's engine and the run record), replaced whole by a reload
and never mutated. Start-up and reload both assemble plans here, through the run-building
helpers of `canaryd.pairs.plan`, so the two cannot disagree on how a run is made."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import structlog

from canaryd import paths
from canaryd.config import Settings
from canaryd.metrics.build import BuildMetrics
from canaryd.metrics.pairs import PairMetrics
from canaryd.pairs.plan import arm_names, new_run, pair_runner
from canaryd.pairs.runner import PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from engine.base import Engine
from engine.registry import build_engine
from gates.records import RunInfo

__all__ = ["Plan", "load_engines", "new_plan", "publish_build_info"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a cycle runs with; replaced whole by a reload, never mutated."""

    settings: Settings
    sampler: StratifiedSampler
    runner: PairRunner
    engines: dict[str, Engine]  # by arm name: baseline, the switch's arm, comparison arms
    run: RunInfo


def load_engines(settings: Settings, reuse: dict[str, Engine]) -> dict[str, Engine]:
    """Engines for every arm: those in `reuse` as they are, the others built, loaded
    and warmed up; if one fails, those built here are closed again."""
    engines: dict[str, Engine] = {}
    with contextlib.ExitStack() as fresh:
        for arm in arm_names(settings):
            if arm in reuse:
                engines[arm] = reuse[arm]
                continue
            engine = build_engine(settings.arms.arm(arm), models_dir=paths.models_dir())
            fresh.callback(engine.close)
            log.info("engine.loading", arm=arm, identity=engine.identity)
            engine.load()
            engines[arm] = engine
        fresh.pop_all()
    return engines


def new_plan(
    settings: Settings,
    sampler: StratifiedSampler,
    engines: dict[str, Engine],
    metrics: PairMetrics,
    *,
    previous: RunInfo | None = None,
) -> Plan:
    """A plan under a new run, or under `previous` when the config is unchanged (the
    runner must then stamp pairs with that run's id: a new one has no run row). The pair
    metrics count ties under the plan's tie margin from now on."""
    if previous is not None and previous.config_hash == settings.config_hash():
        run = previous
    else:
        run = new_run(settings, "daemon", engines)
    metrics.tie_margin_nats = settings.gates.quality.tie_margin_nats
    return Plan(settings, sampler, pair_runner(settings, engines, run.run_id), engines, run)


def publish_build_info(metrics: BuildMetrics, run: RunInfo) -> None:
    """The build-info metric of `run`: software versions and the two engines' identities."""
    software = run.software
    metrics.set(
        version=software.get("canaryd", "unknown"),
        python=software.get("python", "unknown"),
        torch=software.get("torch", "absent"),
        transformers=software.get("transformers", "absent"),
        baseline=run.baseline_identity,
        speculative=run.speculative_identity,
    )
