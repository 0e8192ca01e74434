"""What every CLI command shares: turning `CanarydError` into one line and an exit code.

Light at import (no engines, no scoring, no database driver): the kill switch imports
this module, and an operator in an incident waits for every import it makes."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import typer

from canaryd.errors import CanarydError, EngineError
from engine.errors import MissingExtraError, missing_local_package

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from canaryd.config import Settings
    from engine.base import Engine

P = ParamSpec("P")
R = TypeVar("R")


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `canaryd: error: …` on stderr and return the Exit to raise."""
    print(f"canaryd: error: {message}", file=sys.stderr)
    return typer.Exit(code)


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """A user-facing error becomes one line on stderr and a non-zero exit, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (CanarydError, EngineError) as exc:
            raise fail(str(exc), exc.exit_code) from None
        except ImportError as exc:  # a local feature on an install without the extra
            package = missing_local_package(exc)
            if package is None:
                raise
            raise fail(str(MissingExtraError("this command", package))) from None

    return wrapper


def load_arms(settings: Settings, console: Console) -> dict[str, Engine]:
    """Build every arm and load it (warm-up included) behind a spinner on `console`;
    by name, `baseline` first."""
    from canaryd.pairs.plan import build_arms  # the engines: only commands that generate

    engines = build_arms(settings)
    with console.status("loading and warming up engines…", spinner="dots"):
        for engine in engines.values():
            engine.load()
    return engines


def progress_bar(console: Console, label_width: int) -> Progress:
    """A bar per task on `console`: label, bar, done/total, elapsed; silent when the
    console is not a terminal (logs and pipes get no control characters)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(f"{{task.description:<{label_width}}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    )
