"""How a run is assembled from `Settings`: suites, prompts, the prompt sampler, the
sampling parameters shared by all arms, the arms' engines, and the run record (engine
identities, software versions) kept with it.

`canaryd once`, `canaryd run` and `canaryd bench` all build their runs through here, so
the three never disagree on which prompts are drawn or how.
"""

from __future__ import annotations

import platform
import uuid
import zlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import canaryd
from canaryd import paths
from canaryd.config import Settings
from canaryd.pairs.runner import PairParams, PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import Suite, load_default_suites, load_suites, select
from canaryd.redact import redact_value
from engine.base import Engine
from engine.registry import build_engine
from gates.records import BASELINE_ARM, Prompt, RunInfo


def software_versions() -> dict[str, str]:
    import importlib.metadata as md

    versions = {"canaryd": canaryd.__version__, "python": platform.python_version()}
    for package in ("torch", "transformers", "sqlalchemy"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = "absent"
    return versions


def configured_suites(settings: Settings) -> list[Suite]:
    """The suites named in `prompts.suites`, else the ones shipped with canaryd."""
    return (
        load_suites(settings.prompts.suites) if settings.prompts.suites else load_default_suites()
    )


def resolve_prompts(
    settings: Settings, category: str | None, suites: list[Suite] | None = None
) -> list[Prompt]:
    """The prompts to sample: of `category` when given, else of the configured categories."""
    suites = configured_suites(settings) if suites is None else suites
    prompts = select(suites, category)
    if settings.prompts.categories and category is None:
        wanted = set(settings.prompts.categories)
        for name in wanted:
            select(suites, name)  # an unknown configured category is an error too
        prompts = [p for p in prompts if p.category in wanted]
    return prompts


def prompt_sampler(settings: Settings, prompts: list[Prompt]) -> StratifiedSampler:
    """Stratified by category with the configured weights (for categories present)."""
    categories = {p.category for p in prompts}
    return StratifiedSampler(
        prompts,
        seed=settings.prompts.seed,
        weights={c: w for c, w in settings.prompts.category_weights.items() if c in categories},
    )


def suite_sampler(
    settings: Settings, category: str | None = None, suites: list[Suite] | None = None
) -> StratifiedSampler:
    """The sampler over the configured suites' prompts (of `category` when given); a bad
    suite or an unknown category raises here, before anything is opened or loaded."""
    return prompt_sampler(settings, resolve_prompts(settings, category, suites))


def run_seed(seed: int, run_id: str) -> int:
    """The seed of one run's pair seeds and arm order: `prompts.seed` salted with the run.

    Every daemon, follower, restart and command is a run of its own; unsalted, each would
    replay the same (prompt, seed) sequence, and the gates would count one measurement as
    many (`gates.cycle` drops such replays). Within a run the sequence is reproducible."""
    return zlib.crc32(f"{seed}:{run_id}".encode()) & 0x7FFF_FFFF


def pair_runner(settings: Settings, engines: Mapping[str, Engine], run_id: str) -> PairRunner:
    """The pair runner over `engines` (by arm name, the baseline among them) that stamps
    pairs with `run_id`: the sampling parameters every command and the daemon share, and
    pair seeds of its own (`run_seed`)."""
    return PairRunner(
        engines[BASELINE_ARM],
        speculative_engines(engines),
        run_id=run_id,
        seed=run_seed(settings.prompts.seed, run_id),
        params=pair_params(settings),
    )


def pair_params(settings: Settings) -> PairParams:
    return PairParams(
        temperature=settings.prompts.temperature,
        top_p=settings.prompts.top_p,
        max_tokens=settings.prompts.max_tokens,
        timeout_s=settings.prompts.timeout_s,
        seed_per_arm=settings.prompts.seed_per_arm,
    )


def arm_names(settings: Settings) -> list[str]:
    """Every arm's name in the order runs use them: `baseline`, the switch's arm, then
    the comparison arms."""
    return [BASELINE_ARM, settings.switch_arm, *settings.comparison_arms]


def build_arms(settings: Settings) -> dict[str, Engine]:
    """Every arm's engine by name (`arm_names` order), built but not yet loaded."""
    models_dir = paths.models_dir()
    return {
        name: build_engine(settings.arms.arm(name), models_dir=models_dir)
        for name in arm_names(settings)
    }


def speculative_engines(engines: Mapping[str, Engine]) -> dict[str, Engine]:
    """The speculative arms of `engines` (every arm but the baseline), in their order."""
    return {name: engine for name, engine in engines.items() if name != BASELINE_ARM}


def new_run(
    settings: Settings,
    kind: Literal["once", "daemon", "bench", "judge", "probe"],
    engines: Mapping[str, Engine],
    *,
    run_id: str | None = None,
    started_at: datetime | None = None,
    extra_config: dict[str, Any] | None = None,
) -> RunInfo:
    """The run record: config snapshot and hash, every arm's engine identity (the switch's
    arm as the speculative one), software versions."""
    identities = {
        name: redact_value(engine.identity) for name, engine in speculative_engines(engines).items()
    }
    return RunInfo(
        run_id=run_id or uuid.uuid4().hex[:12],
        kind=kind,
        started_at=started_at or datetime.now(UTC),
        config=settings.snapshot() | (extra_config or {}),
        config_hash=settings.config_hash(),
        baseline_identity=redact_value(engines[BASELINE_ARM].identity),
        speculative_identity=identities[settings.switch_arm],
        software=software_versions(),
        arm_identities=identities,
    )
