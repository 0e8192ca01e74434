"""`POST /v1/verdict` polled as the shipped Argo template's web metric polls it, while a new
revision that breaks the speculative arm rolls out behind the same URL: the daemon in-process over
two loopback OpenAI-compatible servers, a real SQLite file and real HTTP, driven cycle by
cycle so that nothing depends on timing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from canaryd.config import load_settings
from canaryd.daemon import Daemon
from canaryd.judging.gatejob import SwitchGates
from tests.canaryd.daemon.test_daemon import _clean_env  # noqa: F401  (autouse isolation)
from tests.support.servers import Behaviour, MisbehavingServer

DEAD = Behaviour(fault="status", status=500)  # every answer of the new revision's arm


def argo_measure(response: httpx.Response) -> str:
    """The measurement phase Argo's web provider records for one poll, with the shipped
    AnalysisTemplate's conditions (docs/examples/argo/analysis-template.yaml):
    a non-2xx answer is an Error; then `result.verdict == "FAIL"` fails,
    `result.verdict == "PASS" && result.fresh` succeeds, anything else is Inconclusive."""
    if not 200 <= response.status_code < 300:
        return "Error"
    result = response.json()
    if result["verdict"] == "FAIL":
        return "Failed"
    if result["verdict"] == "PASS" and result["fresh"]:
        return "Successful"
    return "Inconclusive"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Daemon, MisbehavingServer]]:
    """A daemon (no scheduler: the test runs cycles and gate runs) on two loopback servers;
    yields it and the speculative arm's server."""
    with MisbehavingServer() as baseline, MisbehavingServer() as speculative:
        path = tmp_path / "canaryd.toml"
        path.write_text(
            f"""
[arms.baseline]
kind = "openai"
base_url = "{baseline.url}"
max_retries = 0
[arms.speculative]
kind = "openai"
base_url = "{speculative.url}"
speculative = true
max_retries = 0
[prompts]
max_tokens = 8
[storage]
url = "sqlite:///{tmp_path / "canaryd.db"}"
[switch]
state_file = "{tmp_path / "switch.json"}"
[server]
listen = "127.0.0.1:0"
[rollout]
concurrency = 1  # a burst cycle runs one pair, so the test counts pairs cycle by cycle
"""
        )
        settings = load_settings(path)
        gates = SwitchGates(settings)
        running = Daemon(settings, config_path=path, gates=gates)
        running.start(schedule=False)
        try:
            yield running, speculative
        finally:
            running.stop()
            gates.close()


def poll(daemon: Daemon, revision: str) -> httpx.Response:
    """One measurement as the shipped Argo template takes it: a POST, which opens the
    revision's window on the first measurement and only reads afterwards."""
    return httpx.post(
        f"http://{daemon.address}/v1/verdict", params={"revision": revision}, timeout=10
    )


class TestArgoPollsANewRevision:
    def test_nodata_then_fail_and_the_old_revisions_pairs_never_count(
        self, daemon: tuple[Daemon, MisbehavingServer]
    ) -> None:
        """Revision A serves well for 12 pairs. Revision B, whose speculative arm answers
        500 to everything, rolls out behind the same URL and Argo starts polling it: NODATA
        (fresh: false) until a gate run has judged B's own pairs, never a success, then FAIL
        within 12 pairs; B's verdicts count only its own pairs, and A's window ended where
        B's began."""
        running, speculative = daemon
        # No gate run has completed yet: 503, but the write has opened A's window.
        assert poll(running, "rev-a").status_code == 503
        running.evaluate_gates()
        first = poll(running, "rev-a").json()
        assert (first["verdict"], first["fresh"], first["pairs"]) == ("NODATA", True, 0)
        for _ in range(12):
            running.run_cycle()
        running.evaluate_gates()
        before = poll(running, "rev-a").json()
        assert before["pairs"] == 12 and before["fresh"] is True

        speculative.default = DEAD  # the canary's pods now serve revision B
        phases: list[str] = []
        bodies: list[dict[str, Any]] = []
        answer = poll(running, "rev-b")  # Argo's first measurement starts B's window
        for cycle in range(1, 13):
            assert answer.status_code == 200, answer.text
            phases.append(argo_measure(answer))
            bodies.append(answer.json())
            if phases[-1] == "Failed":
                break
            running.run_cycle()
            running.evaluate_gates()
            answer = poll(running, "rev-b")
            assert answer.json()["pairs"] == cycle  # B's pairs only, never A's 12
        assert phases[-1] == "Failed", bodies[-1]
        assert bodies[0]["verdict"] == "NODATA" and bodies[0]["fresh"] is False
        assert bodies[0]["pairs"] == 0
        assert set(phases[:-1]) == {"Inconclusive"}
        failed = bodies[-1]
        assert failed["revision"] == "rev-b" and failed["fresh"] is True
        assert 1 <= failed["pairs"] <= 12
        assert "FAILed" in failed["reason"] and "rev-b" in failed["reason"]
        assert set(failed["arms"]) == {"baseline", "speculative"}
        assert failed["arms"]["speculative"]["base_url"] == speculative.url
        for gate in failed["gates"]:
            assert gate["n_speculative"] <= failed["pairs"]
        assert any(g["state"] == "FAIL" and g["mode"] == "enforce" for g in failed["gates"])
        # The daemon's own gates judged the same pairs and rolled speculation back.
        assert failed["speculative_enabled"] is False and failed["generation"] == 1

        after = poll(running, "rev-a").json()  # A's window ended where B's began
        assert after["pairs"] == 12 and after["fresh"] is False
        assert "superseded" in after["reason"]
