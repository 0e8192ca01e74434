"""The parity gate in the daemon's gate job: the latest stored probe of the current arms is
judged beside the pair gates, an enforced regression rolls the switch back (probed for
real on loopback capability servers), and the probe's routable regressions are the state
file's `route_to_baseline`, kept by writers that know no probe."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.config import Settings
from canaryd.daemon.parity import ParityJob
from canaryd.judging.gatejob import SwitchGates
from canaryd.metrics import CanarydMetrics
from canaryd.pairs.plan import build_arms
from canaryd.parity import checks
from canaryd.parity.checks import CAPABILITIES, Outcome
from canaryd.parity.report import CapabilityResult, ProbeReport
from canaryd.store import SqlStore
from canaryd.switch import read_state_file, shows
from gates import GateState, SwitchMode
from gates.records import RunInfo
from tests.support.capability_server import CapabilityServer

REPO = Path(__file__).resolve().parents[3]
ROUTER = REPO / "docs" / "examples" / "router" / "route.py"


def settings(url: str, tmp_path: Path, *, mode: str = "warn", model: str = "m") -> Settings:
    """Two OpenAI arms (nobody need listen: probes are stored by hand unless a test
    probes), the parity gate in `mode`."""
    return Settings(
        arms={
            "baseline": {"kind": "openai", "base_url": "http://127.0.0.1:9", "model": model},
            "speculative": {
                "kind": "openai",
                "base_url": "http://127.0.0.1:10",
                "model": model,
                "speculative": True,
            },
        },
        storage={"url": url},
        switch={"state_file": str(tmp_path / "state" / "switch.json")},
        gates={"parity": {"mode": mode}, "policy": {"cooldown_seconds": 0}},
    )


def store_probe(
    store: SqlStore, config: Settings, finished: datetime, failing: tuple[str, ...] = ()
) -> str:
    """A finished probe run of `config`'s arms in which the speculative arm fails
    `failing` and the baseline passes everything."""
    report = ProbeReport(
        arm="speculative",
        capabilities=tuple(
            CapabilityResult(
                name,
                Outcome("pass", "ok"),
                Outcome("fail", f"{name} broke") if name in failing else Outcome("pass", "ok"),
            )
            for name in CAPABILITIES
        ),
        context_limit=2048,
        elapsed_s=30.0,
    )
    run_id = f"probe-{finished.timestamp():.0f}"
    started = finished - timedelta(minutes=1)
    config_snapshot = config.snapshot() | {"probe": report.to_dict()}
    store.create_run(RunInfo(run_id, "probe", started, config_snapshot, "h", {}, {}))
    store.finish_run(run_id, finished)
    return run_id


def parity(store: SqlStore) -> tuple[str, str]:
    evaluation = store.latest_evaluation()
    assert evaluation is not None
    (decision,) = [d for d in evaluation.decisions if d.name == "parity"]
    return decision.state.value, decision.detail


@pytest.fixture
def now() -> datetime:
    """The real clock at the test's start: the CLI stamps its transitions with it."""
    return datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened:
        yield opened


class TestParityGate:
    def test_warn_regression_names_routes_and_leaves_the_switch_on(
        self, store: SqlStore, database_url: str, tmp_path: Path, now: datetime
    ) -> None:
        """A regression in warn mode: parity FAILs in the stored evaluation, the switch
        stays on, and the state file routes seeded and n > 1 requests to the baseline
        (the burst has no request field: not routable) while still showing the state."""
        config = settings(database_url, tmp_path)
        failing = ("seed_reproducible", "n_gt_1", "burst_16")
        run_id = store_probe(store, config, now - timedelta(minutes=5), failing)
        SwitchGates(config, store=store).evaluate(now)
        state, detail = parity(store)
        assert state == "FAIL" and "seed_reproducible: fail (seed_reproducible broke)" in detail
        assert store.switch().state.mode is SwitchMode.AUTO
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and on_disk["speculative_enabled"] is True
        assert on_disk["route_to_baseline"] == {
            "arm": "speculative",
            "probe_run_id": run_id,
            "probed_at": (now - timedelta(minutes=5)).isoformat(timespec="seconds"),
            "capabilities": {
                "n_gt_1": {"fields": {"n": "gt_1"}, "reason": "n_gt_1 broke"},
                "seed_reproducible": {
                    "fields": {"seed": "set"},
                    "reason": "seed_reproducible broke",
                },
            },
            "not_routable": ["burst_16"],
        }
        assert shows(on_disk, store.switch().state)

    def test_a_probe_of_other_arms_is_no_evidence(
        self, store: SqlStore, database_url: str, tmp_path: Path, now: datetime
    ) -> None:
        """A probe stored under another arms configuration (another model) is not read:
        NODATA, and the state file routes nothing."""
        store_probe(
            store, settings(database_url, tmp_path, model="old"), now, ("seed_reproducible",)
        )
        SwitchGates(settings(database_url, tmp_path), store=store).evaluate(now)
        assert parity(store)[0] == GateState.NODATA.value
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and "route_to_baseline" not in on_disk

    def test_a_cli_transition_keeps_the_routes(
        self, store: SqlStore, database_url: str, tmp_path: Path, now: datetime
    ) -> None:
        """`canaryd switch rollback` knows no probe: the file it writes keeps the routes
        the gate job wrote, and the next gate run drops them once a probe passes."""
        config = settings(database_url, tmp_path)
        store_probe(store, config, now - timedelta(minutes=5), ("seed_reproducible",))
        hook = SwitchGates(config, store=store)
        hook.evaluate(now)
        env = {"CANARYD_SWITCH__STATE_FILE": str(tmp_path / "state" / "switch.json")}
        result = CliRunner().invoke(
            app, ["switch", "rollback", "--reason", "drill", "--url", database_url], env=env
        )
        assert result.exit_code == 0, result.output
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and on_disk["speculative_enabled"] is False
        assert list(on_disk["route_to_baseline"]["capabilities"]) == ["seed_reproducible"]
        store_probe(store, config, now + timedelta(seconds=30))
        hook.evaluate(now + timedelta(minutes=1))
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert on_disk is not None and on_disk["route_to_baseline"]["capabilities"] == {}

    def test_a_follower_writes_the_routes_of_a_new_probe(
        self, store: SqlStore, database_url: str, tmp_path: Path, now: datetime
    ) -> None:
        """A daemon that does not lead rewrites its own state file as soon as it reads a
        new probe, without waiting for the leader's next gate run."""
        leader = SwitchGates(settings(database_url, tmp_path), store=store)
        leader.evaluate(now)
        follower_config = settings(database_url, tmp_path / "follower")
        follower = SwitchGates(follower_config, store=store)
        follower.evaluate(now)
        assert follower.role() == "follower"
        path = tmp_path / "follower" / "state" / "switch.json"
        on_disk = read_state_file(path)
        assert on_disk is not None and "route_to_baseline" not in on_disk
        store_probe(store, follower_config, now, ("n_gt_1",))
        follower.evaluate(now + timedelta(seconds=1))
        on_disk = read_state_file(path)
        assert on_disk is not None and list(on_disk["route_to_baseline"]["capabilities"]) == [
            "n_gt_1"
        ]
        follower.close()
        leader.close()

    def test_stale_probe_is_nodata(
        self, store: SqlStore, database_url: str, tmp_path: Path, now: datetime
    ) -> None:
        """A regression older than two probe intervals and ten minutes is NODATA, even
        enforced: the switch stays on (the routes still name it: the safe side)."""
        config = settings(database_url, tmp_path, mode="enforce")
        store_probe(store, config, now - timedelta(hours=3), ("seed_reproducible",))
        SwitchGates(config, store=store).evaluate(now)
        state, detail = parity(store)
        assert state == "NODATA" and "max_probe_age_seconds" in detail
        assert store.switch().state.mode is SwitchMode.AUTO
        on_disk = read_state_file(tmp_path / "state" / "switch.json")
        assert (
            on_disk is not None
            and "seed_reproducible" in on_disk["route_to_baseline"]["capabilities"]
        )


class TestEnforcedParity:
    def test_a_probed_regression_rolls_the_switch_back(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The daemon's probe job on loopback servers whose speculative one ignores seeds,
        then a gate run: enforced, parity rolls the switch back with the capability in
        the reason and the evidence; after a forced restore the same probe does not trip
        it again (NODATA until the next probe)."""
        monkeypatch.setattr(checks, "GAUGE_SETTLE_S", 1.0)
        url = f"sqlite:///{tmp_path / 'canaryd.db'}"
        with (
            CapabilityServer() as baseline,
            CapabilityServer(broken=["seed_reproducible"]) as candidate,
            SqlStore.open(url, create=True) as store,
        ):
            config = settings(url, tmp_path, mode="enforce")
            arms = config.arms.model_dump()
            arms["baseline"]["base_url"], arms["speculative"]["base_url"] = (
                baseline.url,
                candidate.url,
            )
            for arm in arms.values():
                arm["server_kind"] = "vllm"
            config = config.model_copy(update={"arms": type(config.arms).model_validate(arms)})
            engines = {name: build_arms(config)[name] for name in ("baseline", "speculative")}
            for engine in engines.values():
                engine.load()
            metrics = CanarydMetrics()
            job = ParityJob(metrics.probe, pair_metrics=metrics.pairs, store_metrics=metrics.store)
            try:
                report = job.run(config, engines, store)
            finally:
                for engine in engines.values():
                    engine.close()
            assert report is not None and report.regressions == ["seed_reproducible"]
            hook = SwitchGates(config, store=store)
            now = datetime.now(UTC)
            hook.evaluate(now)
            switch = store.switch().state
            assert switch.mode is SwitchMode.ROLLED_BACK and switch.actor == "gate:parity"
            assert "seed_reproducible" in switch.reason
            (entry,) = store.audit()
            assert entry.evidence[0]["name"] == "parity" and entry.evidence[0]["state"] == "FAIL"
            restored = CliRunner().invoke(
                app,
                ["switch", "restore", "--force", "--reason", "known", "--url", url],
                env={"CANARYD_SWITCH__STATE_FILE": str(tmp_path / "state" / "switch.json")},
            )
            assert restored.exit_code == 0, restored.output
            hook.evaluate(datetime.now(UTC) + timedelta(minutes=1))
            assert parity(store)[0] == "NODATA"
            assert store.switch().state.mode is SwitchMode.AUTO


def router() -> ModuleType:
    """docs/examples/router/route.py, loaded as a router would run it."""
    spec = importlib.util.spec_from_file_location("route_example", ROUTER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestRouterExample:
    def test_the_documented_router_routes_what_the_daemon_names(
        self, tmp_path: Path, now: datetime
    ) -> None:
        """The router of docs/switch.md, on the file the daemon wrote: seeded (a seed of
        0 too) and n > 1 requests go to the baseline, n = 1 and plain ones speculate; a
        file without `route_to_baseline` routes nothing; the doc shows the tested code."""
        url = f"sqlite:///{tmp_path / 'canaryd.db'}"
        config = settings(url, tmp_path)
        with SqlStore.open(url, create=True) as store:
            hook = SwitchGates(config, store=store)
            hook.evaluate(now)
            before = read_state_file(tmp_path / "state" / "switch.json")
            store_probe(store, config, now, ("seed_reproducible", "n_gt_1"))
            hook.evaluate(now + timedelta(seconds=1))
            hook.close()
        state = read_state_file(tmp_path / "state" / "switch.json")
        assert before is not None and state is not None
        route = router()
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for request, expected in (
            (chat, True),
            ({**chat, "seed": 7}, False),
            ({**chat, "seed": 0}, False),
            ({**chat, "seed": None}, True),
            ({**chat, "n": 2}, False),
            ({**chat, "n": 1}, True),
        ):
            assert route.use_speculative(state, None, request) is expected, request
            assert route.use_speculative(before, None, request) is True, request
        code = ROUTER.read_text(encoding="utf-8")
        assert code[code.index("RULES: dict") :] in (REPO / "docs" / "switch.md").read_text(
            encoding="utf-8"
        )
