"""Degeneration detection: does an output end in a repetition loop?

Definition (on token ids, or on any sequence of hashable units): an output is in a
**repetition loop** when its tail is a unit of `period` tokens (1 ≤ period ≤
`max_period`, default 32) repeated back-to-back — the last copy may be cut short, as
when generation stops at `max_tokens` mid-loop — such that the periodic tail

* holds at least `min_repeats` copies (default 4, i.e. ≥ 4 × period tokens),
* is at least `min_span` tokens long (default 16, so a long number such as
  "1000000000", whose digits tokenizers split one by one, is not a loop), and
* covers at least `min_coverage` of the output (default 0.3).

Only the tail is examined: a greedy decoder that falls into a loop stays in it until
the token limit. Repeated common words, numbered lists and code with similar lines
are not periodic at the end of the output and do not count; a repeated-n-gram ratio
would flag them, so canaryd does not use one.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RepetitionLoop:
    """The periodic tail of an output: `span` tokens, starting at `start`."""

    period: int
    start: int
    span: int

    @property
    def repeats(self) -> float:
        """Copies of the unit in the tail, fractional when the last one is cut short."""
        return self.span / self.period


def find_repetition_loop(
    tokens: Sequence[Hashable],
    *,
    max_period: int = 32,
    min_repeats: int = 4,
    min_span: int = 16,
    min_coverage: float = 0.3,
) -> RepetitionLoop | None:
    """The shortest-period repetition loop at the end of `tokens`, or None (see module)."""
    n = len(tokens)
    needed = max(min_span, min_coverage * n)
    for period in range(1, min(max_period, n // min_repeats) + 1):
        # Walk back from the end while each token equals the one a period earlier.
        i = n - 1
        while i >= period and tokens[i] == tokens[i - period]:
            i -= 1
        span = n - 1 - i + period  # the matched run plus the first copy of the unit
        if span >= min_repeats * period and span >= needed:
            return RepetitionLoop(period=period, start=n - span, span=span)
    return None


def has_repetition_loop(tokens: Sequence[Hashable]) -> bool:
    """Whether `tokens` ends in a repetition loop with the default thresholds."""
    return find_repetition_loop(tokens) is not None
