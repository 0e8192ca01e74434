"""Build an `Engine` from its config: the one place that maps `kind` to a class."""

from __future__ import annotations

from pathlib import Path

from engine.base import Engine
from engine.config import (
    EngineConfig,
    FakeEngineConfig,
    OpenAIEngineConfig,
    TransformersEngineConfig,
)
from engine.errors import EngineConfigError, MissingExtraError, missing_local_package


def build_engine(config: EngineConfig, *, models_dir: Path | None = None) -> Engine:
    if isinstance(config, TransformersEngineConfig):
        try:
            from engine.hf import TransformersEngine  # imports torch: only when asked for
        except ImportError as exc:
            package = missing_local_package(exc)
            if package is None:
                raise
            raise MissingExtraError(
                'kind = "transformers" (the in-process engine)', package
            ) from exc

        return TransformersEngine(config, models_dir=models_dir)
    if isinstance(config, FakeEngineConfig):
        from engine.fake import FakeEngine

        return FakeEngine(config)
    if isinstance(config, OpenAIEngineConfig):
        from engine.http import OpenAIEngine

        return OpenAIEngine(config)
    raise EngineConfigError("kind", f"unknown engine kind {getattr(config, 'kind', None)!r}")
