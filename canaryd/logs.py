"""structlog set-up: JSON lines under systemd/journald or when stderr is not a terminal, a
readable console renderer on a TTY. Logs go to stderr so that stdout stays machine-readable.

`configure_logging` honours `LoggingConfig` (level, format, include_text). Prompt and
output text may be sensitive: the keys in `TEXT_KEYS` are removed from every event unless
`include_text` is set, so a stray `log.info(..., prompt_text=...)` cannot leak them.
Credentials never reach a log line: every event, its rendered exception included, is
passed through `canaryd.redact` (URL passwords, secret parameters, values under
secret-named keys). The standard library's loggers (APScheduler, SQLAlchemy) are
rendered, and redacted, the same way.

A short command that rarely logs (the kill switch) defers all of it: `deferred_logging`
imports and configures structlog when the first event is logged, and `get_logger` names a
logger that imports structlog only then, so a command that logs nothing never imports it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from canaryd.redact import redact_value

if TYPE_CHECKING:
    from canaryd.config import LoggingConfig

TEXT_KEYS = frozenset({"prompt_text", "baseline_text", "speculative_text"})


def under_journald() -> bool:
    """True when stderr is connected to the systemd journal (systemd sets JOURNAL_STREAM)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    if not stream:
        return False
    try:
        stat = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stream == f"{stat.st_dev}:{stat.st_ino}"


def _use_json(fmt: str) -> bool:
    if fmt == "json":
        return True
    if fmt == "console":
        return False
    return under_journald() or not sys.stderr.isatty()


def _drop_text(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key in TEXT_KEYS & event_dict.keys():
        del event_dict[key]
    return event_dict


def _redact(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    redacted = redact_value(dict(event_dict))
    event_dict.clear()
    event_dict.update(redacted)
    return event_dict


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at the time (as `logging.lastResort` does), so a
    test's replaced and then closed stderr is never written to afterwards."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)  # StreamHandler.__init__ would pin today's stream

    @property  # read-only: always the current stderr
    def stream(self) -> Any:
        return sys.stderr


def configure_logging(
    config: LoggingConfig | None = None, *, json: bool | None = None, level: str | None = None
) -> None:
    """Configure structlog and the stdlib root logger; keywords override `config`."""
    import structlog

    from canaryd.config import LoggingConfig

    global _pending
    _pending = None
    config = config or LoggingConfig()
    use_json = _use_json(config.format) if json is None else json
    level_name = (level or config.level).upper()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if not config.include_text:
        shared.append(_drop_text)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, _redact, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level_name]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _redact,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    # Third-party INFO (APScheduler's "Added job", SQLAlchemy) is noise for an operator.
    root.setLevel(max(logging.WARNING, logging.getLevelNamesMapping()[level_name]))
    # APScheduler warns on every run an overrunning cycle coalesces away; the daemon
    # reports an overrun itself (`cycle.overrun`), once per cycle.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)


# The keywords of the `configure_logging` that `deferred_logging` holds back, if any.
_pending: dict[str, Any] | None = None


def _configure_pending() -> None:
    if _pending is not None:
        configure_logging(**_pending)


class _DeferredHandler(_StderrHandler):
    """The root logger's handler while logging is deferred: the first record configures
    logging (which replaces this handler) and goes to the configured handler."""

    def emit(self, record: logging.LogRecord) -> None:
        _configure_pending()
        root = logging.getLogger()
        configured = [
            h
            for h in root.handlers
            if isinstance(h, _StderrHandler) and not isinstance(h, _DeferredHandler)
        ]
        for handler in configured if record.levelno >= root.level else []:
            handler.handle(record)


@contextmanager
def deferred_logging(*, level: str) -> Iterator[None]:
    """Within: `configure_logging(level=level)` happens when the first event is logged
    (through `get_logger` or the standard library), not before."""
    global _pending
    _pending = {"level": level}
    root = logging.getLogger()
    handler = _DeferredHandler()
    root.addHandler(handler)
    try:
        yield
    finally:
        _pending = None
        root.removeHandler(handler)


class _FirstUseLogger:
    """A structlog logger that imports structlog (and applies a deferred configuration)
    when a method is first called on it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, method: str) -> Any:
        import structlog

        _configure_pending()
        return getattr(structlog.get_logger(self._name), method)


def get_logger(name: str) -> Any:
    """`structlog.get_logger(name)`, imported on first use (see `deferred_logging`)."""
    return _FirstUseLogger(name)
