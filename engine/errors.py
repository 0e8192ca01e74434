"""Errors the engine package reports to a person; each builds its own message.

Failed *generations* are not exceptions (they are `GenerationResult.error`); these are
for things a user must fix: a missing model, a bad engine config, a failed model pull.
"""

from __future__ import annotations

from pathlib import Path


class EngineError(Exception):
    """Base of user-fixable engine errors; the CLI prints the message as one line."""

    exit_code = 2


class ModelNotFoundError(EngineError, FileNotFoundError):
    def __init__(self, path: Path | str, hint: str = "run `canaryd models pull` first") -> None:
        self.path = Path(path)
        super().__init__(f"no model at {str(path)!r}: {hint}")


class ProvisioningError(EngineError, RuntimeError):
    """Fetching, verifying or converting a model failed; the message says which and why."""


class EngineConfigError(EngineError, ValueError):
    def __init__(self, key: str, reason: str) -> None:
        self.key, self.reason = key, reason
        super().__init__(f"engine config {key}: {reason}")


# What the `local` extra (canaryd-specdec[local]) adds: the in-process engines, draft heads, models.
LOCAL_PACKAGES = frozenset({"torch", "transformers", "accelerate", "gguf", "safetensors"})


class MissingExtraError(EngineError, ImportError):
    """A local feature (in-process engine, draft heads, `canaryd models`) on an install
    without the `local` extra."""

    def __init__(self, feature: str, package: str) -> None:
        self.feature, self.package = feature, package
        super().__init__(
            f"{feature} needs {package!r}, which is not installed: install canaryd-specdec[local] "
            "(pip install 'canaryd-specdec[local]'); remote arms (kind = \"openai\") need neither"
        )


def missing_local_package(exc: ImportError) -> str | None:
    """The `local` extra's package whose absence `exc` reports, else None."""
    name = (exc.name or "").split(".")[0]
    return name if name in LOCAL_PACKAGES else None


class MetricsFormatError(ValueError):
    """A /metrics or /server_info body that does not parse."""

    def __init__(self, what: str, reason: str) -> None:
        self.what, self.reason = what, reason
        super().__init__(f"unparseable {what}: {reason}")


class PromptLogprobsError(ValueError):
    """A `/tokenize` or prompt-log-probs answer that is not what vLLM sends."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"unreadable prompt log-probs answer: {reason}")


class HeadsNotTrainedError(EngineError, FileNotFoundError):
    """`method = "draft_heads"` names heads that have not been trained for this model."""

    def __init__(self, path: Path | str, kind: str) -> None:
        self.path, self.kind = Path(path), kind
        super().__init__(
            f"no trained {kind} draft heads at {str(path)!r}: run `canaryd models train-heads`"
        )


class HeadsFileError(EngineError, ValueError):
    """Trained draft heads that cannot be used: corrupt, or for another model."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path, self.reason = Path(path), reason
        super().__init__(f"draft heads at {str(path)!r}: {reason}")
