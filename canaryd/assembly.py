"""How a run is assembled from `Settings`: suites, prompts, the prompt sampler, the
sampling parameters shared by both arms, and the software versions recorded with it.

`canaryd once`, `canaryd run` and `canaryd bench` all build their runs through here, so
the three never disagree on which prompts are drawn or how.
"""

from __future__ import annotations

import platform

import canaryd
from canaryd.config import Settings
from canaryd.records import Prompt
from canaryd.runner import PairParams
from canaryd.sampling import StratifiedSampler
from canaryd.suites import Suite, load_default_suites, load_suites, select


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
