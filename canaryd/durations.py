"""Spans of time as a person types them: `parse_duration` reads `90s`, `30m`, `24h`, `7d`
or `2w`, and `parse_since` turns such a duration, or an ISO 8601 time, into the start of
a window ending now — the one reading of every `--since` and report window."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from canaryd.errors import DurationError, SinceError

__all__ = ["DEFAULT_SINCE", "parse_duration", "parse_since"]

DEFAULT_SINCE = "24h"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """A positive number and one unit (s, m, h, d, w); `DurationError` otherwise."""
    match = _DURATION.match(text.strip())
    if not match or float(match[1]) <= 0:
        raise DurationError(text)
    return timedelta(seconds=float(match[1]) * _UNIT_S[match[2]])


def parse_since(text: str, now: datetime) -> datetime:
    """A duration back from `now`, or an ISO 8601 time (no zone: UTC); `SinceError`
    otherwise."""
    try:
        return now - parse_duration(text)
    except DurationError:
        pass
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise SinceError(text) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
