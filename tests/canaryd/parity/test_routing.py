"""canaryd.parity.routing: the capabilities a request shows have the fields a router
matches, and a probe's regressions become the state file's `route_to_baseline`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from canaryd.parity.checks import CAPABILITIES
from canaryd.parity.routing import REQUEST_FIELDS, route_object
from gates.parity import CapabilityParity, ProbeEvidence


class TestRequestFields:
    def test_every_routable_capability_is_probed(self) -> None:
        """Request fields are given for capabilities of the checklist only, the ones a
        request shows; the others (long context, a burst, ...) have none."""
        assert set(REQUEST_FIELDS) < set(CAPABILITIES)
        assert {"long_context", "burst_16", "cancel_mid_stream"}.isdisjoint(REQUEST_FIELDS)
        fields: dict[str, Any] = REQUEST_FIELDS
        assert fields["seed_reproducible"] == {"seed": "set"}
        assert fields["n_gt_1"] == {"n": "gt_1"}


class TestRouteObject:
    def test_regressions_split_into_routable_and_not(self) -> None:
        """A routable regression carries its fields and the speculative arm's reason, one
        no request field shows is listed as not routable, and what passes is absent."""
        finished = datetime(2024, 5, 1, 12, 0, 30, 250000, tzinfo=UTC)
        probe = ProbeEvidence(
            run_id="probe-1",
            arm="spec",
            started_at=datetime(2024, 5, 1, 12, tzinfo=UTC),
            finished_at=finished,
            capabilities=(
                CapabilityParity("seed_reproducible", "pass", "fail", "seeds differ"),
                CapabilityParity("long_context", "pass", "unsupported", "413"),
                CapabilityParity("stop", "pass", "pass"),
                CapabilityParity("n_gt_1", "fail", "fail", "the baseline lacks it too"),
            ),
        )
        assert route_object(probe) == {
            "arm": "spec",
            "probe_run_id": "probe-1",
            "probed_at": "2024-05-01T12:00:30+00:00",
            "capabilities": {
                "seed_reproducible": {"fields": {"seed": "set"}, "reason": "seeds differ"}
            },
            "not_routable": ["long_context"],
        }
