"""Telemetry evidence through the judging paths (canaryd.judging: evidence, gatejob, verdict,
and `canaryd gates --json`), on a real database holding scrape intervals simulated as
vLLM would count them (gates.telemetry.testing): the window read is the baseline's and
the arm's intervals under their configuration of now, cut to a revision's window; the gate
job and the verdict judge them with the three telemetry gates, whose decisions
`canaryd gates --json` shows by name (the acceptance estimate is 1 + accepted ÷ drafts);
without `[telemetry]` nothing changes, and a category's verdict has no telemetry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.config import Settings
from canaryd.config.arms import arm_key
from canaryd.judging.evidence import acceptance_reference, read_telemetry, telemetry_seconds
from canaryd.judging.gatejob import SwitchGates
from canaryd.judging.verdict import VerdictQuery, VerdictService
from canaryd.store import SqlStore, StoredInterval
from gates import GatesConfig
from gates.telemetry.intervals import ArmTelemetry, TelemetryEvidence
from gates.telemetry.testing import ArmTraffic, simulate_arm
from tests.canaryd.judging.test_gatejob import Soak
from tests.canaryd.judging.test_verdict import Clock

STEP_S = 15.0
TELEMETRY = {
    "scrape_interval_s": STEP_S,
    "arms": {
        "baseline": {"metrics_url": "http://10.0.0.1:8000/metrics"},
        "speculative": {"metrics_url": "http://10.0.0.2:8000/metrics"},
    },
}
# 5 requests per second per arm at matched load, 5 draft tokens a step on the speculative.
BASELINE = ArmTraffic(rps=5.0)
SPECULATIVE = ArmTraffic(rps=5.0, draft_tokens=5, acceptance=0.6)
NAMES = ("telemetry.errors", "telemetry.latency", "telemetry.acceptance")


def settings(url: str, tmp_path: Path, *, telemetry: bool = True, **gates: object) -> Settings:
    return Settings(
        storage={"url": url},
        switch={"state_file": str(tmp_path / "state" / "switch.json")},
        telemetry=TELEMETRY if telemetry else {},
        gates=gates,
    )


def store_arm(
    store: SqlStore, config: Settings, arm: str, telemetry: ArmTelemetry, *, key: str | None = None
) -> None:
    store.save_telemetry(
        [
            StoredInterval(arm=arm, arms=key or arm_key(config, arm), interval=i, replicas=1)
            for i in telemetry.intervals
        ]
    )


def simulate(start: datetime, intervals: int, seed: int = 7) -> tuple[ArmTelemetry, ArmTelemetry]:
    rng = np.random.default_rng(seed)
    baseline = simulate_arm(rng, BASELINE, intervals=intervals, seconds=STEP_S, start=start)
    speculative = simulate_arm(rng, SPECULATIVE, intervals=intervals, seconds=STEP_S, start=start)
    return baseline, speculative


def pooled_length(telemetry: ArmTelemetry) -> float:
    drafts = sum(i.drafts or 0 for i in telemetry.intervals)
    return 1.0 + sum(i.accepted_tokens or 0 for i in telemetry.intervals) / drafts


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened:
        yield opened


class TestReadTelemetry:
    def test_without_telemetry_there_is_no_evidence(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """No `[telemetry]`: None, so the telemetry gates do not run."""
        config = settings(database_url, tmp_path, telemetry=False)
        assert read_telemetry(store, config, "speculative", datetime.now().astimezone()) is None

    def test_the_window_is_both_arms_under_their_configuration_of_now(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Intervals of the baseline and the arm within the telemetry window and the
        revision's window; those stored under another arms key are not evidence."""
        config = settings(database_url, tmp_path)
        start = Soak(store).base
        baseline, speculative = simulate(start, 40)
        store_arm(store, config, "baseline", baseline)
        store_arm(store, config, "speculative", speculative)
        store_arm(store, config, "speculative", speculative, key="another-draft-model")
        at = start + timedelta(seconds=40 * STEP_S)
        evidence = read_telemetry(store, config, "speculative", at)
        assert evidence is not None
        assert evidence.baseline.intervals == baseline.intervals
        assert evidence.speculative.intervals == speculative.intervals
        cut = read_telemetry(
            store,
            config,
            "speculative",
            at,
            start=start + timedelta(seconds=10 * STEP_S),
            end=start + timedelta(seconds=30 * STEP_S),
        )
        assert cut is not None and len(cut.speculative.intervals) == 20
        assert telemetry_seconds(config.gates) == 6 * 3600.0

    def test_the_concurrent_stable_is_read_beside_the_arm(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """With `[telemetry.arms.speculative.stable]` the stable's intervals (stored as
        `speculative@stable` under the arm's key) are the evidence's `stable`; without
        the section they are not read."""
        config = with_stable(database_url, tmp_path)
        start = Soak(store).base
        _, speculative = simulate(start, 8)
        _, stable = simulate(start, 8, seed=8)
        store_arm(store, config, "speculative", speculative)
        store_stable(store, config, stable)
        at = start + timedelta(hours=1)
        evidence = read_telemetry(store, config, "speculative", at)
        assert evidence is not None and evidence.stable.intervals == stable.intervals
        plain = read_telemetry(store, settings(database_url, tmp_path), "speculative", at)
        assert plain is not None and plain.stable.intervals == ()

    def test_an_arm_without_a_source_has_no_intervals(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Only the speculative arm scraped: the baseline's evidence is empty."""
        config = Settings(
            storage={"url": database_url},
            telemetry={"arms": {"speculative": TELEMETRY["arms"]["speculative"]}},  # type: ignore[index]
        )
        start = Soak(store).base
        _, speculative = simulate(start, 4)
        store_arm(store, config, "speculative", speculative)
        evidence = read_telemetry(store, config, "speculative", start + timedelta(hours=1))
        assert evidence is not None and evidence.baseline.intervals == ()
        assert len(evidence.speculative.intervals) == 4


class TestAcceptanceReference:
    def test_pinned_from_the_earliest_intervals_unless_configured(self) -> None:
        """The reference is pinned from the first intervals of the evidence; a configured
        reference leaves the pin to the gate; no evidence, no reference."""
        baseline, speculative = simulate(datetime.fromisoformat("2026-01-05T09:00:00+00:00"), 60)
        evidence = TelemetryEvidence(baseline, speculative)
        config = GatesConfig()
        now = speculative.intervals[-1].end
        pinned = acceptance_reference(evidence, config, now)
        assert pinned is not None
        assert pinned.intervals >= config.telemetry.acceptance.pin_min_intervals
        configured = GatesConfig(telemetry={"acceptance": {"reference_acceptance_length": 3.0}})
        assert acceptance_reference(evidence, configured, now) is None
        assert acceptance_reference(None, config, now) is None


def with_stable(url: str, tmp_path: Path) -> Settings:
    """`settings` with the speculative arm's concurrent stable scraped."""
    sources = dict(TELEMETRY["arms"])  # type: ignore[call-overload]
    sources["speculative"] = {
        **sources["speculative"],
        "stable": {"metrics_url": "http://10.0.0.3:8000/metrics"},
    }
    return Settings(
        storage={"url": url},
        switch={"state_file": str(tmp_path / "state" / "switch.json")},
        telemetry={**TELEMETRY, "arms": sources},
    )


def store_stable(store: SqlStore, config: Settings, telemetry: ArmTelemetry) -> None:
    store.save_telemetry(
        [
            StoredInterval(
                arm="speculative@stable",
                arms=arm_key(config, "speculative"),
                interval=i,
                replicas=1,
            )
            for i in telemetry.intervals
        ]
    )


class TestGateJob:
    def test_the_gate_job_judges_telemetry_and_gates_shows_it(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """An hour of both arms' telemetry and the arm's concurrent stable: the stored
        evaluation holds the three telemetry decisions; `canaryd gates --json` shows them
        by name, with acceptance's estimate the window's 1 + accepted ÷ drafts; a healthy
        arm PASSes acceptance against its stable."""
        config = with_stable(database_url, tmp_path)
        start = Soak(store).base - timedelta(hours=1)
        baseline, speculative = simulate(start, 240)
        _, stable = simulate(start, 240, seed=9)
        store_arm(store, config, "baseline", baseline)
        store_arm(store, config, "speculative", speculative)
        store_stable(store, config, stable)
        now = start + timedelta(seconds=240 * STEP_S + 1)
        gates = SwitchGates(config, store=store)
        try:
            gates.evaluate(now)
        finally:
            gates.close()
        path = tmp_path / "canaryd.toml"
        path.write_text(
            f'[storage]\nurl = "{database_url}"\n'
            '[telemetry.arms.baseline]\nmetrics_url = "http://10.0.0.1:8000/metrics"\n'
        )
        result = CliRunner().invoke(app, ["gates", "--json", "--config", str(path)])
        assert result.exit_code == 0, result.output
        decisions = {d["name"]: d for d in json.loads(result.stdout)["gates"]}
        assert set(NAMES) <= set(decisions)
        acceptance = decisions["telemetry.acceptance"]
        assert acceptance["estimate"] == pytest.approx(pooled_length(speculative), rel=1e-9)
        assert acceptance["state"] == "PASS", acceptance["detail"]
        assert decisions["telemetry.latency"]["state"] != "NODATA"
        human = CliRunner().invoke(app, ["gates", "--config", str(path)])
        assert "telemetry.acceptance PASS" in human.output

    def test_without_telemetry_the_gate_job_is_unchanged(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """No `[telemetry]`: stored intervals are not read, no telemetry decision."""
        config = settings(database_url, tmp_path, telemetry=False)
        start = Soak(store).base
        _, speculative = simulate(start, 8)
        store_arm(store, config, "speculative", speculative)
        gates = SwitchGates(config, store=store)
        try:
            gates.evaluate(start + timedelta(minutes=3))
        finally:
            gates.close()
        evaluation = store.latest_evaluation()
        assert evaluation is not None
        assert not {d.name for d in evaluation.decisions} & set(NAMES)

    def test_without_a_stable_acceptance_against_the_past_is_set_aside(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """The same hour without the stable and without pairs: acceptance judged against
        the arm's own first intervals is set aside (warn, NODATA) and says why."""
        config = settings(database_url, tmp_path)
        start = Soak(store).base - timedelta(hours=1)
        baseline, speculative = simulate(start, 240)
        store_arm(store, config, "baseline", baseline)
        store_arm(store, config, "speculative", speculative)
        gates = SwitchGates(config, store=store)
        try:
            gates.evaluate(start + timedelta(seconds=240 * STEP_S + 1))
        finally:
            gates.close()
        evaluation = store.latest_evaluation()
        assert evaluation is not None
        acceptance = next(d for d in evaluation.decisions if d.name == "telemetry.acceptance")
        assert acceptance.state.value == "NODATA" and acceptance.mode.value == "warn"
        assert "set aside (PASS as read)" in acceptance.detail


class TestVerdict:
    def test_a_revision_is_judged_on_its_own_telemetry(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """The verdict of a revision judges the intervals since its window opened; a
        category's verdict has no telemetry (production telemetry has no categories)."""
        config = settings(database_url, tmp_path)
        soak = Soak(store)
        clock = Clock(soak.base)
        service = VerdictService(config, store=store, clock=clock)
        store.record_gate_run(soak.base - timedelta(seconds=1))
        service.judge(VerdictQuery("rev-a"), start=True)
        baseline, speculative = simulate(soak.base + timedelta(seconds=1), 40)
        store_arm(store, config, "baseline", baseline)
        store_arm(store, config, "speculative", speculative)
        clock.now = soak.pairs(10)
        clock.now = max(clock.now, speculative.intervals[-1].end + timedelta(seconds=1))
        store.record_gate_run(clock.now)
        verdict = service.judge(VerdictQuery("rev-a"))
        decisions = {d.name: d for d in verdict.gates}
        assert set(NAMES) <= set(decisions)
        assert decisions["telemetry.acceptance"].estimate == pytest.approx(
            pooled_length(speculative)
        )
        category = service.judge(VerdictQuery("rev-a", category=soak.prompts[0].category))
        assert not {d.name for d in category.gates} & set(NAMES)

    def test_a_revision_is_measured_against_the_revision_before_it(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """A revision that accepts less from its first request on: pinned from its own
        first intervals it would be measured against itself; the verdict pins the reference
        from the arm's telemetry before the revision's window opened and reads a FAIL. With
        no concurrent stable and no pairs to show the traffic mix comparable (drift
        NODATA), that reading is set aside (`gates.telemetry.mix`), not a rollback."""
        config = settings(database_url, tmp_path)
        soak = Soak(store)
        clock = Clock(soak.base)
        rng = np.random.default_rng(11)
        before = soak.base - timedelta(minutes=30)
        old = simulate_arm(rng, SPECULATIVE, intervals=100, seconds=STEP_S, start=before)
        store_arm(store, config, "speculative", old)
        store_arm(
            store,
            config,
            "baseline",
            simulate_arm(rng, BASELINE, intervals=100, seconds=STEP_S, start=before),
        )
        store.record_gate_run(soak.base - timedelta(seconds=1))
        service = VerdictService(config, store=store, clock=clock)
        service.judge(VerdictQuery("rev-b"), start=True)
        worse = ArmTraffic(rps=5.0, draft_tokens=5, acceptance=0.35)
        start = soak.base + timedelta(seconds=1)
        new = simulate_arm(rng, worse, intervals=60, seconds=STEP_S, start=start)
        store_arm(store, config, "speculative", new)
        store_arm(
            store,
            config,
            "baseline",
            simulate_arm(rng, BASELINE, intervals=60, seconds=STEP_S, start=start),
        )
        clock.now = new.intervals[-1].end + timedelta(seconds=1)
        store.record_gate_run(clock.now)
        acceptance = {d.name: d for d in service.judge(VerdictQuery("rev-b")).gates}[
            "telemetry.acceptance"
        ]
        assert acceptance.estimate == pytest.approx(pooled_length(new))
        assert acceptance.state.value == "NODATA" and not acceptance.enforced
        assert "set aside (FAIL as read)" in acceptance.detail, acceptance.detail
        assert "(drift) is NODATA" in acceptance.detail
        own = acceptance_reference(
            TelemetryEvidence(ArmTelemetry(), new), config.gates, clock.now, since=start
        )
        assert own is not None and own.acceptance_length < 0.9 * pooled_length(old)
