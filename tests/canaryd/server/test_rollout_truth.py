"""A verdict a rollout can trust, over real HTTP on loopback: a FAIL that stays after the
next gate run (the daemon's gate job on the same SQLite file), the kill switch that every
rollout answer hears (`canaryd switch rollback` through the CLI runner), and traffic that
grows on evidence from error, latency and quality, never on liveness alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.config import Settings
from canaryd.judging.gatejob import SwitchGates
from gates import GateMode
from tests.canaryd.judging.test_gatejob import settings
from tests.canaryd.server.test_rollout import World
from tests.canaryd.server.test_rollout import world as world  # the fixture

HOOKS = ("rollout", "confirm-traffic-increase", "confirm-promotion", "rollback")
FAILED = {
    "rollout": 412,
    "confirm-traffic-increase": 412,
    "confirm-promotion": 412,
    "rollback": 200,
}


def hooks(world: World, revision: str) -> dict[str, int]:
    return {hook: world.flagger(hook, revision).status_code for hook in HOOKS}


class TestAFailStands:
    def test_a_fail_read_by_get_after_the_next_gate_run_is_still_fail(
        self, world: World, tmp_path: Path
    ) -> None:
        """The gate job FAILs a dead revision and rolls speculation back; at its next run,
        on healthy pairs, the revision's own judgement PASSes, but GET, the compact view,
        Kayenta's shape and every Flagger hook still say FAIL, with the first failure's
        time and reason."""
        gates = SwitchGates(world.settings, store=world.store)
        world.flagger("pre-rollout", "rev")
        world.clock.now = world.soak.pairs(10, error_rate=1.0)
        gates.evaluate(world.clock.now)
        failed_at = world.clock.now
        first = world.verdict(revision="rev").json()
        assert first["verdict"] == "FAIL" and first["failed_at"] == failed_at.isoformat()

        world.clock.now = world.soak.pairs(10)
        gates.evaluate(world.clock.now)
        body = world.verdict(revision="rev").json()
        assert (body["verdict"], body["fresh"]) == ("FAIL", True)
        assert body["failed_at"] == failed_at.isoformat()
        assert body["reason"].startswith("FAIL latched at")
        assert "speculation was rolled back" in body["reason"]
        assert "judged now: every enforce gate PASSed" in body["reason"]
        assert body["speculative_enabled"] is False
        compact = world.verdict(revision="rev", view="compact").json()
        assert (compact["verdict"], compact["failed_at"]) == ("FAIL", failed_at.isoformat())
        assert compact["speculative_enabled"] is False
        kayenta = world.verdict(revision="rev", format="kayenta").json()
        assert kayenta["score"]["classification"] == "Fail"
        assert kayenta["score"]["score"] == 0.0
        assert hooks(world, "rev") == FAILED
        assert world.verdict(revision="rev").json()["verdict"] == "FAIL"


class TestTheKillSwitch:
    def test_flagger_rolls_back_after_canaryd_switch_rollback(
        self, world: World, tmp_path: Path
    ) -> None:
        """A healthy revision PASSes (rollback hook 412); `canaryd switch rollback` (the CLI,
        on the same database); then Flagger's rollback hook answers 200 with the switch's
        reason, and Argo's compact body says FAIL with speculation off."""
        world.flagger("pre-rollout", "rev")
        world.pairs(10)
        assert world.flagger("confirm-promotion", "rev").status_code == 200
        assert world.flagger("rollback", "rev").status_code == 412
        env = {
            "CANARYD_SWITCH__STATE_FILE": str(tmp_path / "state" / "switch.json"),
            "CANARYD_CONFIG": "",
        }
        pulled = CliRunner().invoke(
            app, ["switch", "rollback", "--reason", "pager", "--url", world.url], env=env
        )
        assert pulled.exit_code == 0, pulled.output
        # The command configured structlog onto the runner's stderr, closed now; the
        # server's threads log on (a real `canaryd switch` is a process of its own).
        structlog.reset_defaults()
        rollback = world.flagger("rollback", "rev")
        assert rollback.status_code == 200
        assert "speculation was rolled back" in rollback.json()["reason"]
        assert ": pager (it stands until" in rollback.json()["reason"]
        assert rollback.json()["speculative_enabled"] is False
        compact = world.verdict(revision="rev", view="compact").json()
        assert (compact["verdict"], compact["speculative_enabled"]) == ("FAIL", False)
        assert hooks(world, "rev") == FAILED


def evidence_settings(url: str, tmp_path: Path) -> Settings:
    """Liveness enforces; error, latency and quality warn with small minimums (10, 20, 10
    pairs), so that a short test gives them evidence and their WARNs hold nothing."""
    configured = settings(url, tmp_path)
    small = {"error": 10, "latency": 20, "quality": 10}
    gates = configured.gates.model_copy(
        update={
            name: getattr(configured.gates, name).model_copy(
                update={"mode": GateMode.WARN, "min_samples": n}
            )
            for name, n in small.items()
        }
    )
    return configured.model_copy(update={"gates": gates})


@pytest.fixture
def evidence_world(tmp_path: Path) -> Iterator[World]:
    made = World(
        tmp_path, configured=evidence_settings(f"sqlite:///{tmp_path / 'canaryd.db'}", tmp_path)
    )
    yield made
    made.close()


class TestTrafficGrowsOnEvidence:
    def test_412_on_liveness_alone_200_once_error_latency_and_quality_have_evidence(
        self, evidence_world: World
    ) -> None:
        """After 5 pairs liveness PASSes (the verdict is PASS) but error, latency and quality
        are NODATA: 412. After 20 they have evidence: 200. At once again, with nothing new
        since that increase: 412 naming the pairs each still needs (a tenth of its
        min_samples); 2 pairs later: 200 again."""
        world = evidence_world
        world.flagger("pre-rollout", "rev")
        world.pairs(5)
        alive = world.flagger("confirm-traffic-increase", "rev")
        assert (alive.status_code, alive.json()["verdict"]) == (412, "PASS")
        assert "error NODATA; latency NODATA; quality NODATA" in alive.json()["hold"]
        world.pairs(15)
        grown = world.flagger("confirm-traffic-increase", "rev")
        assert grown.status_code == 200, grown.json()
        assert grown.json()["hold"] is None
        again = world.flagger("confirm-traffic-increase", "rev")
        assert again.status_code == 412
        assert again.json()["hold"].endswith(
            "for error: 0 of 1 pairs; latency: 0 of 2 pairs; quality: 0 of 1 pairs"
        )
        world.pairs(2)
        assert world.flagger("confirm-traffic-increase", "rev").status_code == 200
        window = world.store.revision_window("speculative", "rev")
        assert window is not None and window.increased_at == world.clock.now

    def test_the_last_increase_outlives_a_restart(self, evidence_world: World) -> None:
        """The mark is stored with the revision: a new service over the same database
        still holds the weight until new pairs arrive."""
        from canaryd.judging.verdict import VerdictQuery, VerdictService

        world = evidence_world
        world.flagger("pre-rollout", "rev")
        world.pairs(20)
        assert world.flagger("confirm-traffic-increase", "rev").status_code == 200
        restarted = VerdictService(world.settings, store=world.store, clock=world.clock)
        _, hold = restarted.increase(VerdictQuery("rev"))
        assert hold is not None and "0 of 2 pairs" in hold
