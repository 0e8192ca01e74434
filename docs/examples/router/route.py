"""A router's reading of canaryd's state file (docs/switch.md): whether one request may
use the speculative arm. `state` is the parsed file after the whole-file checks (it
parses, `confirmed_at` is fresh, `generation` is not lower than the highest seen);
`request` is the OpenAI request body (chat or completions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def speculate(state: dict[str, Any], category: str | None) -> bool:
    # `state` passed the whole-file checks (parsed, fresh, generation not lower).
    if state.get("speculative_enabled") is not True:
        return False  # the master is off: off for everyone
    own = state.get("categories", {}).get(category or "")
    return own is None or own.get("speculative_enabled") is True


RULES: dict[str, Callable[[Any], bool]] = {
    # set: present and not null, false or empty (a seed of 0 is set)
    "set": lambda v: v is not None and v is not False and v not in ("", [], {}),
    "gt_1": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 1,
    "eq_1": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v == 1,
}


def to_baseline(state: dict[str, Any], request: dict[str, Any]) -> bool:
    # True when the request uses a capability the speculative arm lacks (the latest
    # probe's `route_to_baseline`); a rule this router does not know matches whenever
    # the field is present: the baseline is always correct, only slower.
    routes = state.get("route_to_baseline") or {}
    for capability in (routes.get("capabilities") or {}).values():
        for field, rule in (capability.get("fields") or {}).items():
            if field in request and RULES.get(rule, lambda v: True)(request[field]):
                return True
    return False


def use_speculative(state: dict[str, Any], category: str | None, request: dict[str, Any]) -> bool:
    return speculate(state, category) and not to_baseline(state, request)
