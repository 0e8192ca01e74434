"""Go's duration strings (`time.ParseDuration`), as Argo's `interval` and Flagger's
`interval` and webhook `timeout` are written: `1m`, `30s`, `1h30m`, `500ms`."""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(text: str) -> float:
    """The duration in seconds; ValueError for what Go would refuse ("0" is zero)."""
    text = text.strip()
    if text == "0":
        return 0.0
    position, total = 0, 0.0
    while position < len(text):
        match = _PART.match(text, position)
        if match is None:
            raise ValueError(f"not a Go duration: {text!r}")
        total += float(match[1]) * _UNIT_S[match[2]]
        position = match.end()
    if not text:
        raise ValueError("empty duration")
    return total
