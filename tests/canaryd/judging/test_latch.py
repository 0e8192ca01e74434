"""A revision's FAIL latches (`canaryd.judging.latch`, applied by `VerdictService`): pairs
from the real pair runner over fake engines in a real database, the gate job and the switch
service as the daemon and `canaryd switch` run them; only liveness enforces (test_gatejob's
settings: a window of 10 pairs), so that 10 healthy pairs after 10 dead ones judge PASS
afresh and only the latch keeps the FAIL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from canaryd.config import Settings
from canaryd.judging.gatejob import SwitchGates
from canaryd.judging.latch import RESTORE_HINT, switch_failure, window_failure
from canaryd.judging.verdict import VerdictQuery, VerdictService
from canaryd.store import AuditEntry, RevisionWindow, SqlStore
from canaryd.switch import SwitchService
from gates import SwitchEvent, SwitchMode
from tests.canaryd.judging.test_gatejob import Soak, settings
from tests.canaryd.judging.test_verdict import Clock, judge, opened

ARM = "speculative"


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened_store:
        yield opened_store


class Rollout:
    """A store of soak pairs, a clock, the verdict service and the switch service."""

    def __init__(self, store: SqlStore, configured: Settings) -> None:
        self.store = store
        self.settings = configured
        self.soak = Soak(store)
        self.clock = Clock(self.soak.base)
        self.service = VerdictService(configured, store=store, clock=self.clock)
        self.switch = SwitchService(
            store, configured.switch, configured.gates.policy, clock=self.clock
        )
        store.record_gate_run(self.soak.base - timedelta(seconds=1))

    def pairs(self, n: int, *, error_rate: float = 0.0) -> None:
        """`n` pairs, then a completed gate run at the clock's new time."""
        self.clock.now = self.soak.pairs(n, error_rate=error_rate)
        self.store.record_gate_run(self.clock.now)

    def failed(self, revision: str) -> None:
        """Open `revision`, FAIL it on 10 dead pairs through a write (POST /v1/verdict),
        which latches it, then 10 healthy pairs that judge afresh to PASS."""
        opened(self.service, revision)
        self.pairs(10, error_rate=1.0)
        assert opened(self.service, revision).verdict == "FAIL"
        self.pairs(10)

    def window(self, revision: str) -> RevisionWindow:
        window = self.store.revision_window(ARM, revision)
        assert window is not None
        return window


@pytest.fixture
def rollout(store: SqlStore, database_url: str, tmp_path: Path) -> Rollout:
    return Rollout(store, settings(database_url, tmp_path))


class TestTheLatch:
    def test_a_fail_stands_after_the_evidence_recovers(self, rollout: Rollout) -> None:
        """A FAIL a write judged is latched in the window: after 10 healthy pairs (a fresh
        judgement PASSes) every read is still FAIL, with the first failure's time and
        reason, saying how it is cleared and what is judged now."""
        rollout.failed("rev-a")
        window = rollout.window("rev-a")
        assert window.failed_at is not None
        assert window.failure.startswith("liveness FAILed on 10 pairs of revision 'rev-a'")
        read = judge(rollout.service, "rev-a")
        assert (read.verdict, read.fresh, read.failed_at) == ("FAIL", True, window.failed_at)
        assert read.reason.startswith(f"FAIL latched at {window.failed_at:%Y-%m-%dT%H:%M:%S}")
        assert RESTORE_HINT in read.reason
        assert "judged now: every enforce gate PASSed on 20 pairs" in read.reason
        assert read.gates[0].name == "liveness" and read.gates[0].state.value == "PASS"
        body = read.as_json("compact")
        assert body["verdict"] == "FAIL" and body["failed_at"] == window.failed_at.isoformat()

    def test_it_survives_a_new_service_over_the_same_database(
        self, rollout: Rollout, database_url: str
    ) -> None:
        """A restarted daemon (a new VerdictService on its own connection) reads the same
        latched FAIL."""
        rollout.failed("rev-a")
        with SqlStore.open(database_url) as reopened:
            again = VerdictService(rollout.settings, store=reopened, clock=rollout.clock)
            read = again.judge(VerdictQuery("rev-a"))
        assert read.verdict == "FAIL"
        assert read.failed_at == rollout.window("rev-a").failed_at

    def test_a_read_never_latches(self, rollout: Rollout) -> None:
        """A GET that judges FAIL answers FAIL and writes nothing: once the evidence
        recovers, reads alone PASS (under a daemon the gate job latches it)."""
        opened(rollout.service, "rev-a")
        rollout.pairs(10, error_rate=1.0)
        assert judge(rollout.service, "rev-a").verdict == "FAIL"
        assert rollout.window("rev-a").failed_at is None
        rollout.pairs(10)
        assert judge(rollout.service, "rev-a").verdict == "PASS"

    def test_a_new_revision_starts_clean(self, rollout: Rollout) -> None:
        """The arm's next revision has no failure; the old one keeps its FAIL as its final
        verdict, superseded."""
        rollout.failed("rev-a")
        rollout.clock.now += timedelta(milliseconds=100)
        assert opened(rollout.service, "rev-b").verdict == "NODATA"
        rollout.pairs(10)
        assert judge(rollout.service, "rev-b").verdict == "PASS"
        old = judge(rollout.service, "rev-a")
        assert (old.verdict, old.fresh) == ("FAIL", False)
        assert old.reason.startswith("revision 'rev-a' was superseded at")
        assert "FAIL latched at" in old.reason


class TestTheGateJob:
    def test_the_gate_run_latches_the_current_revision(
        self, rollout: Rollout, database_url: str, tmp_path: Path
    ) -> None:
        """With no write after the FAIL, the gate job's next runs latch it: the switch it
        rolled back while the revision was judged is the revision's failure, and it stands
        after the gate job judged healthy pairs again."""
        gates = SwitchGates(settings(database_url, tmp_path), store=rollout.store)
        opened(rollout.service, "rev-a")
        rollout.clock.now = rollout.soak.pairs(10, error_rate=1.0)
        gates.evaluate(rollout.clock.now)
        assert rollout.store.switch().state.mode is SwitchMode.ROLLED_BACK
        latched = rollout.window("rev-a")
        assert latched.failed_at == rollout.clock.now
        assert latched.failure.startswith("speculation was rolled back at")
        assert "by gate:liveness" in latched.failure
        rollout.clock.now = rollout.soak.pairs(10)
        gates.evaluate(rollout.clock.now)
        read = judge(rollout.service, "rev-a")
        assert read.verdict == "FAIL" and read.failed_at == latched.failed_at
        assert read.speculative_enabled is False

    def test_a_fail_judged_on_pairs_before_the_revision_is_not_its(
        self, rollout: Rollout, database_url: str, tmp_path: Path
    ) -> None:
        """The gate job's FAIL on pairs measured before the revision opened latches
        nothing on it: a rollback before its window is not its failure."""
        gates = SwitchGates(settings(database_url, tmp_path), store=rollout.store)
        rollout.clock.now = rollout.soak.pairs(10, error_rate=1.0)
        gates.evaluate(rollout.clock.now)
        assert rollout.store.switch().state.mode is SwitchMode.ROLLED_BACK
        rollout.clock.now += timedelta(milliseconds=100)
        opened(rollout.service, "rev-b")
        rollout.clock.now = rollout.soak.pairs(10)
        gates.evaluate(rollout.clock.now)
        read = judge(rollout.service, "rev-b")
        assert read.verdict == "PASS" and rollout.window("rev-b").failed_at is None
        assert read.speculative_enabled is False


class TestTheSwitch:
    def test_the_kill_switch_fails_the_revision_being_judged(self, rollout: Rollout) -> None:
        """`canaryd switch rollback` (the switch service) while a healthy revision is judged:
        every read is FAIL with the switch's time and reason, and speculation off."""
        opened(rollout.service, "rev-a")
        rollout.pairs(10)
        assert judge(rollout.service, "rev-a").verdict == "PASS"
        rollout.clock.now += timedelta(seconds=1)
        rollout.switch.command(SwitchEvent("rollback", "bob", "pager: tokens look wrong"))
        read = judge(rollout.service, "rev-a")
        assert (read.verdict, read.failed_at) == ("FAIL", rollout.clock.now)
        assert "speculation was rolled back at" in read.reason
        assert "by user:bob: pager: tokens look wrong" in read.reason
        assert read.speculative_enabled is False
        assert rollout.window("rev-a").failed_at is None  # a read: nothing written

    def test_a_restore_with_a_reason_clears_it_and_restarts_the_evidence(
        self, rollout: Rollout
    ) -> None:
        """An operator's restore (even with speculation on: the FAIL was the verdict's
        alone) clears the latch, records who and why, and the revision is judged again on
        pairs after it only: NODATA until a gate run, then PASS."""
        rollout.failed("rev-a")
        rollout.clock.now += timedelta(seconds=1)
        restored_at = rollout.clock.now
        change = rollout.switch.command(SwitchEvent("restore", "alice", "draft model fixed"))
        assert not change.outcome.refused
        window = rollout.window("rev-a")
        assert (window.failed_at, window.restored_at) == (None, restored_at)
        assert window.restore == "user:alice: draft model fixed"
        waiting = judge(rollout.service, "rev-a")
        assert waiting.verdict == "NODATA" and "no gate run has completed since" in waiting.reason
        rollout.soak.index += 2  # the next pairs start after the restore
        rollout.pairs(10)
        read = judge(rollout.service, "rev-a")
        assert (read.verdict, read.pairs, read.failed_at) == ("PASS", 10, None)

    def test_a_refused_restore_clears_nothing(self, rollout: Rollout) -> None:
        """A restore the policy refuses (no passing evidence since the rollback) leaves the
        revision FAIL."""
        opened(rollout.service, "rev-a")
        rollout.pairs(10)
        rollout.clock.now += timedelta(seconds=1)
        rollout.switch.command(SwitchEvent("rollback", "bob", "pager"))
        refused = rollout.switch.command(SwitchEvent("restore", "bob", "try"))
        assert refused.outcome.refused
        assert judge(rollout.service, "rev-a").verdict == "FAIL"
        assert rollout.window("rev-a").restored_at is None


class TestTheRules:
    def entry(self, minute: int, previous: str, target: str, **fields: object) -> AuditEntry:
        at = datetime(2026, 12, 1, 10, minute, tzinfo=UTC)
        values: dict[str, object] = {
            "at": at,
            "kind": "transition",
            "generation": minute,
            "previous": previous,
            "target": target,
            "control": "gates",
            "actor": "gate:error",
            "reason": f"at {minute}",
            "evidence": [],
            **fields,
        }
        return AuditEntry(**values)  # type: ignore[arg-type]

    def test_only_a_rollback_within_the_evidence_is_the_revisions(self) -> None:
        """The first top-level auto→rolled_back transition at or after the evidence start
        and before the window's end counts; a category's, a refusal, a restore, one
        before the start or after the end do not."""
        at = self.entry(0, "auto", "auto").at
        window = RevisionWindow(ARM, "r", at.replace(minute=10), at.replace(minute=40))
        audit = [
            self.entry(5, "auto", "rolled_back"),  # before the window
            self.entry(12, "auto", "rolled_back", category="code"),
            self.entry(13, "auto", "rolled_back", kind="refused"),
            self.entry(14, "rolled_back", "auto"),
            self.entry(20, "auto", "rolled_back"),
            self.entry(25, "auto", "rolled_back"),
            self.entry(45, "auto", "rolled_back"),  # after it ended
        ]
        found = switch_failure(window, audit)
        assert found is not None and found.at.minute == 20
        assert found.reason.endswith("by gate:error: at 20")
        restored = RevisionWindow(
            ARM, "r", window.started_at, window.ended_at, restored_at=at.replace(minute=22)
        )
        after_restore = switch_failure(restored, audit)
        assert after_restore is not None and after_restore.at.minute == 25
        assert switch_failure(restored, audit[:5]) is None
        assert window_failure(window) is None
