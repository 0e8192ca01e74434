"""Every error canaryd reports to a person, each building its own message.

The CLI prints `str(exc)` of a `CanarydError` as one line and exits non-zero; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import EngineError, ModelNotFoundError, ProvisioningError

__all__ = [
    "ActuatorError",
    "BadRequestError",
    "CanarydError",
    "CannotJudgeError",
    "ConfigError",
    "DatabaseError",
    "DurationError",
    "EngineError",
    "MetricUnavailableError",
    "MissingReportExtraError",
    "ModelNotFoundError",
    "ProbeError",
    "PromptFileError",
    "ProvisioningError",
    "RecordRejectedError",
    "RunNotFoundError",
    "SinceError",
    "StatusServerError",
    "TrafficSinkError",
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


class RecordRejectedError(DatabaseError):
    """The database refused a record for what it holds (a number out of range, a
    character it cannot store): the database is fine, and retrying cannot help."""

    def __init__(self, action: str, reason: str) -> None:
        self.action, self.reason = action, reason
        super().__init__(f"{action} was refused by the database: {reason}")


class MetricUnavailableError(CanarydError, ImportError):
    def __init__(self, metric: str, missing: str) -> None:
        super().__init__(
            f"scoring metric {metric!r} needs {missing!r}, which is not installed: "
            f"reinstall canaryd-specdec (`pip install -e .`)"
        )


class MissingReportExtraError(CanarydError, ImportError):
    """The report's plots on an install without the `report` extra (matplotlib)."""

    def __init__(self, package: str) -> None:
        self.package = package
        super().__init__(
            f"the report's plots need {package!r}, which is not installed: install "
            "canaryd-specdec[report] (pip install 'canaryd-specdec[report]')"
        )


class ActuatorError(CanarydError, RuntimeError):
    """One switch actuator could not apply the switch state (after its retries)."""

    def __init__(self, actuator: str, reason: str) -> None:
        self.actuator, self.reason = actuator, reason
        super().__init__(f"switch actuator {actuator!r} failed: {reason}")


class DurationError(CanarydError, ValueError):
    """Not a positive number followed by one unit: s, m, h, d or w."""

    def __init__(self, value: str) -> None:
        self.value = value
        super().__init__(f"{value!r} is not a duration like 90s, 30m, 24h, 7d or 2w")


class SinceError(CanarydError, ValueError):
    """A `--since` that is neither a duration back from now nor an ISO 8601 time."""

    def __init__(self, value: str) -> None:
        self.value = value
        super().__init__(
            f"--since {value!r}: expected a duration (90s, 30m, 24h, 7d, 2w) or an ISO time "
            f"(2025-12-01T08:00:00+00:00; no zone means UTC)"
        )


class RunNotFoundError(CanarydError, LookupError):
    """A run id the database does not hold."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} in the database; `canaryd status` lists the latest")


class StatusServerError(CanarydError, OSError):
    """The status server could not listen on its configured address."""

    def __init__(self, listen: str, reason: str) -> None:
        self.listen, self.reason = listen, reason
        super().__init__(
            f"cannot serve /metrics on {listen!r}: {reason}: set server.listen "
            f"(or CANARYD_SERVER__LISTEN) to a free host:port"
        )


class TrafficSinkError(CanarydError, OSError):
    """The mirror sink could not listen on its configured address."""

    def __init__(self, listen: str, reason: str) -> None:
        self.listen, self.reason = listen, reason
        super().__init__(
            f"cannot serve the mirror sink on {listen!r}: {reason}: set traffic.listen "
            f"(or CANARYD_TRAFFIC__LISTEN) to a free host:port"
        )


class BadRequestError(CanarydError, ValueError):
    """A request to the status port that canaryd cannot act on: `key` names the query
    parameter, header or body field at fault (answered 400)."""

    def __init__(self, key: str, reason: str) -> None:
        self.key, self.reason = key, reason
        super().__init__(f"{key}: {reason}")


class CannotJudgeError(CanarydError, RuntimeError):
    """canaryd itself cannot judge a revision now: the database is away, or no gate run
    completed within the freshness bound (answered 503, never a verdict)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"cannot judge: {reason}")


class ProbeError(CanarydError, RuntimeError):
    """The capability probe cannot run: an arm is not an OpenAI-compatible server, or it
    does not answer the plain request every capability starts from."""

    def __init__(self, arm: str, reason: str) -> None:
        self.arm, self.reason = arm, reason
        super().__init__(f"probe: arms.{arm}: {reason}")
