"""Adaptive pair rate (issue #23 part 3): while an enforce detector is past
`schedule.speed_up_at` of its threshold and undecided, pairs run at
`schedule.max_pairs_per_minute`; back to `pair_interval_s` when it fades or decides."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from canaryd.config import load_settings
from canaryd.daemon import CYCLE_JOB, Daemon
from gates import GatesConfig, GateState, evaluate_all
from gates.core import checks
from gates.cycle import suspicion
from gates.pairs.testing import at, record, result
from tests.canaryd.daemon.test_daemon import sample, stored_pairs, wait_for, write_config


class Suspicious:
    """A gate hook whose detectors read `progress` at every run."""

    def __init__(self) -> None:
        self.progress: float | None = 0.0
        self.runs = 0

    def start(self) -> None:
        return None

    def evaluate(self, now: datetime) -> None:
        self.runs += 1

    def role(self) -> str:
        return "leader"

    def state_file_problem(self) -> str | None:
        return None

    @property
    def suspicion(self) -> float | None:
        return self.progress


@pytest.fixture
def paced(tmp_path: Path) -> Iterator[Callable[[Suspicious], Daemon]]:
    started: list[Daemon] = []

    def make(hook: Suspicious) -> Daemon:
        schedule = (
            "[schedule]\npair_interval_s = 600\njitter_s = 0\ngate_interval_s = 0.1\n"
            "heartbeat_interval_s = 0.1\nmax_pairs_per_minute = 600\nspeed_up_at = 0.25\n"
        )
        path = write_config(tmp_path, schedule)
        daemon = Daemon(load_settings(path), config_path=path, gates=hook)
        daemon.start()
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()


def interval(daemon: Daemon) -> float:
    return float(daemon.scheduler.get_job(CYCLE_JOB).trigger.interval.total_seconds())


class TestAdaptivePace:
    def test_pairs_speed_up_while_a_detector_is_suspicious_then_slow_down(
        self, paced: Callable[[Suspicious], Daemon]
    ) -> None:
        hook = Suspicious()
        daemon = paced(hook)
        wait_for(lambda: hook.runs >= 3, what="three gate runs")
        assert interval(daemon) == 600.0
        assert sample(daemon, "canaryd_pair_interval_seconds") == 600.0
        assert stored_pairs(daemon) <= 1  # the first cycle runs at once, the next in 10 min
        hook.progress = 0.3
        wait_for(lambda: stored_pairs(daemon) >= 3, what="three pairs at 600 a minute")
        assert interval(daemon) == pytest.approx(0.1)
        assert sample(daemon, "canaryd_pair_interval_seconds") == pytest.approx(0.1)
        hook.progress = 0.1  # faded (or decided: a FAIL restarts the evidence)
        wait_for(lambda: interval(daemon) == 600.0, what="the slow pace again")
        assert sample(daemon, "canaryd_pair_interval_seconds") == 600.0

    def test_a_follower_keeps_the_configured_pace(
        self, paced: Callable[[Suspicious], Daemon]
    ) -> None:
        hook = Suspicious()
        hook.progress = None
        daemon = paced(hook)
        wait_for(lambda: hook.runs >= 3, what="three gate runs")
        assert interval(daemon) == 600.0


class TestSuspicion:
    def test_decided_and_warn_only_detectors_do_not_count(self) -> None:
        """A dead speculative arm: the error gate FAILs (decided: it does not count, its
        progress is past 1), so the suspicion is that of the undecided enforce detectors,
        below 1; with every gate in warn mode nothing is enforced: 0."""
        records = [record(i, speculative=result(0.5, ok=False)) for i in range(30)]
        decisions = evaluate_all(records, GatesConfig(), now=at(30))
        paired = next(c for c in checks(decisions) if c.name == "error.paired")
        assert paired.state is GateState.FAIL
        assert paired.detector is not None and paired.detector.progress >= 1.0
        assert 0.0 <= suspicion(decisions) < 1.0
        relaxed = GatesConfig.model_validate(
            {name: {"mode": "warn"} for name in ("error", "latency", "quality", "speedup", "drift")}
        )
        assert suspicion(evaluate_all(records, relaxed, now=at(30))) == 0.0

    def test_an_undecided_detector_half_way_counts(self) -> None:
        """Speculative-only failures on one pair in five: evidence piles up in the error
        detectors; before they decide, the suspicion is their progress (12 settled pairs:
        the error gate judges a pair once 10 more exist)."""
        records = [record(i, speculative=result(0.5, ok=i % 5 != 0)) for i in range(22)]
        decisions = evaluate_all(records, GatesConfig(), now=at(22))
        paired = next(c for c in checks(decisions) if c.name == "error.paired")
        assert paired.state is not GateState.FAIL
        assert paired.detector is not None
        assert suspicion(decisions) >= paired.detector.progress > 0.0
