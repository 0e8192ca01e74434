"""Which mirrored requests become live pairs: bounded, per minute window, fair.

`LiveSampler.offer` sees every usable mirrored request. A request whose prompt is longer
than `max_prompt_chars`, whose prompt hash was seen within `dedup_window_s`, or whose
category would be one too many in its window is counted and forgotten. The rest enter
their category's reservoir for the current minute (Algorithm R, `per_category` slots):
every request of the minute has the same chance to be kept, however early a burst came.
When the minute ends the reservoirs are drawn round-robin over the categories, in a
random order, until `per_minute` are chosen, so one busy category cannot crowd out the
others; those go to the queue the daemon takes from (at most `queue_size`; when it is
full, the newly chosen are dropped). Every request is counted under exactly one outcome
(`OUTCOMES`), so `received` equals their sum once its window has closed. Memory is bounded:
the reservoirs by `per_category` x `max_categories`, the queue by `queue_size`, the
dedup memory by `DEDUP_CAPACITY` hashes. Thread-safe: the sink offers on its event loop,
the daemon takes on its cycle thread.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from canaryd.config import TrafficConfig
from canaryd.traffic.mix import WindowMix, window_mix
from canaryd.traffic.requests import LiveRequest

__all__ = ["DEDUP_CAPACITY", "OUTCOMES", "LiveSampler", "SamplingBounds"]

# Prompt hashes remembered for dedup at most (the oldest are forgotten first): about
# 1.5 MB, whatever the traffic.
DEDUP_CAPACITY: Final = 10_000
WINDOW_S: Final = 60.0
# How a mirrored request ended, each counted once: `sampled` (queued for a live pair),
# `rate_limited` (beyond the per-minute bounds), `duplicate`, `too_long`, `categories`
# (its category would exceed max_categories in its window), `queue_full` (chosen while
# the queue was full: the daemon runs fewer live pairs than arrive); and, at the HTTP
# layer, `unauthorized`, `too_large` (body over max_body_bytes), `too_slow` (body not
# whole within the request deadline), `unusable` (not a body a pair can replay, however
# malformed), `unlisted` (no category of traffic.categories, refused by
# traffic.unknown_category), `not_found`, `busy` (answered 503: beyond the server's open
# connections).
OUTCOMES: Final = (
    "sampled",
    "rate_limited",
    "duplicate",
    "too_long",
    "categories",
    "queue_full",
    "unauthorized",
    "too_large",
    "too_slow",
    "unusable",
    "unlisted",
    "not_found",
    "busy",
)


@dataclass(frozen=True, slots=True)
class SamplingBounds:
    per_minute: int
    per_category: int
    queue_size: int
    dedup_window_s: float
    max_prompt_chars: int
    max_categories: int

    @classmethod
    def of(cls, config: TrafficConfig) -> SamplingBounds:
        """The bounds `[traffic]` configures."""
        return cls(
            per_minute=config.max_prompts_per_minute,
            per_category=config.max_per_category_per_minute,
            queue_size=config.queue_size,
            dedup_window_s=config.dedup_window_s,
            max_prompt_chars=config.max_prompt_chars,
            max_categories=config.max_categories,
        )


class _Reservoir:
    """Algorithm R over one category's requests in one window."""

    __slots__ = ("kept", "seen")

    def __init__(self) -> None:
        self.kept: list[LiveRequest] = []
        self.seen = 0


class LiveSampler:
    """Bounded, fair sampling of mirrored requests into a queue (see the module).

    `observe(outcome, n)` is called with every count and `on_window` with each closed
    window's traffic mix (the daemon's metrics); `clock` is monotonic seconds, windows
    are `window_s` long."""

    def __init__(
        self,
        bounds: SamplingBounds,
        *,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = WINDOW_S,
        observe: Callable[[str, int], None] | None = None,
        on_window: Callable[[WindowMix], None] | None = None,
    ) -> None:
        self.bounds = bounds
        self._rng = random.Random(seed)  # noqa: S311  (sampling, not security)
        self._clock = clock
        self._window_s = window_s
        self._observe = observe
        self._on_window = on_window
        self._lock = threading.Lock()
        self._window = self._window_of(clock())
        self._reservoirs: dict[str, _Reservoir] = {}
        self._queue: deque[LiveRequest] = deque()
        self._seen: OrderedDict[str, float] = OrderedDict()
        self.counts: dict[str, int] = dict.fromkeys(("received", *OUTCOMES), 0)
        self.sampled_by_window: deque[int] = deque(maxlen=64)  # the last windows' totals

    def _window_of(self, now: float) -> int:
        return int(now // self._window_s)

    def count(self, outcome: str, n: int = 1) -> None:
        """Count `n` requests received and never offered, under `outcome` (the HTTP
        layer's: unauthorized, too large, too slow, unusable, unlisted, not found)."""
        with self._lock:
            self.counts["received"] += n
            self._count(outcome, n)

    def _count(self, outcome: str, n: int) -> None:
        if n <= 0:
            return
        self.counts[outcome] += n
        if self._observe is not None:
            self._observe(outcome, n)

    def offer(self, request: LiveRequest) -> str:
        """Consider one usable request; its outcome so far (`candidate` while it waits
        in its window's reservoir)."""
        bounds = self.bounds
        with self._lock:
            now = self._clock()
            self._roll(now)
            self.counts["received"] += 1
            if request.prompt_chars > bounds.max_prompt_chars:
                self._count("too_long", 1)
                return "too_long"
            if self._duplicate(request.prompt_hash, now):
                self._count("duplicate", 1)
                return "duplicate"
            reservoir = self._reservoirs.get(request.category)
            if reservoir is None:
                if len(self._reservoirs) >= bounds.max_categories:
                    self._count("categories", 1)
                    return "categories"
                reservoir = self._reservoirs[request.category] = _Reservoir()
            reservoir.seen += 1
            if len(reservoir.kept) < bounds.per_category:
                reservoir.kept.append(request)
                return "candidate"
            slot = self._rng.randrange(reservoir.seen)
            if slot < bounds.per_category:
                reservoir.kept[slot] = request  # the one it replaces is out
            self._count("rate_limited", 1)
            return "candidate" if slot < bounds.per_category else "rate_limited"

    def _duplicate(self, digest: str, now: float) -> bool:
        window = self.bounds.dedup_window_s
        seen = self._seen
        while seen:
            oldest, at = next(iter(seen.items()))
            if now - at < window and len(seen) < DEDUP_CAPACITY:
                break
            del seen[oldest]
        if digest in seen:
            return True
        seen[digest] = now
        return False

    def _roll(self, now: float) -> None:
        window = self._window_of(now)
        if window != self._window:
            self._close()
            self._window = window

    def _close(self) -> None:
        """Draw the window's reservoirs into the queue, round-robin over the categories."""
        seen = {category: r.seen for category, r in self._reservoirs.items()}
        reservoirs = [r.kept for r in self._reservoirs.values() if r.kept]
        self._reservoirs = {}
        for kept in reservoirs:
            self._rng.shuffle(kept)
        self._rng.shuffle(reservoirs)
        chosen: list[LiveRequest] = []
        while reservoirs and len(chosen) < self.bounds.per_minute:
            for kept in list(reservoirs):
                if len(chosen) == self.bounds.per_minute:
                    break
                chosen.append(kept.pop())
                if not kept:
                    reservoirs.remove(kept)
        self._count("rate_limited", sum(len(kept) for kept in reservoirs))
        self.sampled_by_window.append(len(chosen))
        room = max(0, self.bounds.queue_size - len(self._queue))
        self._queue.extend(chosen[:room])
        self._count("sampled", min(room, len(chosen)))
        self._count("queue_full", len(chosen) - room)
        if self._on_window is not None and seen:
            self._on_window(window_mix(seen, chosen))

    def flush(self) -> None:
        """End the current window now (its reservoirs go to the queue)."""
        with self._lock:
            self._close()
            self._window = self._window_of(self._clock())

    def take(self) -> LiveRequest | None:
        """The oldest queued request (closing a window that has ended), None if none."""
        with self._lock:
            self._roll(self._clock())
            return self._queue.popleft() if self._queue else None

    def waiting(self) -> int:
        """Requests queued for a live pair, closing a window that has ended."""
        with self._lock:
            self._roll(self._clock())
            return len(self._queue)

    def __len__(self) -> int:
        """Requests queued for a live pair."""
        with self._lock:
            return len(self._queue)
