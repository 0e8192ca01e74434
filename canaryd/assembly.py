"""How a run is assembled from `Settings`: suites, prompts, the prompt sampler, the
sampling parameters shared by both arms, and the software versions recorded with it.

`canaryd once`, `canaryd run` and `canaryd bench` all build their runs through here, so
the three never disagree on which prompts are drawn or how.
"""

from __future__ import annotations

import hashlib
import json
import platform
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

import canaryd
from canaryd import paths
from canaryd.config import Settings
from canaryd.redact import redact_value
from canaryd.runner import PairParams
from canaryd.sampling import StratifiedSampler
from canaryd.suites import Suite, load_default_suites, load_suites, select
from engine.base import Engine
from engine.registry import build_engine
from gates.records import Prompt, RunInfo


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


def pair_params(settings: Settings) -> PairParams:
    return PairParams(
        temperature=settings.prompts.temperature,
        top_p=settings.prompts.top_p,
        max_tokens=settings.prompts.max_tokens,
        timeout_s=settings.prompts.timeout_s,
    )


def build_arms(settings: Settings) -> tuple[Engine, Engine]:
    """The baseline and speculative engines of `settings`, built but not yet loaded."""
    models_dir = paths.models_dir()
    return (
        build_engine(settings.arms.baseline, models_dir=models_dir),
        build_engine(settings.arms.speculative, models_dir=models_dir),
    )


def new_run(
    settings: Settings,
    kind: Literal["once", "daemon", "bench"],
    baseline: Engine,
    speculative: Engine,
    *,
    run_id: str | None = None,
    started_at: datetime | None = None,
    extra_config: dict[str, Any] | None = None,
) -> RunInfo:
    """The run record: config snapshot and hash, engine identities, software versions."""
    return RunInfo(
        run_id=run_id or uuid.uuid4().hex[:12],
        kind=kind,
        started_at=started_at or datetime.now(UTC),
        config=settings.snapshot() | (extra_config or {}),
        config_hash=settings.config_hash(),
        baseline_identity=redact_value(baseline.identity),
        speculative_identity=redact_value(speculative.identity),
        software=software_versions(),
    )


def arms_key(arms: object) -> str:
    """A short, stable key of an arms configuration (the `arms` section of a config
    snapshot): drift references belong to one."""
    encoded = json.dumps(arms, sort_keys=True, default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]
