"""The rollout burst: while a rollout tool is judging a revision, pairs run at
`rollout.max_pairs_per_minute`, `rollout.concurrency` at a time, instead of the schedule.

`RolloutBurst` is told by the verdict endpoints (`POST /v1/verdict`, every Flagger hook)
that a revision was named, with its verdict; the daemon tells it each gate run's verdict
of that revision. The burst is on while the revision was named within
`rollout.burst_hold_s`, its window is open and current, its verdict is undecided
(INCONCLUSIVE or NODATA), the burst allowance is not spent, and the revision is within
its bounds: `rollout.max_pairs_per_revision_hour` burst pairs in any hour, and among the
first `rollout.max_revisions_per_hour` distinct revisions to burst in any hour (so that
neither one revision named again and again nor a stream of new names keeps production
bursting). The allowance keeps the
false-alarm budget: the detectors' thresholds are sized for one pair every
`gates.budget.design_pair_interval_s`, so in any 30 days the burst may add at most
30 days / design interval less the pairs the schedule runs in 30 days; burst pairs are
counted in hourly buckets over the trailing 30 days (in memory: a restart forgets them).
It counts what a burst costs — pairs and generated tokens per arm — for the metrics and
for the revision's verdict.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from canaryd.config import Settings
from canaryd.judging.verdict import RevisionVerdict, VerdictQuery
from gates.records import BASELINE_ARM, PairRecord
from gates.stats.budget import SECONDS_PER_30_DAYS, design_pairs_per_minute

__all__ = ["BurstCost", "RolloutBurst", "burst_allowance"]

log = structlog.get_logger(__name__)

# Revisions whose burst cost is remembered for their verdicts.
KEPT_REVISIONS = 16
_HOUR_S = 3600.0


def burst_allowance(settings: Settings) -> float:
    """Burst pairs allowed in any 30 days: the pairs the false-alarm budget is sized for
    (one every `gates.budget.design_pair_interval_s`) less those the schedule runs."""
    spare = design_pairs_per_minute(settings.gates) - settings.schedule.pairs_per_minute
    return max(0.0, spare) * SECONDS_PER_30_DAYS / 60.0


@dataclass(slots=True)
class BurstCost:
    """What the bursts for one revision cost: pairs and generated tokens per arm."""

    pairs: int = 0
    tokens: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # time spent bursting
    started: float | None = None  # monotonic start of the burst running now
    recent: deque[float] = field(default_factory=deque)  # monotonic times of pairs, last hour

    def as_json(self, active: bool, why: str, now: float) -> dict[str, Any]:
        running = now - self.started if self.started is not None else 0.0
        return {
            "active": active,
            "state": why,
            "pairs": self.pairs,
            "tokens": dict(sorted(self.tokens.items())),
            "seconds": round(self.seconds + running, 1),
        }


class RolloutBurst:
    """Which revision a rollout tool is judging, whether pairs burst for it, and at what
    cost. Thread-safe: the verdict endpoints, the gate job and the pair cycle call it.
    `on_change` is called (outside the lock) when the burst starts or stops."""

    def __init__(
        self,
        settings: Callable[[], Settings],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self.on_change: Callable[[], None] | None = None
        self._query: VerdictQuery | None = None
        self._named_at = 0.0
        self._verdict: str | None = None
        self._current = False
        self._costs: OrderedDict[str, BurstCost] = OrderedDict()
        self._hours: deque[list[float]] = deque()  # [hour start, burst pairs]
        self._admitted: deque[tuple[float, str]] = deque()  # revisions that burst, last hour
        self._was_active = False

    # -- what the endpoints and the gate job say --

    def named(self, query: VerdictQuery, verdict: RevisionVerdict | None) -> None:
        """A rollout tool named `query.revision` now; `verdict` None: its window was just
        opened. A revision whose window is not open and current starts nothing."""
        if verdict is not None and not verdict.window_current:
            return
        with self._lock:
            if self._query is None or self._query.revision != query.revision:
                self._stop_clock()
                self._verdict = None
                self._was_active = False
            self._query = query
            self._named_at = self._clock()
            self._current = True
            self._admit(query.revision)
            if verdict is not None:
                self._verdict = verdict.verdict
        self._changed()

    def judged(self, verdict: RevisionVerdict) -> None:
        """A gate run's verdict of the revision being judged (the daemon asks after each)."""
        with self._lock:
            if self._query is None or verdict.revision != self._query.revision:
                return
            self._verdict = verdict.verdict
            self._current = verdict.window_current
        self._changed()

    @property
    def query(self) -> VerdictQuery | None:
        """The query of the revision named within `rollout.burst_hold_s` while its window
        is current (the daemon judges it after each gate run), else None."""
        with self._lock:
            return self._query if self._held() and self._current else None

    # -- what the daemon reads --

    def active(self) -> bool:
        """Whether pairs burst now."""
        with self._lock:
            return self._state()[0]

    def pairs_per_minute(self) -> float | None:
        """`rollout.max_pairs_per_minute` while the burst is on, else None."""
        return self._settings().rollout.max_pairs_per_minute if self.active() else None

    def counted(self, records: Sequence[PairRecord]) -> dict[str, int]:
        """One burst pair (a prompt on every arm) ran: count it; the tokens each arm
        generated for it."""
        if not records:
            return {}
        tokens = {BASELINE_ARM: records[0].baseline.output_tokens}
        tokens.update({r.arm: r.speculative.output_tokens for r in records})
        now = self._clock()
        with self._lock:
            revision = self._query.revision if self._query is not None else "-"
            cost = self._cost(revision)
            cost.pairs += 1
            cost.recent.append(now)
            for arm, count in tokens.items():
                cost.tokens[arm] = cost.tokens.get(arm, 0) + count
            hour = now - now % _HOUR_S
            if self._hours and self._hours[-1][0] == hour:
                self._hours[-1][1] += 1
            else:
                self._hours.append([hour, 1.0])
        return tokens

    def spent(self) -> float:
        """Burst pairs in the trailing 30 days."""
        with self._lock:
            return self._spent()

    def report(self, revision: str) -> dict[str, Any] | None:
        """The burst's cost on `revision` and its state (None: no burst was named for it)."""
        with self._lock:
            cost = self._costs.get(revision)
            mine = self._query is not None and self._query.revision == revision
            if cost is None and not mine:
                return None
            active, why = self._state() if mine else (False, "another revision is judged")
            return (cost or BurstCost()).as_json(active, why, self._clock())

    # -- inside the lock --

    def _held(self) -> bool:
        hold = self._settings().rollout.burst_hold_s
        return self._query is not None and self._clock() - self._named_at <= hold

    def _spent(self) -> float:
        horizon = self._clock() - SECONDS_PER_30_DAYS
        while self._hours and self._hours[0][0] + _HOUR_S <= horizon:
            self._hours.popleft()
        return sum(count for _, count in self._hours)

    def _state(self) -> tuple[bool, str]:
        """Whether the burst is on, and why (or why not), in a few words."""
        if self._query is None:
            return False, "no revision named"
        if not self._held():
            hold = self._settings().rollout.burst_hold_s
            return False, f"not named within rollout.burst_hold_s ({hold:g} s)"
        if not self._current:
            return False, "the revision's window is closed"
        if self._verdict in ("PASS", "FAIL"):
            return False, f"decided: {self._verdict}"
        rollout = self._settings().rollout
        revision = self._query.revision
        if not self._admitted_now(revision):
            return False, (
                f"{rollout.max_revisions_per_hour} other revisions burst in the last hour "
                "(rollout.max_revisions_per_hour)"
            )
        if self._pairs_last_hour(revision) >= rollout.max_pairs_per_revision_hour:
            return False, (
                f"the revision ran {rollout.max_pairs_per_revision_hour} burst pairs in the "
                "last hour (rollout.max_pairs_per_revision_hour)"
            )
        allowance = burst_allowance(self._settings())
        if self._spent() >= allowance:
            return False, (
                f"the burst allowance is spent ({allowance:.0f} pairs per 30 days within "
                "gates.budget.design_pair_interval_s)"
            )
        return True, "bursting: the verdict is undecided"

    def _admit(self, revision: str) -> None:
        """Count `revision` among the hour's bursting revisions if it is not yet and
        there is room."""
        self._expire_admitted()
        names = {name for _, name in self._admitted}
        if revision not in names and len(names) < self._settings().rollout.max_revisions_per_hour:
            self._admitted.append((self._clock(), revision))

    def _admitted_now(self, revision: str) -> bool:
        self._expire_admitted()
        if all(name != revision for _, name in self._admitted):
            self._admit(revision)  # the hour may have freed up since it was named
        return any(name == revision for _, name in self._admitted)

    def _expire_admitted(self) -> None:
        horizon = self._clock() - _HOUR_S
        while self._admitted and self._admitted[0][0] <= horizon:
            self._admitted.popleft()

    def _pairs_last_hour(self, revision: str) -> int:
        cost = self._costs.get(revision)
        if cost is None:
            return 0
        horizon = self._clock() - _HOUR_S
        while cost.recent and cost.recent[0] <= horizon:
            cost.recent.popleft()
        return len(cost.recent)

    def _cost(self, revision: str) -> BurstCost:
        cost = self._costs.get(revision)
        if cost is None:
            cost = self._costs[revision] = BurstCost()
            while len(self._costs) > KEPT_REVISIONS:
                self._costs.popitem(last=False)
        self._costs.move_to_end(revision)
        return cost

    def _stop_clock(self) -> None:
        if self._query is None:
            return
        cost = self._costs.get(self._query.revision)
        if cost is not None and cost.started is not None:
            cost.seconds += self._clock() - cost.started
            cost.started = None

    def _changed(self) -> None:
        """Keep the burst's clock and tell the daemon when the burst starts or stops."""
        with self._lock:
            active, why = self._state()
            changed = active != self._was_active
            self._was_active = active
            if changed and self._query is not None:
                if active:
                    self._cost(self._query.revision).started = self._clock()
                else:
                    self._stop_clock()
            revision = self._query.revision if self._query is not None else None
        if not changed:
            return
        log.info("rollout.burst", active=active, revision=revision, reason=why)
        if self.on_change is not None:
            self.on_change()

    def refresh(self) -> bool:
        """Re-read the state (the hold may have expired); True while bursting."""
        self._changed()
        return self.active()
