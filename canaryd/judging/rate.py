"""The pair rate measured on the database, which the false-alarm budget is re-budgeted for.

The gates' thresholds are sized for one pair every `gates.budget.design_pair_interval_s`
(gates/stats/budget.py); every daemon writing pairs to one database (a leader and the followers
that measure beside it, several pairs per cycle, the adaptive pace, a command's runs) adds
pairs the detectors judge. `pair_rate` counts the stored pairs of one arm started in the
trailing `RATE_HORIZON` (raw pairs and the hourly roll-ups retention moved them to),
whoever wrote them, and divides by the whole horizon. A day is long enough that a rollout
burst the burst allowance already pays for (30 days / design interval less the schedule's
pairs, spent at most a few hours a day) does not count as a faster schedule, and short
enough that a follower measuring beside the leader is counted within a day; burst pairs are
not marked in the store, so the horizon is what keeps them out. Dividing by the whole
horizon, not by the time since the first pair, keeps a daemon started minutes ago (or a
test) from being read as a sustained rate: the budget counts pairs per 30 days, and a
day's pairs are what a day spends of it. The daemon's gate job and the verdict read it into
their evidence (`canaryd.judging.reader.gather`, `rate=`), and `gates.cycle.judge` judges
with a copy of the gates config re-budgeted for it when it is faster than the design rate
(the gate job measures every `RATE_REFRESH`, the verdict at each gate run it judges).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from canaryd.store import HistoryStore

__all__ = ["RATE_HORIZON", "RATE_REFRESH", "pair_rate"]

RATE_HORIZON = timedelta(hours=24)
# How often the gate job measures again: five minutes move a day's count by a third of a
# percent at most.
RATE_REFRESH = timedelta(minutes=5)


def pair_rate(store: HistoryStore, arm: str, at: datetime) -> float:
    """The pairs of `arm` a minute stored in the `RATE_HORIZON` up to `at`, by every
    daemon and command on the database."""
    pairs = store.pair_count(arm, at - RATE_HORIZON, at + timedelta(microseconds=1))
    return pairs / (RATE_HORIZON.total_seconds() / 60.0)
