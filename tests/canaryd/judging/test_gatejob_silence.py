"""The gate job logs a telemetry gate whose evidence stopped once, not at every run
(canaryd.judging.gatejob: the decision is NODATA, `gates.telemetry.silence`), and once
more when it flows again."""

from __future__ import annotations

from datetime import UTC, datetime

from structlog.testing import capture_logs

from canaryd.config import Settings
from canaryd.judging.gatejob import SwitchGates
from gates.core import GateDecision, GateMode, GateState
from gates.telemetry.silence import SILENCE

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def decision(state: GateState, detail: str, name: str = "telemetry.errors") -> GateDecision:
    return GateDecision(name, state, GateMode.ENFORCE, False, NOW, detail=detail)


class TestSilenceLog:
    def test_stopped_evidence_is_logged_once_and_its_return_once(self) -> None:
        """Three runs with the speculative arm dark log one warning naming the gate and
        the reason; the run after it is back logs one line; a pair gate's NODATA is not
        the telemetry's to log."""
        gates = SwitchGates(Settings())
        dark = f"{SILENCE}: no interval from the speculative arm (no successful scrape)"
        with capture_logs() as logs:
            for _ in range(3):
                gates._note_silence(
                    "speculative",
                    [decision(GateState.NODATA, dark), decision(GateState.NODATA, "x", "error")],
                )
            gates._note_silence("speculative", [decision(GateState.PASS, "flowing")])
            gates._note_silence("speculative", [decision(GateState.PASS, "flowing")])
        events = [(e["event"], e.get("gate")) for e in logs]
        assert events == [
            ("telemetry.evidence_stopped", "telemetry.errors"),
            ("telemetry.evidence_resumed", "telemetry.errors"),
        ]
        assert logs[0]["reason"] == dark and logs[0]["arm"] == "speculative"
