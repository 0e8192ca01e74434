"""The switch as an nginx routing map: which upstream, baseline or speculative, serves a
request of each category, by the rules a router applies to the state file.

`routes` reads a state object as docs/switch.md tells a router to (master first, then the
request's category; a missing, unconfirmed, stale or `pending_sync` file turns
speculation off for everyone), `render_map` writes those routes as an nginx `map` block
keyed on the category header, and `write_map` replaces the map file atomically, never
with an older generation, only when what it routes changed, and runs the reload command
then. `canaryd switch nginx-map` (the command hook on each switch generation, and a timer
that applies freshness between generations) is its CLI.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from canaryd.switch.statefile import CONFIRMED_AT, PENDING_SYNC, generation_of

__all__ = [
    "BASELINE",
    "SPECULATIVE",
    "MapWrite",
    "Routes",
    "header_variable",
    "map_generation",
    "render_map",
    "routes",
    "write_map",
]

BASELINE = "baseline"
SPECULATIVE = "speculative"
_GENERATION_LINE = re.compile(r"^# canaryd routes, generation (-?\d+)", re.MULTILINE)
# nginx map keys are quoted here; a category name that would need escaping is no prompt
# category canaryd knows, so it is left to the default rather than quoted wrongly.
_CATEGORY = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Words a `map` block reads as its own parameters, quoted or not; as a source value each
# must be escaped with a backslash (nginx's map documentation), or `nginx -t` fails and a
# category named so (`default` is canaryd's own default model name) never routes.
MAP_KEYWORDS = frozenset({"default", "hostnames", "include", "volatile"})
_RELOAD_OUTPUT_TAIL = 300


@dataclass(frozen=True)
class Routes:
    """Where requests go: `default` for every category not in `overrides` (or a request
    without one), `why` in one line, and the state's `generation` (-1: no state)."""

    default: str
    why: str
    generation: int
    overrides: dict[str, str] = field(default_factory=dict)


def routes(
    state: dict[str, Any] | None,
    *,
    now: datetime,
    max_age: timedelta,
    delivered: bool = False,
) -> Routes:
    """The routes a state object asks for. `delivered` is a state handed over by canaryd
    itself (the command hook's CANARYD_SWITCH_JSON): current by definition, so it needs no
    `confirmed_at`; a state read from the file needs one at most `max_age` old."""
    generation = generation_of(state)
    if state is None:
        return Routes(BASELINE, "no readable state file: speculation off", generation)
    if state.get(PENDING_SYNC) is True:
        return Routes(
            BASELINE,
            "kill switch written while the database was down: speculation off",
            generation,
        )
    if state.get("speculative_enabled") is not True:
        return Routes(BASELINE, f"switch off: {state.get('reason') or 'rolled back'}", generation)
    if not delivered:
        confirmed = _confirmed_at(state)
        if confirmed is None:
            return Routes(
                BASELINE, "state never confirmed by a gate run: speculation off", generation
            )
        if now - confirmed > max_age:
            return Routes(
                BASELINE,
                f"state stale: confirmed at {confirmed.isoformat()}, more than "
                f"{max_age.total_seconds():g}s ago (canaryd stopped judging): speculation off",
                generation,
            )
    categories = state.get("categories")
    off = sorted(
        name
        for name, own in (categories.items() if isinstance(categories, dict) else ())
        if isinstance(own, dict) and own.get("speculative_enabled") is not True
    )
    why = "speculation on" + (f" except {', '.join(off)}" if off else "")
    return Routes(SPECULATIVE, why, generation, {name: BASELINE for name in off})


def _confirmed_at(state: dict[str, Any]) -> datetime | None:
    value = state.get(CONFIRMED_AT)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def header_variable(header: str) -> str:
    """nginx's variable for a request header: `X-Canaryd-Category` → `$http_x_canaryd_category`."""
    return "$http_" + header.strip().lower().replace("-", "_")


def render_map(
    found: Routes,
    *,
    header: str = "X-Canaryd-Category",
    variable: str = "canaryd_upstream",
    speculative_upstream: str = SPECULATIVE,
    baseline_upstream: str = BASELINE,
) -> str:
    """An nginx `map` from the category header to the upstream's name in `$variable`; the
    first line names the generation (read back by `map_generation`)."""
    for name, value in (
        ("variable", variable),
        ("upstream", speculative_upstream),
        ("upstream", baseline_upstream),
    ):
        if not _NAME.match(value):
            raise ValueError(f"nginx {name} name {value!r} must match {_NAME.pattern}")
    upstream = {SPECULATIVE: speculative_upstream, BASELINE: baseline_upstream}
    lines = [
        f"# canaryd routes, generation {found.generation}: rendered by `canaryd switch "
        "nginx-map`; do not edit",
        f"# {_one_line(found.why)}",  # a reason may hold newlines
        f"map {header_variable(header)} ${variable} {{",
        f"    default {upstream[found.default]};",
    ]
    skipped = [name for name in found.overrides if not _CATEGORY.match(name)]
    lines += [
        f"    {_map_key(name)} {upstream[target]};"
        for name, target in sorted(found.overrides.items())
        if name not in skipped
    ]
    lines.append("}")
    if skipped:
        lines.append(f"# categories left to the default (not nginx-safe names): {skipped!r}")
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    """`text` on one line: a switch reason may hold newlines (anyone with the CLI sets it)."""
    return " ".join(text.split())


def _map_key(category: str) -> str:
    """A category as a map source value: quoted, or backslash-escaped for a map keyword."""
    return f"\\{category}" if category in MAP_KEYWORDS else f'"{category}"'


def map_generation(text: str | None) -> int:
    """The generation a rendered map was made from; -1 when it names none."""
    match = _GENERATION_LINE.search(text or "")
    return int(match[1]) if match else -1


@dataclass(frozen=True)
class MapWrite:
    """What `write_map` did: `written` (the file changed), `reloaded` (the reload command
    ran and succeeded), and a line for a person."""

    written: bool
    reloaded: bool
    message: str


def write_map(
    path: Path,
    text: str,
    found: Routes,
    reload_command: str | None = None,
    timeout_s: float = 30.0,
) -> MapWrite:
    """Replace `path` with `text` when the routes differ from the file's, then run
    `reload_command` (split like a shell line, run without one). An older generation than
    the file's never replaces it, unless it turns speculation off (the safe side, acted
    on whatever its generation). Raises `OSError` when the file cannot be written and
    `RuntimeError` when the reload fails."""
    try:
        current: str | None = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = None
    on_file = map_generation(current)
    if found.generation < on_file and found.default != BASELINE:
        return MapWrite(
            False,
            False,
            f"{path}: kept generation {on_file} (generation {found.generation} is older)",
        )
    if current is not None and _routing_lines(current) == _routing_lines(text):
        return MapWrite(False, False, f"{path}: unchanged ({_one_line(found.why)})")
    _replace(path, text)
    if not reload_command:
        return MapWrite(True, False, f"{path}: written ({_one_line(found.why)})")
    try:
        _reload(reload_command, timeout_s)
    except RuntimeError:
        # Put the map nginx still routes by back, so the file says what is in force and
        # the next run (the hook's retry, the timer) sees a change and reloads again.
        if current is None:
            with contextlib.suppress(OSError):
                path.unlink()
        else:
            _replace(path, current)
        raise
    return MapWrite(True, True, f"{path}: written and reloaded ({_one_line(found.why)})")


def _routing_lines(text: str) -> list[str]:
    """The map without its comments: a new generation or reason that routes the same
    needs no reload."""
    return [line for line in text.splitlines() if not line.lstrip().startswith("#")]


def _replace(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        Path(temp).chmod(0o644)
        Path(temp).replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(temp).unlink()
        raise


def _reload(command: str, timeout_s: float) -> None:
    argv = shlex.split(command)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"reload command {argv[0]!r} timed out after {timeout_s:g}s") from None
    except OSError as exc:
        raise RuntimeError(f"cannot run reload command {argv[0]!r}: {exc}") from exc
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip()[-_RELOAD_OUTPUT_TAIL:]
        raise RuntimeError(
            f"reload command {argv[0]!r} exited with {done.returncode}: {output!r} "
            "(the map file is back as it was; nginx still routes by it)"
        )
