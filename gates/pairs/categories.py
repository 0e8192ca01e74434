"""Per-category checks: a window's pairs grouped by prompt category, each category's share
of a detector's false-alarm budget and one gate decision from the categories' checks
(reading them back, for the switch policy, is `gates.core`'s: it needs only decisions).

Under `gates.policy.scope = "category"` the speedup and quality gates judge each category
on its own pairs, as drift always does, so the switch can turn speculation off only where
it loses. A detector's share of the budget is split between the categories it judges by
their share of its pairs: category c, with share s_c of the pairs and C categories in
all, gets ARL0 = C × s_c × ARL0 (in its own pairs). Its false alarms per pair of all
traffic are then s_c / (C × s_c × ARL0) = 1 / (C × ARL0), and the C of them add up to the
one detector's 1 / ARL0: adding categories never raises the gate's false-alarm rate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TypeVar

from gates.config_base import GateConfigBase
from gates.core import GateDecision, GateState
from gates.records import PairRecord
from gates.window import Window, combined

T = TypeVar("T")


def group_by_category(
    records: Sequence[PairRecord], value: Callable[[PairRecord], T | None]
) -> dict[str, list[T]]:
    """Per category (sorted), the non-None `value` of each record, in record order."""
    grouped: dict[str, list[T]] = {}
    for record in records:
        measured = value(record)
        if measured is not None:
            grouped.setdefault(record.prompt.category, []).append(measured)
    return dict(sorted(grouped.items()))


def category_arl0(counts: Mapping[str, int], category: str, arl0: float) -> float:
    """The in-control ARL0 of `category`'s detector when a detector of ARL0 `arl0` is split
    between the categories of `counts` (pairs per category) by their share of the pairs."""
    total = sum(counts.values())
    if total <= 0 or counts.get(category, 0) <= 0:
        return max(1.0, arl0)
    share = counts[category] / total
    return max(1.0, len(counts) * share * arl0)


def combine_categories(
    name: str,
    config: GateConfigBase,
    window: Window,
    now: datetime,
    components: Sequence[GateDecision],
    notes: Sequence[str] = (),
) -> GateDecision:
    """The gate's decision from its per-category checks: the worst decides, and a FAIL or
    WARN names the categories in that state (`categories`), largest evidence first as
    `combined` lifts it."""
    result = combined(name, config, window, now, components, notes)
    if result.state in (GateState.FAIL, GateState.WARN):
        flagged = tuple(
            sorted(c.category for c in components if c.state is result.state and c.category)
        )
        result = combined(name, config, window, now, components, notes, categories=flagged)
    return result
