"""canaryd.judging.reader: one read of a judgement's evidence, on a real database — a
revision's window cuts the pairs and starts the evidence, only a `pin` writes drift
references, a category reads no telemetry, held evidence is not read again, the pair rate
is read only when asked, and the tie margin always comes with its source."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from canaryd.config import Settings
from canaryd.config.arms import arm_key
from canaryd.judging.reader import Held, gather
from canaryd.store import RevisionWindow, SqlStore
from gates import SwitchMode, SwitchState
from gates.evidence import MarginSource
from gates.pairs.testing import T0, at, record, result
from gates.records import DEFAULT_ARM, PairRecord, RunInfo
from gates.telemetry.intervals import TelemetryEvidence

TELEMETRY = {
    "scrape_interval_s": 15.0,
    "arms": {
        "baseline": {"metrics_url": "http://10.0.0.1:8000/metrics"},
        "speculative": {"metrics_url": "http://10.0.0.2:8000/metrics"},
    },
}


def settings(url: str, tmp_path: Path, *, telemetry: bool = False) -> Settings:
    return Settings(
        storage={"url": url},
        switch={"state_file": str(tmp_path / "switch.json")},
        telemetry=TELEMETRY if telemetry else {},
    )


def pinnable(n: int) -> list[PairRecord]:
    """n healthy pairs with acceptance data: enough for a drift reference."""
    return [record(i, speculative=result(0.5, verify_steps=10)) for i in range(n)]


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened:
        opened.create_run(RunInfo("test", "daemon", T0, {}, "h", {}, {}, {}))  # type: ignore[arg-type]
        for pair in pinnable(200):
            opened.save_pair(pair)
        yield opened


class TestGather:
    def test_a_revision_window_cuts_the_pairs_and_starts_the_evidence(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Only the pairs from the window's start count, and the evidence starts there."""
        s = settings(database_url, tmp_path)
        window = RevisionWindow(DEFAULT_ARM, "r1", started_at=at(150))
        evidence = gather(store, s, DEFAULT_ARM, at(199), window=window, subject="revision 'r1'")
        assert [r.started_at for r in evidence.records] == [at(i) for i in range(150, 200)]
        assert evidence.start == at(150) and evidence.subject == "revision 'r1'"
        assert len(gather(store, s, DEFAULT_ARM, at(199)).records) == 200

    def test_only_a_pin_writes_drift_references(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Without `pin` (the verdict) the references are only read; with it (the gate
        job) the window pins them, and the evidence carries what was pinned."""
        s = settings(database_url, tmp_path)
        arms = arm_key(s, DEFAULT_ARM)
        assert gather(store, s, DEFAULT_ARM, at(199)).references == {}
        assert store.drift_references(arms) == {}
        pinned = gather(store, s, DEFAULT_ARM, at(199), pin=True)
        assert pinned.references and pinned.references == store.drift_references(arms)

    def test_a_drift_rollback_pins_nothing(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """A rollback the drift gate caused is no healthy traffic: nothing is pinned."""
        s = settings(database_url, tmp_path)
        state = SwitchState(mode=SwitchMode.ROLLED_BACK, actor="gate:drift", since=at(0))
        evidence = gather(store, s, DEFAULT_ARM, at(199), state=state, pin=True)
        assert evidence.references == {} and evidence.state is state

    def test_telemetry_is_read_for_the_arm_but_not_for_a_category(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """With `[telemetry]` the evidence holds both arms' telemetry (empty: nothing
        scraped) with its scrape interval; a category's evidence has none."""
        s = settings(database_url, tmp_path, telemetry=True)
        whole = gather(store, s, DEFAULT_ARM, at(199))
        assert whole.telemetry == TelemetryEvidence() and whole.scrape_interval_s == 15.0
        assert gather(store, s, DEFAULT_ARM, at(199), category="qa").telemetry is None
        assert (
            gather(store, settings(database_url, tmp_path), DEFAULT_ARM, at(199)).telemetry is None
        )

    def test_held_evidence_is_not_read_again(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """`canaryd judge`'s pairs, references and telemetry come from memory; the store
        gives the tie margin."""
        s = settings(database_url, tmp_path)
        held = Held(pinnable(3), {}, None)
        evidence = gather(store, s, DEFAULT_ARM, at(199), held=held)
        assert evidence.records == held.pairs and evidence.references == {}
        assert evidence.tie_margin == MarginSource(0.5, "configured")

    def test_the_pair_rate_and_the_probe_only_when_asked(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """No `rate`: judged at the design rate (None); no `probe`: the probe gate does
        not run. Asked, the rate is what the reader gives and the probe gate runs (on no
        probe yet)."""
        s = settings(database_url, tmp_path)
        plain = gather(store, s, DEFAULT_ARM, at(199))
        assert plain.pair_rate is None and not plain.with_probe
        asked = gather(store, s, DEFAULT_ARM, at(199), rate=lambda *_: 12.0, probe=True)
        assert asked.pair_rate == 12.0 and asked.with_probe and asked.probe is None
