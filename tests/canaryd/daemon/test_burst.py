"""The rollout burst: `RolloutBurst`'s rules on a hand-moved clock, then a daemon on fake
arms, real SQLite, real HTTP and its own gate job, where `POST /v1/verdict` starts the
burst, pairs run at `rollout.max_pairs_per_minute`, `rollout.concurrency` at once, and the
schedule returns once the revision's verdict decides."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from canaryd.config import Settings, load_settings
from canaryd.daemon import CYCLE_JOB, Daemon
from canaryd.daemon.burst import RolloutBurst, burst_allowance
from canaryd.judging.gatejob import SwitchGates
from canaryd.judging.verdict import RevisionVerdict, VerdictQuery
from gates.pairs.testing import record, result
from tests.canaryd.daemon.test_daemon import (  # noqa: F401  (autouse isolation)
    _clean_env,
    sample,
    stored_pairs,
    wait_for,
    write_config,
)
from tests.support.configs import LIVENESS_ONLY_GATES


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def judged(verdict: str, revision: str = "r", *, current: bool = True) -> RevisionVerdict:
    return RevisionVerdict(
        verdict=verdict,  # type: ignore[arg-type]
        fresh=current,
        evaluated_at=datetime(2026, 12, 1, tzinfo=UTC),
        age_s=0.0,
        revision=revision,
        pairs=0,
        arms={},
        speculative_enabled=True,
        generation=0,
        reason="",
        window_current=current,
    )


def burst_on(settings: Settings | None = None) -> tuple[RolloutBurst, Clock, list[int]]:
    clock = Clock()
    burst = RolloutBurst(lambda: settings or Settings(), clock=clock)
    changes: list[int] = []
    burst.on_change = lambda: changes.append(1)
    return burst, clock, changes


class TestRolloutBurst:
    def test_named_undecided_revisions_burst_until_the_hold_expires(self) -> None:
        """A revision named with its window open bursts at rollout.max_pairs_per_minute;
        `burst_hold_s` (120 s) after the last naming it stops; naming again restarts it."""
        burst, clock, changes = burst_on()
        assert not burst.active() and burst.pairs_per_minute() is None
        burst.named(VerdictQuery("r"), None)
        assert burst.active() and burst.pairs_per_minute() == 30.0
        clock.now += 119
        assert burst.refresh()
        clock.now += 2
        assert not burst.refresh()
        assert "burst_hold_s" in (burst.report("r") or {})["state"]
        burst.named(VerdictQuery("r"), judged("INCONCLUSIVE"))
        assert burst.active()
        assert len(changes) == 3  # on, off, on

    def test_a_decided_verdict_stops_it(self) -> None:
        """PASS or FAIL (from a request or the daemon's own check) ends the burst;
        INCONCLUSIVE and NODATA keep it."""
        for decided in ("PASS", "FAIL"):
            burst, _, _ = burst_on()
            burst.named(VerdictQuery("r"), judged("NODATA"))
            burst.judged(judged("INCONCLUSIVE"))
            assert burst.active()
            burst.judged(judged(decided))
            assert not burst.active()
            assert (burst.report("r") or {})["state"] == f"decided: {decided}"

    def test_a_closed_window_starts_nothing(self) -> None:
        """A revision whose window is not open (or superseded) is not burst for, and a
        verdict of another revision changes nothing."""
        burst, _, _ = burst_on()
        burst.named(VerdictQuery("r"), judged("NODATA", current=False))
        assert not burst.active() and burst.report("r") is None
        burst.named(VerdictQuery("r"), None)
        burst.judged(judged("PASS", revision="other"))
        assert burst.active()
        burst.judged(judged("NODATA", current=False))
        assert not burst.active()

    def test_cost_is_counted_per_revision(self) -> None:
        """Each burst pair counts once, with the tokens every arm generated."""
        burst, clock, _ = burst_on()
        burst.named(VerdictQuery("r"), None)
        pair = record(
            1, baseline=result(0.5, output_tokens=40), speculative=result(0.3, output_tokens=38)
        )
        assert burst.counted([pair]) == {"baseline": 40, "speculative": 38}
        burst.counted([pair])
        clock.now += 30
        report = burst.report("r") or {}
        assert report["pairs"] == 2 and report["active"] is True
        assert report["tokens"] == {"baseline": 80, "speculative": 76}
        assert report["seconds"] == 30.0
        assert burst.spent() == 2

    def test_the_allowance_keeps_the_false_alarm_budget(self) -> None:
        """Burst pairs in 30 days are at most the pairs the budget is sized for (one per
        design_pair_interval_s) less the schedule's: spent, the burst stops; 30 days
        later the allowance is back."""
        settings = Settings(
            schedule={"pair_interval_s": 10.0},
            gates={"budget": {"design_pair_interval_s": 9.0}},
        )
        allowance = burst_allowance(settings)
        assert allowance == pytest.approx(30 * 86_400 * (1 / 9 - 1 / 10))
        assert burst_allowance(Settings()) == pytest.approx(30 * 86_400 * (1 / 10 - 1 / 30))
        burst, clock, _ = burst_on(settings)
        burst.named(VerdictQuery("r"), None)
        pair = record(1)
        burst._hours.append([clock.now - clock.now % 3600, allowance - 1])
        assert burst.active()
        burst.counted([pair])
        assert not burst.active()
        assert "allowance is spent" in (burst.report("r") or {})["state"]
        clock.now += 30 * 86_400 + 3600
        burst.named(VerdictQuery("r"), None)
        assert burst.active()

    def test_one_revision_named_again_and_again_stops_at_its_hourly_bound(self) -> None:
        """A revision that ran `rollout.max_pairs_per_revision_hour` burst pairs in the
        last hour stops bursting though it is named every minute; an hour on it may
        burst again."""
        burst, clock, _ = burst_on(Settings(rollout={"max_pairs_per_revision_hour": 3}))
        pair = record(1)
        for _ in range(3):
            burst.named(VerdictQuery("r"), judged("INCONCLUSIVE"))
            assert burst.active()
            burst.counted([pair])
            clock.now += 60
        burst.named(VerdictQuery("r"), judged("INCONCLUSIVE"))
        assert not burst.active()
        assert "rollout.max_pairs_per_revision_hour" in (burst.report("r") or {})["state"]
        clock.now += 3600
        burst.named(VerdictQuery("r"), judged("INCONCLUSIVE"))
        assert burst.active()

    def test_a_stream_of_new_revisions_stops_at_the_hourly_bound(self) -> None:
        """Only the first `rollout.max_revisions_per_hour` distinct revisions burst in
        any hour; one named again meanwhile still does; a further one waits the hour."""
        burst, clock, _ = burst_on(Settings(rollout={"max_revisions_per_hour": 2}))
        for revision in ("a", "b"):
            burst.named(VerdictQuery(revision), None)
            assert burst.active(), revision
            clock.now += 60
        burst.named(VerdictQuery("c"), None)
        assert not burst.active()
        assert "rollout.max_revisions_per_hour" in (burst.report("c") or {})["state"]
        burst.named(VerdictQuery("a"), judged("INCONCLUSIVE"))
        assert burst.active()
        clock.now += 3600
        burst.named(VerdictQuery("c"), judged("INCONCLUSIVE"))
        assert burst.active()


ROLLOUT = (
    """
[schedule]
pair_interval_s = 600
jitter_s = 0
gate_interval_s = 0.3
heartbeat_interval_s = 0.1
max_pairs_per_minute = 0.1
[rollout]
max_pairs_per_minute = 300
concurrency = 2
burst_hold_s = 120
"""
    + LIVENESS_ONLY_GATES
    + """[gates.policy]
cooldown_seconds = 0
"""
)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon on fake arms whose schedule runs one pair in ten minutes, leading its
    own gates (only liveness enforces, so a handful of pairs decides)."""
    path = write_config(tmp_path, ROLLOUT + f'[switch]\nstate_file = "{tmp_path}/switch.json"\n')
    settings = load_settings(path)
    gates = SwitchGates(settings)
    running = Daemon(settings, config_path=path, gates=gates)
    running.start()
    try:
        yield running
    finally:
        running.stop()
        gates.close()


def interval(daemon: Daemon) -> float:
    return float(daemon.scheduler.get_job(CYCLE_JOB).trigger.interval.total_seconds())


def verdict(daemon: Daemon, revision: str, method: str = "GET") -> dict[str, Any]:
    answer = httpx.request(
        method, f"http://{daemon.address}/v1/verdict", params={"revision": revision}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


class TestBurstInTheDaemon:
    def test_a_verdict_request_bursts_pairs_until_the_verdict_decides(self, daemon: Daemon) -> None:
        """POST /v1/verdict names revision r: pairs run two at once every
        60 x 2 / 300 = 0.4 s instead of every 600 s, counted as burst pairs with their
        tokens; the daemon's gate job sees r PASS and the schedule returns at once."""
        wait_for(lambda: daemon.gates.suspicion is not None, what="a first gate run")
        assert interval(daemon) == 600.0
        assert stored_pairs(daemon) <= 1  # the first cycle runs at once, the next in 10 min
        first = verdict(daemon, "r", "POST")
        assert first["verdict"] == "NODATA"
        assert first["burst"]["active"] is True
        assert set(first["estimate"]) == {"pairs_to_decision", "minutes_to_decision", "waiting_on"}
        assert interval(daemon) == pytest.approx(0.4)
        assert sample(daemon, "canaryd_burst_active") == 1.0
        passed = wait_for(
            lambda: (body := verdict(daemon, "r"))["verdict"] == "PASS" and body,
            timeout=60,
            what="revision r to PASS",
        )
        wait_for(lambda: interval(daemon) == 600.0, what="the schedule's pace again")
        assert sample(daemon, "canaryd_burst_active") == 0.0
        # A burst cycle already running when the gate run decided still counts its pairs
        # as it finishes; cycles never overlap, and one starting after the decision is no
        # burst, so the count is final once the cycle job is idle.
        wait_for(daemon._idle.is_set, what="the last burst cycle to finish")
        burst_pairs = sample(daemon, "canaryd_burst_pairs_total")
        assert burst_pairs >= 5  # liveness needs min_samples = 5
        assert sample(daemon, "canaryd_burst_tokens_total", arm="baseline") > 0
        assert sample(daemon, "canaryd_burst_tokens_total", arm="speculative") > 0
        report = verdict(daemon, "r")["burst"]
        assert report["active"] is False and report["state"] == "decided: PASS"
        assert report["pairs"] == burst_pairs and report["pairs"] >= passed["pairs"] - 1
        assert report["tokens"]["baseline"] == sample(
            daemon, "canaryd_burst_tokens_total", arm="baseline"
        )
        # Decided: more polls (Argo's next measurements) start no burst.
        verdict(daemon, "r", "POST")
        assert interval(daemon) == 600.0
        assert sample(daemon, "canaryd_burst_pairs_total") == burst_pairs

    def test_reads_start_no_burst(self, daemon: Daemon) -> None:
        """A GET (a dashboard) never starts a burst, even for an open revision."""
        wait_for(lambda: daemon.gates.suspicion is not None, what="a first gate run")
        verdict(daemon, "r", "GET")
        assert not daemon.burst.active() and interval(daemon) == 600.0
