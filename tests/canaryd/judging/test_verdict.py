"""A verdict per revision (`canaryd.judging.verdict`): pairs from the real pair runner over fake
engines, stored in a real database, judged per revision's evidence window on a clock the
test sets; only liveness enforces (test_gatejob's settings) so that a few pairs decide."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from canaryd.config import Settings
from canaryd.errors import BadRequestError, CannotJudgeError
from canaryd.judging.verdict import RevisionVerdict, VerdictQuery, VerdictService, finite
from canaryd.store import SqlStore
from gates import GateDecision, GateMode, GateState
from gates.cycle import combine
from tests.canaryd.judging.test_gatejob import Soak, settings


class Clock:
    """A clock the test moves."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened:
        yield opened


def judge(service: VerdictService, revision: str, **query: object) -> RevisionVerdict:
    """A read: judges the revision's window as it is."""
    return service.judge(VerdictQuery(revision, **query))  # type: ignore[arg-type]


def opened(service: VerdictService, revision: str, **query: object) -> RevisionVerdict:
    """A write (a Flagger rollout hook, POST /v1/verdict): opens the window, then judges."""
    return service.judge(VerdictQuery(revision, **query), start=True)  # type: ignore[arg-type]


class TestRevisionWindows:
    def test_each_revision_is_judged_on_its_own_pairs(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """A's first opening request starts its window (NODATA, not fresh, until a gate run
        follows); A's healthy pairs PASS; B starts later and FAILs on its dead arm's pairs
        alone; A then keeps its final verdict on its own pairs, no longer fresh."""
        soak = Soak(store)
        clock = Clock(soak.base)
        service = VerdictService(settings(database_url, tmp_path), store=store, clock=clock)
        store.record_gate_run(soak.base - timedelta(seconds=1))
        started = opened(service, "rev-a")
        assert (started.verdict, started.fresh, started.pairs) == ("NODATA", False, 0)
        assert "no gate run has completed since" in started.reason

        clock.now = soak.pairs(10)
        store.record_gate_run(clock.now)
        passed = judge(service, "rev-a")
        assert (passed.verdict, passed.fresh, passed.pairs) == ("PASS", True, 10)
        assert passed.evaluated_at == clock.now and passed.age_s == 0
        assert passed.speculative_enabled is True and passed.generation == 0

        clock.now += timedelta(milliseconds=100)
        assert opened(service, "rev-b").verdict == "NODATA"  # B starts: A's window ends
        clock.now = soak.pairs(10, error_rate=1.0)
        store.record_gate_run(clock.now)
        failed = judge(service, "rev-b")
        assert (failed.verdict, failed.fresh, failed.pairs) == ("FAIL", True, 10)
        assert failed.reason.startswith("liveness FAILed on 10 pairs of revision 'rev-b'")
        final = judge(service, "rev-a")
        assert (final.verdict, final.fresh, final.pairs) == ("PASS", False, 10)
        assert "superseded" in final.reason

    def test_min_pairs_holds_back_a_pass_never_a_fail(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Below `min_pairs` a passing revision is NODATA, saying so; a failing one FAILs."""
        soak = Soak(store)
        clock = Clock(soak.base)
        service = VerdictService(settings(database_url, tmp_path), store=store, clock=clock)
        store.record_gate_run(soak.base - timedelta(seconds=1))
        opened(service, "rev-a")
        clock.now = soak.pairs(10)
        store.record_gate_run(clock.now)
        held = judge(service, "rev-a", min_pairs=30)
        assert held.verdict == "NODATA"
        assert held.reason == "10 pairs of revision 'rev-a', fewer than min_pairs=30"
        clock.now += timedelta(milliseconds=100)
        opened(service, "rev-b")
        clock.now = soak.pairs(10, error_rate=1.0)
        store.record_gate_run(clock.now)
        assert judge(service, "rev-b", min_pairs=30).verdict == "FAIL"

    def test_a_category_is_judged_on_its_pairs(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """With `category`, only that category's pairs of the revision count; a category
        the store has never seen is a bad request naming the key."""
        soak = Soak(store)
        clock = Clock(soak.base)
        service = VerdictService(settings(database_url, tmp_path), store=store, clock=clock)
        store.record_gate_run(soak.base - timedelta(seconds=1))
        opened(service, "rev-a")
        clock.now = soak.pairs(18)
        store.record_gate_run(clock.now)
        category = store.pairs()[0].prompt.category
        expected = len(store.pairs(category=category))
        assert 0 < expected < 18
        assert judge(service, "rev-a", category=category).pairs == expected
        with pytest.raises(BadRequestError, match=r"^category: unknown category 'nope'"):
            judge(service, "rev-a", category="nope")

    def test_a_configured_revision_is_the_only_one_judged(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """With `switch.revision`, a request for another revision is NODATA naming the
        key, and starts no window; opening another is refused naming the key."""
        soak = Soak(store)
        configured = settings(database_url, tmp_path)
        configured = configured.model_copy(
            update={"switch": configured.switch.model_copy(update={"revision": "rev-a"})}
        )
        service = VerdictService(configured, store=store, clock=Clock(soak.base))
        store.record_gate_run(soak.base)
        other = judge(service, "rev-b")
        assert other.verdict == "NODATA" and not other.fresh
        assert "serves revision 'rev-a' (switch.revision), not 'rev-b'" in other.reason
        assert store.revision_window("speculative", "rev-b") is None
        with pytest.raises(BadRequestError, match=r"^revision: .*switch.revision"):
            opened(service, "rev-b")
        assert store.revision_window("speculative", "rev-b") is None
        opened(service, "rev-a")
        assert store.revision_window("speculative", "rev-a") is not None


class TestReadsNeverWrite:
    def test_a_read_of_another_revision_changes_no_verdict(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """A read naming an unknown revision is NODATA, creates no window and leaves the
        judged revision's window, freshness and verdict as they were; a read before a
        revision is opened never hands it the old pods' pairs."""
        soak = Soak(store)
        clock = Clock(soak.base)
        service = VerdictService(settings(database_url, tmp_path), store=store, clock=clock)
        store.record_gate_run(soak.base - timedelta(seconds=1))
        early = judge(service, "rev-next")
        assert early.verdict == "NODATA" and "no evidence window is open" in early.reason
        opened(service, "rev-good")
        clock.now = soak.pairs(10, error_rate=1.0)
        store.record_gate_run(clock.now)
        before = judge(service, "rev-good")
        assert (before.verdict, before.fresh) == ("FAIL", True)
        for evil in ("evil", "rev-next", "x" * 128):
            read = judge(service, evil)
            assert read.verdict == "NODATA" and read.pairs == 0
            assert store.revision_window("speculative", evil) is None
        after = judge(service, "rev-good")
        assert (after.verdict, after.fresh, after.pairs) == ("FAIL", True, 10)

    def test_windows_per_arm_are_capped(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Opening more than MAX_REVISIONS windows forgets the oldest, keeps the newest."""
        from canaryd.judging.verdict import MAX_REVISIONS

        soak = Soak(store)
        clock = Clock(soak.base)
        service = VerdictService(settings(database_url, tmp_path), store=store, clock=clock)
        for index in range(MAX_REVISIONS + 5):
            clock.now = soak.base + timedelta(seconds=index)
            service.open_revision(f"rev-{index}")
        kept = [
            index
            for index in range(MAX_REVISIONS + 5)
            if store.revision_window("speculative", f"rev-{index}") is not None
        ]
        assert kept == list(range(5, MAX_REVISIONS + 5))


class TestCannotJudge:
    def test_before_any_gate_run_and_when_the_last_is_stale(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """No completed gate run, or one older than the freshness bound: canaryd cannot
        judge, and says which setting bounds it."""
        soak = Soak(store)
        clock = Clock(soak.base)
        configured: Settings = settings(database_url, tmp_path)
        service = VerdictService(configured, store=store, clock=clock)
        with pytest.raises(CannotJudgeError, match="no gate run has completed yet"):
            judge(service, "rev-a")
        store.record_gate_run(soak.base)
        bound = configured.gates.policy.evidence_max_age_seconds
        clock.now = soak.base + timedelta(seconds=bound + 1)
        with pytest.raises(CannotJudgeError, match=r"evidence_max_age_seconds"):
            judge(service, "rev-a")

    def test_when_the_database_is_away(self, tmp_path: Path) -> None:
        """A database that cannot be opened is "cannot judge", with the driver's reason."""
        configured = Settings(storage={"url": f"sqlite:///{tmp_path / 'missing.db'}"})
        service = VerdictService(configured)
        with pytest.raises(CannotJudgeError, match="the database is away: no database file"):
            judge(service, "rev-a")


def decision(name: str, state: GateState, *, mode: GateMode = GateMode.ENFORCE) -> GateDecision:
    return GateDecision(
        name=name,
        state=state,
        mode=mode,
        critical=False,
        evaluated_at=datetime(2026, 12, 1),
        detail=f"{name} says {state.value}",
    )


class TestCombine:
    def test_the_enforce_gates_decide(self) -> None:
        """FAIL if any enforce gate FAILs; PASS only if all PASS; all NODATA is NODATA;
        WARN or a mix is INCONCLUSIVE; gates not enforced never count."""
        p, f, w, n = GateState.PASS, GateState.FAIL, GateState.WARN, GateState.NODATA
        cases = [
            ([decision("a", p), decision("b", f)], "FAIL"),
            ([decision("a", p), decision("b", p)], "PASS"),
            ([decision("a", n), decision("b", n)], "NODATA"),
            ([decision("a", p), decision("b", w)], "INCONCLUSIVE"),
            ([decision("a", p), decision("b", n)], "INCONCLUSIVE"),
            ([decision("a", p), decision("b", f, mode=GateMode.WARN)], "PASS"),
            ([decision("a", f, mode=GateMode.DRY_RUN)], "NODATA"),
        ]
        for decisions, expected in cases:
            assert combine(decisions, 40, 0, "revision 'r'")[0] == expected, decisions

    def test_reasons_are_one_line_naming_the_revision(self) -> None:
        """The reason is one line; a FAIL names the failing gates and the first one's
        detail."""
        failing = GateDecision(
            name="error",
            state=GateState.FAIL,
            mode=GateMode.ENFORCE,
            critical=False,
            evaluated_at=datetime(2026, 12, 1),
            detail="5 failures\nin a row",
        )
        verdict, reason = combine(
            [failing, decision("latency", GateState.PASS)], 7, 0, "revision 'abc'"
        )
        assert verdict == "FAIL"
        assert reason == "error FAILed on 7 pairs of revision 'abc': 5 failures in a row"
        undecided = combine([decision("a", GateState.WARN)], 3, 0, "revision 'abc'")[1]
        assert undecided == "not decided on 3 pairs of revision 'abc': a WARN"

    def test_non_finite_numbers_become_null(self) -> None:
        """`finite` replaces inf and nan at any depth, keeps everything else."""
        value = {"a": [1.0, float("inf"), {"b": float("nan")}], "c": "x", "d": 2}
        assert finite(value) == {"a": [1.0, None, {"b": None}], "c": "x", "d": 2}
