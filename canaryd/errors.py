"""Every error canaryd reports to a person, each building its own message.

The CLI prints `str(exc)` of a `CanarydError` as one line and exits non-zero; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import EngineError, ModelNotFoundError, ProvisioningError

__all__ = [
    "CanarydError",
    "ConfigError",
    "DatabaseError",
    "EngineError",
    "MetricUnavailableError",
    "ModelNotFoundError",
    "PromptFileError",
    "ProvisioningError",
    "UnknownCategoryError",
]


class CanarydError(Exception):
    """Base of errors that are the user's to fix; the message says what to do."""

    exit_code = 2


class ConfigError(CanarydError, ValueError):
    def __init__(self, source: str | Path, key: str, reason: str) -> None:
        self.source, self.key, self.reason = str(source), key, reason
        super().__init__(f"{self.source}: {key}: {reason}")


class PromptFileError(CanarydError, ValueError):
    """One or more problems in a prompt suite file; `problems` are 'file:line: reason'."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        more = (
            f" (and {len(problems) - 1} more; run `canaryd prompts validate`)"
            if len(problems) > 1
            else ""
        )
        super().__init__(f"{problems[0]}{more}" if problems else "invalid prompt suite")


class UnknownCategoryError(CanarydError, LookupError):
    def __init__(self, category: str, known: list[str]) -> None:
        self.category, self.known = category, known
        super().__init__(f"unknown category {category!r}; known categories: {', '.join(known)}")


class DatabaseError(CanarydError, RuntimeError):
    """The database URL is bad, the server is unreachable, or the schema is not current."""


class MetricUnavailableError(CanarydError, ImportError):
    def __init__(self, metric: str, missing: str) -> None:
        super().__init__(
            f"scoring metric {metric!r} needs {missing!r}, which is not installed: "
            f"reinstall canaryd (`pip install -e .`)"
        )
