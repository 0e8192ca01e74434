"""Why acceptance dropped: the engine, or the traffic?

With live traffic mirrored beside the suites, the suites are the control — a fixed set of
prompts that only an engine change can move — and the live prompts the treatment. When
the drift gate flags categories, `attribute_drift` reads the window's pairs:

- **engine**: a control (suite) category dropped too, on the same prompts it was pinned
  from; the drift gate acts as it always has.
- **traffic**: every monitored control category held, live categories dropped, and the
  live traffic's mix moved between the window's older and newer halves (the categories'
  shares, by total variation distance, or the mean prompt length in tokens). Speculation
  may still pay on the new traffic, or no longer: that is the speedup gate's question,
  so the drift gate only WARNs on those categories and names the cause.
- **unclear**: live categories dropped with the controls held, but the mix did not move
  measurably (or no control category is monitored): the drift gate acts as usual.

Pure: the window's records in, a verdict out; nothing is read from anywhere else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from gates.records import PairRecord

__all__ = [
    "MIX_LENGTH_CHANGE",
    "MIX_SHARE_DISTANCE",
    "Attribution",
    "MixShift",
    "attribute_drift",
    "mix_shift",
]

# The live mix moved when the categories' shares differ by this total variation distance
# between the window's halves, or the mean prompt length by this relative change.
MIX_SHARE_DISTANCE = 0.2
MIX_LENGTH_CHANGE = 0.25
_MIN_HALF = 10  # live pairs in each half, else the mix cannot be compared

Cause = Literal["engine", "traffic", "unclear"]


@dataclass(frozen=True, slots=True)
class MixShift:
    """How the live traffic's mix moved from the window's older half to its newer half."""

    share_distance: float  # total variation distance of the categories' shares
    prompt_tokens_before: float
    prompt_tokens_after: float

    @property
    def length_change(self) -> float:
        if self.prompt_tokens_before <= 0:
            return 0.0
        return self.prompt_tokens_after / self.prompt_tokens_before - 1.0

    @property
    def moved(self) -> bool:
        return (
            self.share_distance >= MIX_SHARE_DISTANCE
            or abs(self.length_change) >= MIX_LENGTH_CHANGE
        )

    def describe(self) -> str:
        return (
            f"category shares moved by {self.share_distance:.2f} (TVD), mean prompt "
            f"{self.prompt_tokens_before:.0f} → {self.prompt_tokens_after:.0f} tokens"
        )


@dataclass(frozen=True, slots=True)
class Attribution:
    """The cause and the reason the drift gate's evidence carries; `live` names the
    dropped live categories a traffic cause covers."""

    cause: Cause
    reason: str
    live: tuple[str, ...] = ()


def mix_shift(records: Sequence[PairRecord]) -> MixShift | None:
    """The live mix's move across the window (by start time); None with too few live
    pairs in either half to say."""
    live = sorted((r for r in records if r.source == "live"), key=lambda r: r.started_at)
    half = len(live) // 2
    if half < _MIN_HALF:
        return None
    older, newer = live[:half], live[half:]

    def shares(part: Sequence[PairRecord]) -> Counter[str]:
        return Counter(r.prompt.category for r in part)

    before, after = shares(older), shares(newer)
    distance = 0.5 * sum(
        abs(before[c] / len(older) - after[c] / len(newer)) for c in set(before) | set(after)
    )

    def mean_tokens(part: Sequence[PairRecord]) -> float:
        return sum(r.baseline.prompt_tokens for r in part) / len(part)

    return MixShift(distance, mean_tokens(older), mean_tokens(newer))


def attribute_drift(
    records: Sequence[PairRecord], flagged: Collection[str], monitored: Collection[str]
) -> Attribution | None:
    """The cause of a drift in the `flagged` categories, from the window's `records`
    (`monitored`: the categories with a reference); None without live pairs (suites
    only: nothing to attribute)."""
    if not flagged:
        return None
    live_pairs: Counter[str] = Counter()
    control_pairs: Counter[str] = Counter()
    for record in records:
        (live_pairs if record.source == "live" else control_pairs)[record.prompt.category] += 1
    if not live_pairs:
        return None
    control = {c for c in control_pairs if control_pairs[c] >= live_pairs[c]}
    dropped_control = sorted(c for c in flagged if c in control)
    dropped_live = sorted(c for c in flagged if c not in control)
    held = sorted(c for c in control if c in monitored and c not in flagged)
    if dropped_control:
        return Attribution(
            "engine",
            f"cause: engine — the control suites dropped too ({', '.join(dropped_control)}), "
            "on the prompts their references were pinned from",
        )
    if not held:
        return Attribution(
            "unclear",
            f"cause: unclear — live categories dropped ({', '.join(dropped_live)}) and no "
            "control category is monitored to tell an engine change from a traffic change",
        )
    shift = mix_shift(records)
    if shift is None or not shift.moved:
        measured = shift.describe() if shift is not None else "too few live pairs to compare"
        return Attribution(
            "unclear",
            f"cause: unclear — controls held ({', '.join(held)}), live dropped "
            f"({', '.join(dropped_live)}), but the live mix did not move measurably "
            f"({measured})",
        )
    return Attribution(
        "traffic",
        f"cause: traffic — controls held ({', '.join(held)}), live dropped "
        f"({', '.join(dropped_live)}) and the live mix moved ({shift.describe()}); not a "
        "rollback: the speedup gate judges whether speculation still pays on this traffic",
        tuple(dropped_live),
    )
