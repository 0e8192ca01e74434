"""Upper bounds on every duration and count a configuration may hold.

A value far beyond any sane setting is a typo (`1e12` for `12`), and it does harm: a
cooldown of 1e12 seconds overflows the date arithmetic of every gate run, so the gates
raise instead of tripping, which disarms the switch as surely as `inf` would. Each
configuration model of canaryd's packages reuses `check_bounds` as a validator of every
field, so a bad value is refused at load, with its key, before anything runs.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationInfo

__all__ = ["MAX_COUNT", "MAX_DURATION_S", "MAX_RETENTION_DAYS", "check_bounds"]

MAX_DURATION_S = 366 * 86_400.0  # a duration beyond a year is a typo
MAX_RETENTION_DAYS = 3660.0  # history may be kept for up to ten years
MAX_COUNT = 1_000_000_000  # pairs, tokens, retries, samples: far beyond any real setting

# Fields in seconds whose names carry no unit (HTTP timeouts).
_SECONDS_FIELDS = frozenset({"connect", "read", "total"})
_UNBOUNDED = frozenset({"seed"})  # any integer is a valid seed


def _limit(name: str) -> tuple[float, str] | None:
    if name in _UNBOUNDED or name.endswith("_per_30_days"):  # a rate, not a duration
        return None
    if name.endswith("_retention_days"):
        return MAX_RETENTION_DAYS, f"{MAX_RETENTION_DAYS:g} days (ten years)"
    if name.endswith(("_days",)):
        return MAX_DURATION_S / 86_400, "366 days"
    if name.endswith(("_s", "_seconds")) or name in _SECONDS_FIELDS:
        return MAX_DURATION_S, f"{MAX_DURATION_S:.0f} s (366 days)"
    return None


def check_bounds(value: Any, info: ValidationInfo) -> Any:
    """A field validator: refuse a duration or a count above its bound."""
    name = info.field_name or ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    limit = _limit(name)
    if limit is not None:
        bound, said = limit
        if value > bound:
            raise ValueError(f"{value:g} is too long: at most {said}; a typo?")
    elif isinstance(value, int) and name not in _UNBOUNDED and value > MAX_COUNT:
        raise ValueError(f"{value} is too large: at most {MAX_COUNT:,}; a typo?")
    return value
