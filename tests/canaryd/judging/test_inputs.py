"""Enforce gates whose input the configured servers cannot provide
(`canaryd.judging.inputs`): named from the configuration alone, with what to configure, and
logged once when the daemon starts."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from canaryd.config import Settings
from canaryd.judging.inputs import log_unprovided, unprovided

BASE = "http://127.0.0.1:8001"
SPEC = "http://127.0.0.1:8002"


def configured(speculative: dict[str, Any], **sections: Any) -> Settings:
    return Settings(
        arms={
            "baseline": {"kind": "openai", "base_url": BASE, "server_kind": "vllm"},
            "speculative": {"kind": "openai", "base_url": SPEC, **speculative},
        },
        **sections,
    )


def telemetry(*arms: str, kind: str = "vllm") -> dict[str, Any]:
    sources: dict[str, Any] = {
        arm: {"kind": kind, "metrics_url": f"http://{arm}:8000/metrics"} for arm in arms
    }
    if kind == "gateway":
        sources = {arm: {**source, "gateway": "istio"} for arm, source in sources.items()}
    return {"arms": sources}


class TestUnprovided:
    @pytest.mark.parametrize(
        ("speculative", "says"),
        [
            ({"speculative": True}, 'server_kind = "generic": no acceptance'),
            ({"speculative": False, "server_kind": "vllm"}, "speculative = false"),
            ({"speculative": True, "server_kind": "tgi"}, "TGI without metrics_url"),
        ],
    )
    def test_drift_without_acceptance_is_named_with_the_fix(
        self, speculative: dict[str, Any], says: str
    ) -> None:
        """An arm that reports no acceptance: drift, certain, naming the arm and the keys
        to set (or warn mode)."""
        (found,) = unprovided(configured(speculative))
        assert (found.gate, found.certain) == ("drift", True)
        assert says in found.reason and "'speculative'" in found.reason
        assert "[arms.speculative] speculative = true" in found.fix
        assert 'gates.drift.mode = "warn"' in found.fix

    def test_vllm_without_metrics_url_may_not_report_it(self) -> None:
        """vLLM without metrics_url reports acceptance only when run with per-request
        metrics: said, not certain, naming the flag."""
        (found,) = unprovided(configured({"speculative": True, "server_kind": "vllm"}))
        assert (found.gate, found.certain) == ("drift", False)
        assert "--per-request-spec-decode-metrics" in found.fix

    @pytest.mark.parametrize(
        ("speculative", "sections"),
        [
            ({"speculative": True, "server_kind": "vllm", "metrics_url": f"{SPEC}/metrics"}, {}),
            ({"speculative": True, "server_kind": "llamacpp"}, {}),
            ({"speculative": True}, {"gates": {"drift": {"mode": "warn"}}}),
            ({"speculative": True}, {"telemetry": telemetry("baseline", "speculative")}),
        ],
    )
    def test_nothing_when_the_input_comes_or_nothing_waits_for_it(
        self, speculative: dict[str, Any], sections: dict[str, Any]
    ) -> None:
        """Acceptance from metrics_url or llama.cpp, drift in warn mode, or drift covered by
        an enforced telemetry.acceptance: nothing to say."""
        assert unprovided(configured(speculative, **sections)) == []

    def test_telemetry_gates_need_both_arms(self) -> None:
        """[telemetry] with only the speculative arm: each enforced telemetry gate lacks
        the baseline."""
        found = unprovided(configured({"speculative": True}, telemetry=telemetry("speculative")))
        assert [u.gate for u in found] == [
            "telemetry.errors",
            "telemetry.latency",
            "telemetry.acceptance",
        ]
        assert all("no source for baseline" in u.reason for u in found)
        assert found[0].fix.startswith("add [telemetry.arms.baseline]")

    def test_a_gateway_counts_no_drafts(self) -> None:
        """The speculative arm's telemetry from a gateway: telemetry.acceptance cannot
        decide (and drift, left to it, is not named)."""
        found = unprovided(
            configured(
                {"speculative": True},
                telemetry=telemetry("baseline", "speculative", kind="gateway"),
            )
        )
        assert [u.gate for u in found] == ["telemetry.acceptance"]
        assert "counts no drafts" in found[0].reason


class TestLogged:
    def test_each_is_logged_once_naming_the_gate_and_what_to_configure(self) -> None:
        """One `gates.input_unavailable` warning per gate, with the fix."""
        with capture_logs() as logs:
            log_unprovided(configured({"speculative": True}))
        (entry,) = [e for e in logs if e["event"] == "gates.input_unavailable"]
        assert (entry["log_level"], entry["gate"], entry["arm"]) == (
            "warning",
            "drift",
            "speculative",
        )
        assert "server_kind" in entry["configure"] and "holds every PASS" in entry["effect"]
